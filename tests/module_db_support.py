"""PyTorch's module database on the ``neuron`` device (shared by tests and scripts).

Every ModuleInfo of ``torch.testing._internal.common_modules.module_db`` is checked
against the CPU, input by input (``module_inputs_func(..., device="cpu",
dtype=torch.float32, requires_grad=True, training=...)``), in train mode and, where
PyTorch says the module behaves differently (``train_and_eval_differ``), in eval mode:

* **forward**: the module is built on the CPU with a fixed seed, a copy is moved with
  ``.to("neuron")`` (lazy modules are built a second time with the same seed and moved
  uninitialised), both run the same inputs right after ``torch.manual_seed(0)``, and
  the outputs and the buffers afterwards (running statistics) are compared. If the CPU
  raises, neuron must raise too.
* **backward**: the sum of every floating output that requires grad is backpropagated
  on both; the gradients of the inputs and of every parameter are compared.
* **state**: ``state_dict()`` (values, and every tensor on neuron), its round trip
  through ``torch.save``/``torch.load``, ``load_state_dict`` of the neuron state into a
  CPU copy and of the CPU state into a neuron copy, ``copy.deepcopy`` of the neuron
  module and, where the CPU module pickles, ``pickle`` of it; the deep copy then runs
  the forward again against a copy of the CPU module.

Tensors are compared with ``torch.testing.assert_close``'s float32 tolerances
(``parity.compare``). Each case runs in a given execution mode (``adaptive``, the
default, or ``blocking``) in a crash-isolating worker (``isolated.CaseRunner``).

Environment variables: ``NEURON_MODULE_SAMPLES`` (inputs per module and train/eval
mode; default 2, ``all`` for every input), ``NEURON_TEST_TIMEOUT``,
``NEURON_TEST_INPROCESS``. Run one module by hand:
``python tests/module_db_support.py --module nn.Conv2d --mode blocking``.
"""

from __future__ import annotations

import copy
import io
import os
import pickle
import sys
import time
import traceback
from typing import Any, Optional

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)

from isolated import CaseResult, main, make_runner as _make_runner, run_guarded  # noqa: E402
from isolated import samples_from_env as _samples_from_env  # noqa: E402
from parity import DEVICE, Mismatch, compare, describe, flatten, grad_roots, move, run_pair, seeded, total_loss  # noqa: E402

DEFAULT_SAMPLES = 2
MODES = ("adaptive", "blocking")

# Modules that are not applicable to the neuron device, by ModuleInfo name, with the
# reason. A module that merely fails on neuron never goes here: that is a device bug.
EXCLUSIONS: dict[str, str] = {}

_MODULES: Optional[dict[str, Any]] = None


def all_modules() -> dict[str, Any]:
    """Every ModuleInfo of module_db that supports float32, by name (db order)."""
    global _MODULES
    if _MODULES is None:
        import torch
        from torch.testing._internal.common_modules import module_db

        _MODULES = {info.name: info for info in module_db if torch.float32 in info.dtypes}
    return _MODULES


def all_module_ids() -> list[str]:
    return list(all_modules())


def samples_from_env() -> Optional[int]:
    """Inputs per module and train/eval mode from ``NEURON_MODULE_SAMPLES`` (default 2)."""
    return _samples_from_env("NEURON_MODULE_SAMPLES", DEFAULT_SAMPLES)


# ---------------------------------------------------------------------------------
# Checking one module
# ---------------------------------------------------------------------------------


def _build_pair(info: Any, constructor_input: Any) -> tuple[Any, Any]:
    """The CPU module and its neuron twin, equal in every parameter and buffer."""
    args, kwargs = constructor_input.args, constructor_input.kwargs
    cpu_module = seeded(info.module_cls, *args, **kwargs)
    if info.is_lazy:  # an uninitialised lazy module cannot be deep-copied
        dev_module = seeded(info.module_cls, *copy.deepcopy(args), **copy.deepcopy(kwargs)).to(DEVICE)
    else:
        dev_module = copy.deepcopy(cpu_module).to(DEVICE)
    return cpu_module, dev_module


