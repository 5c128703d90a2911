"""OpInfo conformance harness for the ``neuron`` device (shared by tests and scripts).

Every OpInfo of PyTorch's own database
(``torch.testing._internal.common_methods_invocations.op_db``) that supports
``torch.float32`` on the CPU is checked on the neuron device against the CPU
reference, sample by sample (``op.sample_inputs("cpu", torch.float32, ...)``):

* **forward**: the op runs on CPU copies and on neuron copies of every tensor in
  the sample (input, args, kwargs; strides, storage offsets and
  ``requires_grad`` are kept, ``device="cpu"`` arguments become ``"neuron"``).
  The results are compared with ``torch.testing.assert_close`` (tensors,
  nested tuples/lists/dicts, Python scalars); other values with ``==``. A tensor
  result must live on the neuron device and agree in ``requires_grad``. Ops
  flagged ``has_nondeterministic_output`` (``empty`` and friends: uninitialised
  memory) are compared on metadata only (shape, dtype, device, strides).
  If the CPU reference raises, the neuron run must raise too (any type).
* **backward** (``op.supports_autograd``): every floating (or complex) result
  that requires grad (after ``sample.output_process_fn_grad``) is summed, and
  the gradients of the sample's leaf tensors are compared.
* **in-place** (``op.inplace_variant``): run on fresh copies without grad; the
  returned value and the mutated input are compared, and an in-place call that
  returns ``self`` on the CPU must return ``self`` on neuron. Samples whose CPU
  in-place call raises (e.g. broadcasting the input) are skipped.

A sample with no tensor and no device argument (``arange(2)``) cannot involve
the device: it is skipped and does not count towards the samples per op. A
tensor that the sample function itself keeps on the CPU when asked for the
device (``tensor_split``'s index tensor, which must be a CPU tensor, as on CUDA)
stays on the CPU in the device run (see ``samples_with_placement``).

Each side is seeded with ``torch.manual_seed(0)`` right before each call (this
seeds the neuron generators too, which draw the same numbers as the CPU), so
random ops are compared exactly.

Ops run in a worker subprocess (``isolated.CaseRunner``) so that an op that
crashes the process (segfault, abort) or hangs is reported as such, and the run
goes on with a fresh worker. ``NEURON_TEST_INPROCESS=1`` runs in the calling
process instead (for debugging). Inputs move and results compare through
``parity``, shared with the module and optimizer suites.

Environment variables:

* ``NEURON_OPINFO_SAMPLES``: samples per op (default 2; ``0`` or ``all``: all).
* ``NEURON_TEST_TIMEOUT``: seconds one op may take before its worker is killed
  (default 300).
* ``NEURON_TEST_INPROCESS``: ``1`` to run ops in this process.

Run one op by hand: ``python tests/opinfo_support.py --op nn.functional.conv2d``.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, Iterator, Optional

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)

from isolated import REPO_ROOT, CaseResult, main, make_runner as _make_runner, run_guarded  # noqa: E402
from isolated import samples_from_env as _samples_from_env  # noqa: E402
from parity import (  # noqa: E402
    CALL_SEED, DEVICE, Mismatch, compare, describe, flatten, grad_roots, move, run_pair, seeded, tensor_devices,
    total_loss,
)

if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

DEFAULT_SAMPLES = 2

# Ops that are not applicable to the neuron device or to this harness, keyed by
# test id (op.name, plus "." + variant_test_name when there is one). Each one is
# reported as skipped with its reason. Ops that merely FAIL on neuron never go
# here: they are device bugs (see the sweep report).
EXCLUSIONS: dict[str, str] = {
    # Sparse layouts. The neuron device holds strided (dense) tensors only, by
    # design: the Sparse*/SparseCsrPrivateUse1 fallbacks refuse every op, and the
    # dense fallback refuses to return a sparse result (fallback.cpp), each with a
    # NotImplementedError telling the user to run the op on the CPU.
    "to_sparse": "returns a sparse COO tensor (aten::_to_sparse); the neuron device holds only "
    "strided tensors by design",
    "sparse.sampled_addmm": "takes a sparse CSR input (aten::sparse_sampled_addmm); the neuron "
    "device holds only strided tensors by design",
    "sparse.mm.reduce": "takes a sparse CSR input (aten::_sparse_mm_reduce_impl); the neuron "
    "device holds only strided tensors by design",
    # Harness artifacts: nothing of the op can run on the device.
    "broadcast_shapes": "takes only shapes (ints/tuples) and returns a torch.Size: no tensor and "
    "no device argument, so no sample can involve the neuron device",
}


def op_id(op: Any) -> str:
    """The test id of an OpInfo: its name, plus ``.variant`` when it has a variant name."""
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


_OPS: Optional[dict[str, Any]] = None


def all_ops() -> dict[str, Any]:
    """Every OpInfo of op_db that supports float32 on the CPU, by test id (db order)."""
    global _OPS
    if _OPS is None:
        import torch
        from torch.testing._internal.common_methods_invocations import op_db

        ops: dict[str, Any] = {}
        for op in op_db:
            if torch.float32 not in op.supported_dtypes("cpu"):
                continue
            key = op_id(op)
            if key in ops:  # not expected; keep ids unique all the same
                n = 2
                while f"{key}#{n}" in ops:
                    n += 1
                key = f"{key}#{n}"
            ops[key] = op
        _OPS = ops
    return _OPS


def all_op_ids() -> list[str]:
    return list(all_ops())


def samples_from_env() -> Optional[int]:
    """Samples per op from ``NEURON_OPINFO_SAMPLES`` (default 2; ``0``/``all``: None, every sample)."""
    return _samples_from_env("NEURON_OPINFO_SAMPLES", DEFAULT_SAMPLES)


# ---------------------------------------------------------------------------------
# Moving samples between devices
# ---------------------------------------------------------------------------------


@dataclass
class Call:
    input: Any
    args: tuple
    kwargs: dict


def move_sample(sample: Any, device: str, keep_grad: bool = True,
                placement: Optional[list[str]] = None) -> Call:
    """Fresh copies of a sample's tensors on ``device`` (see ``parity.move``)."""
    it = iter(placement) if placement is not None else None
    return Call(
        move(sample.input, device, keep_grad, it),
        move(sample.args, device, keep_grad, it),
        move(sample.kwargs, device, keep_grad, it),
    )


