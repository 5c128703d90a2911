"""Bitwise sweep of the ``neuron`` device: every OpInfo op gives the CPU's bits.

The device runs ATen's CPU kernels on device memory, so an op's results and its input
gradients must be the CPU's bit for bit, in every execution mode (adaptive, eager,
blocking), not merely close: a result that rounds differently drifts a training run away
from the CPU's (silu's backward once did, in a diffusers UNet).

For each OpInfo of ``op_db`` that supports float32 on the CPU (the ops of
``opinfo_support``), each float32 sample runs on CPU copies and on neuron copies of its
tensors (``opinfo_support.move_sample``), each side seeded with ``torch.manual_seed(0)``:

* **forward**: every result must have the CPU's dtype, shape, strides and bits (other
  strides make later ops take other loops, which round differently). Floating and
  complex tensors are compared as integers of their width (``-0.0`` is not ``0.0``); a NaN
  matches a NaN (its payload is not compared), nothing else. Ops flagged
  ``has_nondeterministic_output`` (``empty`` and friends) compare metadata only, and so
  do the ops in ``CPU_NOT_REPRODUCIBLE`` where this torch's CPU results differ from run to
  run (LAPACK's gelsy behind ``linalg.lstsq`` on torch 2.13). If the CPU raises, the device must raise.
* **input gradient** (``op.supports_autograd``): the differentiable results (after
  ``sample.output_process_fn_grad``) are given a fixed random cotangent (the same on both
  sides, drawn from a generator seeded by the sample's index) and the gradients of the
  sample's leaf tensors must have the CPU's bits.

An op that cannot be compared on neuron is listed in ``EXCLUSIONS`` (with
``opinfo_support.EXCLUSIONS``) with its reason: one place, and tests check that every entry
still names an op. A mismatch fails; it is never skipped.

Ops run in a crash-isolating worker subprocess (``isolated.CaseRunner``); the mode is a
parameter of each case. Run one op by hand::

    python tests/bitwise_support.py --op nn.functional.silu --mode eager --samples 0
"""

from __future__ import annotations

import math
import os
import struct
import sys
import time
from typing import Any, Optional

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)

import opinfo_support  # noqa: E402
from isolated import CaseResult, main, make_runner as _make_runner, run_guarded  # noqa: E402
from parity import DEVICE, describe, grad_roots, run_pair, seeded  # noqa: E402

MODES = ("adaptive", "eager", "blocking")
COTANGENT_SEED = 1234

# Ops whose results cannot be compared bit for bit on neuron, keyed by test id, with why.
# (The conformance suite's exclusions apply too: opinfo_support.EXCLUSIONS.)
EXCLUSIONS: dict[str, str] = {**opinfo_support.EXCLUSIONS}


# Ops whose CPU results may differ from run to run, so that they are no bitwise reference:
# where this torch's CPU does vary (its probe, ``cpu_varies``), they are compared on
# metadata (dtype, shape, strides) only; where it does not, bit for bit like any op.
CPU_NOT_REPRODUCIBLE: dict[str, str] = {
    "linalg.lstsq": "LAPACK's gelsy (its default driver on the CPU) gives other bits for the same input "
    "depending on where its work buffers lie in memory (torch 2.13.0+cpu with MKL 2024.2, one thread "
    "or more; torch 2.14.1's build reproduces them)",
    "linalg.lstsq.grad_oriented": "as linalg.lstsq: LAPACK's gelsy",
}


# For each, code that prints how many of 400 identical CPU calls differ from the first, in a
# fresh interpreter (where its allocations fall varies less with what ran before).
_LSTSQ_PROBE = """
import torch
g = torch.Generator().manual_seed(0)
a, b = torch.randn(3, 3, 3, 3, generator=g), torch.randn(3, 3, 3, 3, generator=g)
first = torch.linalg.lstsq(a, b, driver="gelsy").solution
differ = 0
for i in range(400):
    shift = torch.empty(i % 17 + 1)  # the work buffers start at other addresses
    differ += not torch.equal(torch.linalg.lstsq(a, b, driver="gelsy").solution, first)
print(differ)
"""
CPU_NOT_REPRODUCIBLE_PROBES = {"linalg.lstsq": _LSTSQ_PROBE, "linalg.lstsq.grad_oriented": _LSTSQ_PROBE}
_probe_verdicts: dict[str, bool] = {}


def cpu_varies(op_id: str) -> bool:
    """Whether this torch's CPU gives ``op_id`` other bits from call to call: its probe, run
    once per process in a fresh interpreter. False for an op without a probe."""
    probe = CPU_NOT_REPRODUCIBLE_PROBES.get(op_id)
    if probe is None:
        return False
    if probe not in _probe_verdicts:
        import subprocess

        result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600,
                                env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
        if result.returncode != 0:
            raise RuntimeError(f"the CPU reproducibility probe of {op_id} failed:\n{result.stderr[-2000:]}")
        _probe_verdicts[probe] = int(result.stdout.split()[-1]) > 0
    return _probe_verdicts[probe]


def all_op_ids() -> list[str]:
    return opinfo_support.all_op_ids()


