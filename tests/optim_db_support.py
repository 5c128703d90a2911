"""PyTorch's optimizer database on the ``neuron`` device (shared by tests and scripts).

Every OptimizerInfo of ``torch.testing._internal.common_optimizers.optim_db`` is checked
against the CPU in each implementation it supports: ``forloop`` (``foreach=False``),
``foreach``, ``fused`` (where PyTorch has a fused CPU kernel to compare with) and
``differentiable``. A case is one optimizer in one implementation (``Adam.fused``); its
samples are the optimizer's configs (``optim_inputs_func``: default, weight decay,
amsgrad, maximize, Tensor lr, ...).

For each config a small model (Linear-Sigmoid-Linear, plus a zero-size parameter and,
where the optimizer supports complex numbers, a complex one; Muon gets its 2-D weights
only) is built on the CPU and copied to neuron, in two parameter groups where the
optimizer supports groups. Both take ``STEPS`` steps of the same loss (through a
closure where the optimizer needs one; a differentiable optimizer takes one step, and
the gradient of its result with respect to the original parameters is compared too). After every step the parameters are compared,
and at the end the optimizer's whole state (``state_dict()``: moments, step counts,
LBFGS's history) and its round trip through ``load_state_dict`` into a fresh neuron
optimizer. If the CPU raises for a config, neuron must raise too. Values are compared
with ``torch.testing.assert_close``'s float32 tolerances (``parity.compare``).

Each case runs in a given execution mode (``adaptive``, the default, or ``blocking``) in
a crash-isolating worker. Environment variables: ``NEURON_OPTIM_SAMPLES`` (configs per
case; default 3, ``all`` for every config), ``NEURON_TEST_TIMEOUT``,
``NEURON_TEST_INPROCESS``. Run one case by hand:
``python tests/optim_db_support.py --case Adam.fused --mode blocking``.
"""

from __future__ import annotations

import copy
import os
import sys
import time
from typing import Any, Optional

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)

from isolated import CaseResult, main, make_runner as _make_runner, run_guarded  # noqa: E402
from isolated import samples_from_env as _samples_from_env  # noqa: E402
from parity import DEVICE, Mismatch, compare, describe, move, run_pair  # noqa: E402

DEFAULT_SAMPLES = 3
MODES = ("adaptive", "blocking")
STEPS = 5
IMPLS = ("forloop", "foreach", "fused", "differentiable")

# Cases that are not applicable to the neuron device, by case id, with the reason.
EXCLUSIONS: dict[str, str] = {
    "SparseAdam.forloop": "takes only sparse gradients; the neuron device holds only strided (dense) "
    "tensors by design",
}

_CASES: Optional[dict[str, tuple[Any, str]]] = None


def _impls(info: Any) -> list[str]:
    impls = ["forloop"]
    for impl in info.supported_impls:
        if impl == "fused" and "cpu" not in info.supports_fused_on:
            continue  # no fused CPU kernel to compare with
        impls.append(impl)
    return impls


def all_cases() -> dict[str, tuple[Any, str]]:
    """Every (OptimizerInfo, implementation), by case id ``Name.impl`` (db order)."""
    global _CASES
    if _CASES is None:
        from torch.testing._internal.common_optimizers import optim_db

        _CASES = {f"{info.name}.{impl}": (info, impl) for info in optim_db for impl in _impls(info)}
    return _CASES


def all_case_ids() -> list[str]:
    return list(all_cases())


def samples_from_env() -> Optional[int]:
    """Configs per case from ``NEURON_OPTIM_SAMPLES`` (default 3)."""
    return _samples_from_env("NEURON_OPTIM_SAMPLES", DEFAULT_SAMPLES)


# ---------------------------------------------------------------------------------
# The model, the loss and one optimizer run
# ---------------------------------------------------------------------------------


def _impl_kwargs(info: Any, impl: str) -> dict:
    flags = {flag: False for flag in info.supported_impls if flag != "fused" or "cpu" in info.supports_fused_on}
    if impl != "forloop":
        flags[impl] = True
    return flags