def _state(module: Any) -> dict:
    return {k: v.detach() for k, v in module.state_dict().items()}


def _param_grads(module: Any) -> dict:
    return {name: p.grad for name, p in module.named_parameters()}


def _inputs_requiring_grad(args: Any, kwargs: Any) -> list[Any]:
    import torch

    return [t for t in flatten((args, kwargs)) if isinstance(t, torch.Tensor) and t.requires_grad]


def _check_state(cpu_module: Any, dev_module: Any, count) -> None:
    """state_dict, save/load, load_state_dict both ways, deepcopy, pickle (raises Mismatch)."""
    import torch

    expected = _state(cpu_module)
    compare(expected, _state(dev_module), path="state_dict")
    count("state_dict")

    buffer = io.BytesIO()
    torch.save(dev_module.state_dict(), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    compare(expected, loaded, path="torch.load(torch.save(state_dict))")

    cpu_copy = copy.deepcopy(cpu_module)
    cpu_copy.load_state_dict(dev_module.state_dict())
    if any(t.device.type != "cpu" for t in _state(cpu_copy).values()):
        raise Mismatch("load_state_dict of a neuron state moved the CPU module's tensors off the CPU")
    compare(expected, move(_state(cpu_copy), DEVICE), path="cpu module after load_state_dict(neuron state)")
    dev_copy = copy.deepcopy(dev_module)
    dev_copy.load_state_dict(cpu_module.state_dict())
    compare(expected, _state(dev_copy), path="neuron module after load_state_dict(cpu state)")
    count("state_round_trip")

    try:
        pickle.dumps(cpu_module)
    except Exception:
        return  # the CPU module does not pickle (a lambda in it, a local class)
    unpickled = pickle.loads(pickle.dumps(dev_module))
    compare(expected, _state(unpickled), path="pickle round trip")
    count("pickle")


def check_module(info: Any, max_samples: Optional[int], mode: str) -> CaseResult:
    """Runs every check of one ModuleInfo on the neuron device in ``mode`` (in this process)."""
    import torch

    import neuron_lab

    key = info.name
    start = time.perf_counter()
    failures: list[str] = []
    details: list[str] = []
    checks: dict[str, int] = {}

    def count(kind: str) -> None:
        checks[kind] = checks.get(kind, 0) + 1

    def fail(phase: str, where: str, text: str) -> None:
        failures.append(f"[{phase}] {where}: {text.strip().splitlines()[0] if text.strip() else ''}")
        details.append(f"[{phase}] {where}: {text.strip()}")

    training_flags = (True, False) if info.train_and_eval_differ else (True,)
    run = 0
    with neuron_lab.mode(mode):
        for training in training_flags:
            torch.manual_seed(0)
            inputs = info.module_inputs_func(info, device="cpu", dtype=torch.float32, requires_grad=True,
                                             training=training)
            for index, module_input in enumerate(inputs):
                if max_samples is not None and index >= max_samples:
                    break
                if module_input.forward_input is None:
                    continue
                run += 1
                where = f"{'train' if training else 'eval'} input {index} ({module_input.desc or 'default'})"
                try:
                    _check_one(info, module_input, training, count, lambda phase, text: fail(phase, where, text))
                except Exception as e:  # the harness itself, or reading a neuron result
                    fail("harness", where, describe(e) + "\n" + traceback.format_exc()[-2000:])
                torch.neuron.synchronize()  # an asynchronous error belongs to this input
    seconds = time.perf_counter() - start
    if run == 0:
        return CaseResult(key, "skipped", "no float32 inputs", 0, checks, [], seconds)
    if failures:
        return CaseResult(key, "failed", "\n".join(details), run, checks, failures, seconds)
    return CaseResult(key, "passed", "", run, checks, [], seconds)


def _check_one(info: Any, module_input: Any, training: bool, count, fail) -> None:
    import torch

    cpu_module, dev_module = _build_pair(info, module_input.constructor_input)
    cpu_module.train(training)
    dev_module.train(training)
    fwd = module_input.forward_input
    cpu_args, cpu_kwargs = move(fwd.args, "cpu"), move(fwd.kwargs, "cpu")
    dev_args, dev_kwargs = move(fwd.args, DEVICE), move(fwd.kwargs, DEVICE)

    cpu_out, cpu_exc, dev_out, dev_exc, dev_tb = run_pair(
        lambda: seeded(cpu_module, *cpu_args, **cpu_kwargs),
        lambda: seeded(dev_module, *dev_args, **dev_kwargs),
    )
    if cpu_exc is not None:
        count("forward_cpu_raised")
        if dev_exc is None:
            try:
                torch.neuron.synchronize()
            except Exception:
                return  # raised asynchronously, at the next wait: fine
            fail("forward", f"the CPU raised {describe(cpu_exc)}, but {DEVICE} did not raise")
        return
    if dev_exc is not None:
        fail("forward", describe(dev_exc) + "\n" + dev_tb[-3000:])
        return
    count("forward")
    try:
        compare(cpu_out, dev_out, path="output")
        compare(dict(cpu_module.named_buffers()), dict(dev_module.named_buffers()), path="buffers after forward")
    except Mismatch as e:
        fail("forward", str(e))
        return

    cpu_roots, dev_roots = grad_roots(cpu_out), grad_roots(dev_out)
    if cpu_roots:
        if len(dev_roots) != len(cpu_roots):
            fail("backward", f"{len(dev_roots)} differentiable outputs on {DEVICE}, {len(cpu_roots)} on cpu")
            return
        _, cpu_exc, _, dev_exc, dev_tb = run_pair(
            lambda: seeded(total_loss(cpu_roots).backward),
            lambda: seeded(total_loss(dev_roots).backward),
        )
        if cpu_exc is not None:
            count("backward_cpu_raised")
            if dev_exc is None:
                fail("backward", f"the CPU backward raised {describe(cpu_exc)}, but {DEVICE} did not raise")
            return
        if dev_exc is not None:
            fail("backward", describe(dev_exc) + "\n" + dev_tb[-3000:])
            return
        count("backward")
        try:
            compare([t.grad for t in _inputs_requiring_grad(cpu_args, cpu_kwargs)],
                    [t.grad for t in _inputs_requiring_grad(dev_args, dev_kwargs)], path="input grads")
            compare(_param_grads(cpu_module), _param_grads(dev_module), path="parameter grads")
        except Mismatch as e:
            fail("backward", str(e))
            return

    try:
        _check_state(cpu_module, dev_module, count)
    except Mismatch as e:
        fail("state", str(e))
        return
    # The deep copies compute what the originals compute.
    cpu_copy, dev_copy = copy.deepcopy(cpu_module), copy.deepcopy(dev_module)
    with torch.no_grad():
        cpu_again = seeded(cpu_copy, *move(fwd.args, "cpu", keep_grad=False), **move(fwd.kwargs, "cpu", keep_grad=False))
        dev_again = seeded(dev_copy, *move(fwd.args, DEVICE, keep_grad=False),
                           **move(fwd.kwargs, DEVICE, keep_grad=False))
    try:
        compare(cpu_again, dev_again, path="deep copy's output")
    except Mismatch as e:
        fail("state", str(e))
        return
    count("copy_forward")


def run_case(key: str, params: dict) -> CaseResult:
    """Checks one module in this process (what the worker runs for each request)."""
    return run_guarded(
        key, EXCLUSIONS, lambda: check_module(all_modules()[key], params.get("samples"), params.get("mode", "adaptive"))
    )


def make_runner(max_samples: Optional[int], mode: str = "adaptive", timeout: Optional[float] = None):
    """Runs modules in a crash-isolating worker (or in this process with ``NEURON_TEST_INPROCESS=1``)."""
    return _make_runner(__file__, run_case, {"samples": max_samples, "mode": mode}, EXCLUSIONS, timeout)


if __name__ == "__main__":
    main(run_case, all_modules, description="Check module_db modules on the neuron device, in process.",
         case_flag="--module", case_help="ModuleInfo name", unit="inputs", modes=MODES)