# ---------------------------------------------------------------------------------
# Comparing bits
# ---------------------------------------------------------------------------------


def _bits(t: Any) -> Any:
    """A tensor of integers holding t's bits (floating and complex dtypes), else t itself."""
    import torch

    if t.is_complex():
        t = torch.view_as_real(t.resolve_conj())
    if t.is_floating_point():
        width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
        return t.contiguous().view(width)
    return t


def tensor_bits_mismatch(expected: Any, actual: Any) -> Optional[str]:
    """None if ``actual`` (a neuron tensor) has ``expected``'s bits (NaN matching NaN), else why not."""
    import torch

    got = actual.detach().cpu().resolve_neg().resolve_conj()
    want = expected.detach().resolve_neg().resolve_conj()
    if want.is_floating_point() or want.is_complex():
        same = _bits(got) == _bits(want)
        real_got = torch.view_as_real(got) if got.is_complex() else got
        real_want = torch.view_as_real(want) if want.is_complex() else want
        same = same | (torch.isnan(real_got) & torch.isnan(real_want))
        if bool(same.all()):
            return None
        differ = int((~same).sum())
        diff = (real_got.double() - real_want.double()).abs()
        diff = diff[~same & ~torch.isnan(diff)]
        worst = f", largest difference {float(diff.max()):.3g}" if diff.numel() else ""
        return f"{differ} of {same.numel()} elements differ in their bits{worst}"
    if torch.equal(got, want):
        return None
    return f"{int((got != want).sum())} of {want.numel()} elements differ"


def bits_mismatch(expected: Any, actual: Any, path: str = "result", metadata_only: bool = False,
                  check_device: bool = True) -> Optional[str]:
    """None if the neuron result ``actual`` is the CPU result ``expected`` bit for bit, else why not."""
    import torch

    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            return f"{path}: expected a tensor, got {type(actual).__name__}"
        if check_device and expected.device.type == "cpu" and actual.device.type != torch.device(DEVICE).type:
            return f"{path}: result is on {actual.device}, expected the {DEVICE} device"
        if expected.dtype != actual.dtype or expected.shape != actual.shape:
            return (f"{path}: {actual.dtype}{list(actual.shape)} on {DEVICE}, "
                    f"{expected.dtype}{list(expected.shape)} on cpu")
        if expected.layout != torch.strided or actual.layout != torch.strided:
            return None if expected.layout == actual.layout else f"{path}: layout {actual.layout}"
        if expected.stride() != actual.stride() and expected.numel() > 1:
            # Later ops take other loops over other strides, and round differently.
            return f"{path}: strides {actual.stride()} on {DEVICE}, {expected.stride()} on cpu"
        if metadata_only:
            return None
        why = tensor_bits_mismatch(expected, actual)
        return f"{path}: {why}" if why else None
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            return f"{path}: expected a {type(expected).__name__} of {len(expected)}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            why = bits_mismatch(e, a, f"{path}[{i}]", metadata_only, check_device)
            if why:
                return why
        return None
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or set(actual) != set(expected):
            return f"{path}: expected a dict with keys {sorted(expected)}"
        for k in expected:
            why = bits_mismatch(expected[k], actual[k], f"{path}[{k!r}]", metadata_only, check_device)
            if why:
                return why
        return None
    if isinstance(actual, torch.Tensor):
        return f"{path}: expected {type(expected).__name__} {expected!r}, got a tensor"
    if isinstance(expected, float) and isinstance(actual, float):
        if metadata_only or (math.isnan(expected) and math.isnan(actual)):
            return None
        same = struct.pack("<d", expected) == struct.pack("<d", actual)
        return None if same else f"{path}: {actual!r} on {DEVICE}, {expected!r} on cpu"
    if expected != actual:
        return f"{path}: {actual!r} on {DEVICE}, {expected!r} on cpu"[:500]
    return None


# ---------------------------------------------------------------------------------
# Checking one op
# ---------------------------------------------------------------------------------


def cotangents(roots: list[Any], index: int) -> list[Any]:
    """A fixed random cotangent per differentiable result (CPU tensors)."""
    import torch

    gen = torch.Generator().manual_seed(COTANGENT_SEED + index)
    return [torch.randn(r.shape, dtype=r.dtype, generator=gen) for r in roots]