def _make_params(info: Any, impl: str) -> list[Any]:
    """The CPU tensors of one run: w1, b1, w2, b2 of the model, then the extra parameters.
    Every one is a leaf; those the optimizer updates require grad."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Sigmoid(), torch.nn.Linear(3, 2))
    params = [p.detach().clone() for p in model.parameters()]
    if info.name != "Adafactor":  # which divides by a parameter's size
        params.append(torch.empty(0))  # foreach and fused kernels must accept empty tensors
    if info.supports_complex and impl != "fused":
        params.append(torch.randn(3, dtype=torch.complex64))
    for p in params:
        # Muon updates matrices only: the biases stay fixed.
        p.requires_grad_(info.name != "Muon" or p.dim() == 2)
    return params


def _groups(info: Any, params: list[Any]) -> Any:
    trained = [p for p in params if p.requires_grad]
    if not info.supports_param_groups:
        return trained
    return [{"params": [p for p in trained if p.dim() == 2]}, {"params": [p for p in trained if p.dim() != 2]}]


def _loss(params: list[Any], x: Any) -> Any:
    import torch

    w1, b1, w2, b2, *extra = params
    out = torch.sigmoid(x @ w1.t() + b1) @ w2.t() + b2
    loss = out.square().mean()
    for p in extra:
        loss = loss + (p.abs().square().sum() if p.is_complex() else p.sum())
    return loss


def _run(info: Any, kwargs: dict, leaves: list[Any], x: Any) -> tuple[list[Any], Any]:
    """STEPS optimizer steps; returns the parameters after each step and the optimizer.

    With ``differentiable=True`` the optimizer takes one step on non-leaf copies of the
    leaves, through autograd (several steps in place would modify what autograd saved
    for the first), and the last entry is the gradient of the new parameters with
    respect to the leaves: what a differentiable optimizer is for."""
    import torch

    differentiable = bool(kwargs.get("differentiable"))
    steps = 1 if differentiable else STEPS
    params = leaves
    if differentiable:
        params = [p.clone() if p.requires_grad else p for p in leaves]
        for p in params:
            if p.requires_grad:
                p.retain_grad()
    opt = info.optim_cls(_groups(info, params), **kwargs)

    def closure() -> Any:
        opt.zero_grad()
        loss = _loss(params, x)
        loss.backward(retain_graph=differentiable)
        return loss

    history: list[Any] = []
    for _ in range(steps):
        if info.step_requires_closure:
            opt.step(closure)
        else:
            closure()
            opt.step()
        history.append([p.detach().clone() for p in params])
    if differentiable:
        trained = [(p, leaf) for p, leaf in zip(params, leaves) if leaf.requires_grad]
        total = sum((p.abs().sum() for p, _ in trained), torch.zeros((), device=x.device))
        history.append(list(torch.autograd.grad(total, [leaf for _, leaf in trained], allow_unused=True)))
    if x.device.type == DEVICE:
        torch.neuron.synchronize()  # an asynchronous error belongs to this run
    return history, opt


def check_case(info: Any, impl: str, max_samples: Optional[int], mode: str) -> CaseResult:
    """Runs every config of one optimizer implementation on neuron in ``mode`` (in this process)."""
    import torch

    import neuron_lab

    key = f"{info.name}.{impl}"
    start = time.perf_counter()
    failures: list[str] = []
    details: list[str] = []
    checks: dict[str, int] = {}

    def count(kind: str) -> None:
        checks[kind] = checks.get(kind, 0) + 1

    def fail(where: str, text: str) -> None:
        failures.append(f"{where}: {text.strip().splitlines()[0] if text.strip() else ''}")
        details.append(f"{where}: {text.strip()}")

    configs = info.optim_inputs_func(device="cpu", dtype=torch.float32)
    run = 0
    with neuron_lab.mode(mode):
        for config in configs[: max_samples or len(configs)]:
            run += 1
            kwargs = {**copy.deepcopy(config.kwargs), **_impl_kwargs(info, impl)}
            where = f"config {config.desc!r}"
            torch.manual_seed(1)
            x = torch.randn(5, 4)
            cpu_params = _make_params(info, impl)
            dev_params = [move(p, DEVICE) for p in cpu_params]
            cpu_result, cpu_exc, dev_result, dev_exc, dev_tb = run_pair(
                lambda: _run(info, kwargs, cpu_params, x),
                lambda: _run(info, move(kwargs, DEVICE), dev_params, x.to(DEVICE)),
            )
            if cpu_exc is not None:
                count("cpu_raised")
                if dev_exc is None:
                    fail(where, f"the CPU raised {describe(cpu_exc)}, but {DEVICE} did not raise")
                continue
            if dev_exc is not None:
                fail(where, describe(dev_exc) + "\n" + dev_tb[-3000:])
                continue
            (cpu_history, cpu_opt), (dev_history, dev_opt) = cpu_result, dev_result
            try:
                for step, (expected, actual) in enumerate(zip(cpu_history, dev_history)):
                    last = step == len(cpu_history) - 1 and kwargs.get("differentiable")
                    what = "d(new parameters)/d(leaves)" if last else f"parameters after step {step + 1}"
                    compare(expected, actual, path=what)
                count("steps")
                compare(cpu_opt.state_dict(), dev_opt.state_dict(), path="state_dict", check_device=False)
                count("state")
                reloaded = info.optim_cls(_groups(info, dev_params), **move(kwargs, DEVICE))
                reloaded.load_state_dict(dev_opt.state_dict())
                compare(cpu_opt.state_dict(), reloaded.state_dict(), path="load_state_dict round trip",
                        check_device=False)
                count("state_round_trip")
            except Mismatch as e:
                fail(where, str(e))
    seconds = time.perf_counter() - start
    if run == 0 or set(checks) == {"cpu_raised"}:
        return CaseResult(key, "skipped", "the CPU raised for every config: nothing to compare", run, checks,
                          failures, seconds)
    if failures:
        return CaseResult(key, "failed", "\n".join(details), run, checks, failures, seconds)
    return CaseResult(key, "passed", "", run, checks, [], seconds)


def run_case(key: str, params: dict) -> CaseResult:
    """Checks one optimizer implementation in this process (what the worker runs)."""
    return run_guarded(
        key, EXCLUSIONS, lambda: check_case(*all_cases()[key], params.get("samples"), params.get("mode", "adaptive"))
    )


def make_runner(max_samples: Optional[int], mode: str = "adaptive", timeout: Optional[float] = None):
    """Runs cases in a crash-isolating worker (or in this process with ``NEURON_TEST_INPROCESS=1``)."""
    return _make_runner(__file__, run_case, {"samples": max_samples, "mode": mode}, EXCLUSIONS, timeout)


if __name__ == "__main__":
    main(run_case, all_cases, description="Check optim_db optimizers on the neuron device, in process.",
         case_flag="--case", case_help="case id, e.g. Adam.fused", unit="configs", modes=MODES)