def samples_with_placement(op: Any, requires_grad: bool) -> Iterator[tuple[Any, Optional[list[str]]]]:
    """The op's float32 CPU samples, each with where the sample function puts its tensors
    when asked for the device.

    A few sample functions create some tensors on the CPU whatever device they
    are asked for (``tensor_split``'s index tensor must be a CPU tensor, as on
    CUDA). The same samples are generated for the device alongside (same
    per-sample seeds), and any tensor that stays on the CPU there stays on the CPU
    in the device run. The placement is None where the two disagree in structure
    or the device samples cannot be made (then every tensor moves).
    """
    import torch

    torch.manual_seed(CALL_SEED)
    cpu_it = iter(op.sample_inputs("cpu", torch.float32, requires_grad=requires_grad))
    try:
        dev_it: Optional[Iterator[Any]] = iter(op.sample_inputs(DEVICE, torch.float32,
                                                                requires_grad=requires_grad))
    except Exception:
        dev_it = None
    for sample in cpu_it:
        where = None
        if dev_it is not None:
            try:
                tmpl = next(dev_it)
                got = tensor_devices((tmpl.input, tmpl.args, tmpl.kwargs))
                if len(got) == len(tensor_devices((sample.input, sample.args, sample.kwargs))):
                    where = got
            except Exception:
                dev_it = None
        yield sample, where


def _touches_device(call: Call) -> bool:
    """Whether a moved call involves the device at all (a device tensor or a device argument)."""
    import torch

    kind = torch.device(DEVICE).type
    for v in flatten((call.input, call.args, call.kwargs)):
        if isinstance(v, torch.Tensor) and v.device.type == kind:
            return True
        if isinstance(v, torch.device) and v.type == kind:
            return True
        if isinstance(v, str) and v.split(":")[0] == kind:
            return True
    return False