def check_bits(op: Any, max_samples: Optional[int], mode: str) -> CaseResult:
    """Compares one OpInfo's results and input gradients with the CPU's bits, in ``mode``."""
    import torch

    import neuron_lab

    key = opinfo_support.op_id(op)
    start = time.perf_counter()
    failures: list[str] = []
    checks: dict[str, int] = {}

    def count(kind: str) -> None:
        checks[kind] = checks.get(kind, 0) + 1

    def fail(phase: str, index: int, text: str) -> None:
        failures.append(f"[{phase}] sample {index}: {text.strip()[:1500]}")

    metadata_only = bool(getattr(op, "has_nondeterministic_output", False)) or cpu_varies(key)
    samples = opinfo_support.samples_with_placement(op, op.supports_autograd)
    index, run = -1, 0
    with neuron_lab.mode(mode):
        while max_samples is None or run < max_samples:
            try:
                sample, where = next(samples)
            except StopIteration:
                break
            except Exception as e:
                return CaseResult(key, "error", f"harness: sample_inputs raised {describe(e)}",
                                  seconds=time.perf_counter() - start)
            index += 1
            try:
                dev = opinfo_support.move_sample(sample, DEVICE, placement=where)
            except Exception as e:
                run += 1
                fail("move-inputs", index, f"moving the sample to {DEVICE} raised {describe(e)}")
                continue
            if not opinfo_support._touches_device(dev):
                count("host_only")
                continue
            run += 1
            cpu = opinfo_support.move_sample(sample, "cpu")
            cpu_out, cpu_exc, dev_out, dev_exc, dev_tb = run_pair(
                lambda: seeded(op, cpu.input, *cpu.args, **cpu.kwargs),
                lambda: seeded(op, dev.input, *dev.args, **dev.kwargs),
            )
            if cpu_exc is not None:
                count("forward_cpu_raised")
                if dev_exc is None:
                    fail("forward", index, f"the CPU raised {describe(cpu_exc)}, but {DEVICE} did not")
                continue
            if dev_exc is not None:
                fail("forward", index, describe(dev_exc) + "\n" + dev_tb[-2000:])
                continue
            count("forward")
            if metadata_only:
                count("forward_metadata_only")
            try:
                why = bits_mismatch(cpu_out, dev_out, metadata_only=metadata_only)
            except Exception as e:
                why = f"reading the result raised {describe(e)}"
            if why:
                fail("forward", index, why)
                continue
            if not op.supports_autograd:
                continue
            try:
                cpu_roots = grad_roots(sample.output_process_fn_grad(cpu_out))
                cpu_leaves = opinfo_support._leaves(cpu)
            except Exception:
                cpu_roots = []
            if not cpu_roots or not cpu_leaves:
                continue
            try:
                dev_roots = grad_roots(sample.output_process_fn_grad(dev_out))
                dev_leaves = opinfo_support._leaves(dev)
            except Exception as e:
                fail("gradient", index, f"preparing the backward raised {describe(e)}")
                continue
            if len(dev_roots) != len(cpu_roots) or len(dev_leaves) != len(cpu_leaves):
                fail("gradient", index, f"{len(dev_roots)} differentiable results / {len(dev_leaves)} leaves on "
                     f"{DEVICE}, {len(cpu_roots)} / {len(cpu_leaves)} on cpu")
                continue
            cpu_cot = cotangents(cpu_roots, index)
            dev_cot = [c.to(DEVICE) for c in cpu_cot]
            cpu_grads, cpu_exc, dev_grads, dev_exc, dev_tb = run_pair(
                lambda: seeded(torch.autograd.grad, cpu_roots, cpu_leaves, cpu_cot, allow_unused=True),
                lambda: seeded(torch.autograd.grad, dev_roots, dev_leaves, dev_cot, allow_unused=True),
            )
            count("gradient")
            if cpu_exc is not None:
                count("gradient_cpu_raised")
                if dev_exc is None:
                    fail("gradient", index, f"the CPU backward raised {describe(cpu_exc)}, but {DEVICE} did not")
                continue
            if dev_exc is not None:
                fail("gradient", index, describe(dev_exc) + "\n" + dev_tb[-2000:])
                continue
            try:
                why = bits_mismatch(list(cpu_grads), list(dev_grads), path="grad", metadata_only=metadata_only)
            except Exception as e:
                why = f"reading the gradient raised {describe(e)}"
            if why:
                fail("gradient", index, why)
        torch.neuron.synchronize()
    seconds = time.perf_counter() - start
    if index < 0:
        return CaseResult(key, "skipped", "no float32 samples", 0, checks, [], seconds)
    if failures:
        return CaseResult(key, "failed", "\n".join(failures), run, checks, failures, seconds)
    if not any(k != "host_only" for k in checks):
        return CaseResult(key, "skipped", "no sample involves the device", run, checks, [], seconds)
    return CaseResult(key, "passed", "", run, checks, [], seconds)


def run_case(key: str, params: dict) -> CaseResult:
    """Checks one op in this process, in ``params["mode"]`` (what the worker runs per request)."""
    import neuron_lab  # noqa: F401  (registers the device)

    mode = params.get("mode", "adaptive")
    return run_guarded(key, EXCLUSIONS,
                       lambda: check_bits(opinfo_support.all_ops()[key], params.get("samples"), mode))


def make_runner(max_samples: Optional[int], mode: str = "adaptive", timeout: Optional[float] = None):
    """Runs ops in a crash-isolating worker (or in this process with ``NEURON_TEST_INPROCESS=1``)."""
    return _make_runner(__file__, run_case, {"samples": max_samples, "mode": mode}, EXCLUSIONS, timeout)


if __name__ == "__main__":
    main(run_case, opinfo_support.all_ops, description="Compare OpInfo ops' bits on the neuron device, in process.",
         case_flag="--op", case_help="test id", unit="samples", modes=MODES)