def _leaves(call: Call) -> list[Any]:
    import torch

    return [
        t
        for t in flatten((call.input, call.args, call.kwargs))
        if isinstance(t, torch.Tensor) and t.requires_grad
    ]


# ---------------------------------------------------------------------------------
# Checking one op
# ---------------------------------------------------------------------------------


def _summary(sample: Any) -> str:
    try:
        return sample.summary()
    except Exception:  # pragma: no cover - best effort
        return repr(sample)[:300]


def check_op(op: Any, max_samples: Optional[int]) -> CaseResult:
    """Runs every check of one OpInfo on the neuron device (in this process)."""
    import torch

    key = op_id(op)
    start = time.perf_counter()
    failures: list[str] = []
    details: list[str] = []
    checks: dict[str, int] = {}

    def count(kind: str) -> None:
        checks[kind] = checks.get(kind, 0) + 1

    def fail(phase: str, index: int, sample: Any, text: str) -> None:
        failures.append(f"[{phase}] sample {index}: {text.strip().splitlines()[0] if text.strip() else ''}")
        details.append(f"[{phase}] sample {index}: {text.strip()}\n  sample: {_summary(sample)}")

    metadata_only = bool(getattr(op, "has_nondeterministic_output", False))
    inplace = op.inplace_variant
    samples = samples_with_placement(op, op.supports_autograd)
    index = -1
    run = 0  # samples that involve the device; max_samples counts these

    while max_samples is None or run < max_samples:
        try:
            sample, where = next(samples)
        except StopIteration:
            break
        except Exception as e:
            return CaseResult(key, "error", f"harness: sample_inputs raised {describe(e)}",
                            seconds=time.perf_counter() - start)
        index += 1
        # ---- forward -----------------------------------------------------------
        try:
            dev = move_sample(sample, DEVICE, placement=where)
        except Exception as e:
            run += 1
            fail("move-inputs", index, sample, f"moving the sample to {DEVICE} raised {describe(e)}")
            continue
        if not _touches_device(dev):
            # e.g. arange(2): no tensor and no device argument, so both runs are CPU runs.
            count("host_only")
            continue
        run += 1
        cpu = move_sample(sample, "cpu")
        cpu_out, cpu_exc, dev_out, dev_exc, dev_tb = run_pair(
            lambda: seeded(op, cpu.input, *cpu.args, **cpu.kwargs),
            lambda: seeded(op, dev.input, *dev.args, **dev.kwargs),
        )
        if cpu_exc is not None:
            count("forward_cpu_raised")
            if dev_exc is None:
                fail("forward", index, sample,
                     f"the CPU reference raised {describe(cpu_exc)}, but {DEVICE} did not raise")
            continue
        if dev_exc is not None:
            fail("forward", index, sample, describe(dev_exc) + "\n" + dev_tb[-3000:])
            continue
        count("forward")
        try:
            compare(cpu_out, dev_out, metadata_only=metadata_only)
        except Mismatch as e:
            fail("forward", index, sample, str(e))
            continue
        except Exception as e:  # reading the neuron result raised
            fail("forward", index, sample, f"reading the result raised {describe(e)}")
            continue

        # ---- backward ----------------------------------------------------------
        if op.supports_autograd:
            try:
                cpu_roots = grad_roots(sample.output_process_fn_grad(cpu_out))
                cpu_leaves = _leaves(cpu)
            except Exception:
                cpu_roots = []
            if cpu_roots and cpu_leaves:
                try:
                    dev_roots = grad_roots(sample.output_process_fn_grad(dev_out))
                    dev_leaves = _leaves(dev)
                except Exception as e:
                    fail("backward", index, sample, f"preparing the backward raised {describe(e)}")
                    continue
                if len(dev_roots) != len(cpu_roots) or len(dev_leaves) != len(cpu_leaves):
                    fail("backward", index, sample,
                         f"{len(dev_roots)} differentiable outputs / {len(dev_leaves)} leaves on {DEVICE}, "
                         f"{len(cpu_roots)} / {len(cpu_leaves)} on cpu")
                    continue
                cpu_grads, cpu_exc, dev_grads, dev_exc, dev_tb = run_pair(
                    lambda: seeded(torch.autograd.grad, total_loss(cpu_roots), cpu_leaves, allow_unused=True),
                    lambda: seeded(torch.autograd.grad, total_loss(dev_roots), dev_leaves, allow_unused=True),
                )
                count("backward")
                if cpu_exc is not None:
                    count("backward_cpu_raised")
                    if dev_exc is None:
                        fail("backward", index, sample,
                             f"the CPU backward raised {describe(cpu_exc)}, but {DEVICE} did not raise")
                        continue
                elif dev_exc is not None:
                    fail("backward", index, sample, describe(dev_exc) + "\n" + dev_tb[-3000:])
                    continue
                else:
                    try:
                        compare(list(cpu_grads), list(dev_grads), metadata_only=metadata_only, path="grad")
                    except Mismatch as e:
                        fail("backward", index, sample, str(e))
                        continue
                    except Exception as e:
                        fail("backward", index, sample, f"reading the gradient raised {describe(e)}")
                        continue

        # ---- in-place variant ----------------------------------------------------
        if inplace is not None:
            cpu = move_sample(sample, "cpu", keep_grad=False)
            try:
                dev = move_sample(sample, DEVICE, keep_grad=False, placement=where)
            except Exception as e:
                fail("inplace", index, sample, f"moving the sample to {DEVICE} raised {describe(e)}")
                continue
            try:
                cpu_ret = seeded(inplace, cpu.input, *cpu.args, **cpu.kwargs)
            except Exception:
                count("inplace_cpu_raised")
                continue  # not a valid in-place sample (e.g. the input broadcasts)
            count("inplace")
            try:
                dev_ret = seeded(inplace, dev.input, *dev.args, **dev.kwargs)
            except Exception as e:
                fail("inplace", index, sample, describe(e) + "\n" + traceback.format_exc()[-3000:])
                continue
            try:
                if cpu_ret is cpu.input and dev_ret is not dev.input:
                    raise Mismatch(f"the in-place call returned a new object on {DEVICE}, not its input")
                compare(cpu.input, dev.input, metadata_only=metadata_only, path="mutated input")
                compare(cpu_ret, dev_ret, metadata_only=metadata_only, path="returned value")
            except Mismatch as e:
                fail("inplace", index, sample, str(e))
            except Exception as e:
                fail("inplace", index, sample, f"reading the result raised {describe(e)}")

    seconds = time.perf_counter() - start
    if index < 0:
        return CaseResult(key, "skipped", "no float32 samples", 0, checks, [], seconds)
    if not failures and not any(k != "host_only" for k in checks):
        return CaseResult(key, "skipped", "no sample involves the device", run, checks, [], seconds)
    if failures:
        return CaseResult(key, "failed", "\n".join(details), run, checks, failures, seconds)
    return CaseResult(key, "passed", "", run, checks, [], seconds)


def run_in_process(key: str, max_samples: Optional[int]) -> CaseResult:
    """Checks one op in this process (what the worker runs for each request)."""
    import neuron_lab  # noqa: F401  (registers the device)

    return run_guarded(key, EXCLUSIONS, lambda: check_op(all_ops()[key], max_samples))


# ---------------------------------------------------------------------------------
# Crash-isolating worker
# ---------------------------------------------------------------------------------


def run_case(key: str, params: dict) -> CaseResult:
    return run_in_process(key, params.get("samples"))


def make_runner(max_samples: Optional[int], timeout: Optional[float] = None):
    """Runs ops in a crash-isolating worker (or in this process with ``NEURON_TEST_INPROCESS=1``)."""
    return _make_runner(__file__, run_case, {"samples": max_samples}, EXCLUSIONS, timeout)


if __name__ == "__main__":
    main(run_case, all_ops, description="Check OpInfo ops on the neuron device, in process.", case_flag="--op",
         case_help="test id", unit="samples")
