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

Ops run in a worker subprocess (:class:`OpRunner`) so that an op that crashes
the process (segfault, abort) or hangs is reported as such, and the run goes on
with a fresh worker. ``NEURON_OPINFO_INPROCESS=1`` runs in the calling process
instead (for debugging).

Environment variables:

* ``NEURON_OPINFO_SAMPLES``: samples per op (default 2; ``0`` or ``all``: all).
* ``NEURON_OPINFO_TIMEOUT``: seconds one op may take before its worker is killed
  (default 300).
* ``NEURON_OPINFO_INPROCESS``: ``1`` to run ops in this process.

Run one op by hand: ``python tests/opinfo_support.py --op nn.functional.conv2d``.
"""

from __future__ import annotations

import json
import math
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Optional

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

DEVICE = "neuron"
CALL_SEED = 0  # torch.manual_seed before each side's call
DEFAULT_SAMPLES = 2
DEFAULT_TIMEOUT = 300.0

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


@dataclass
class OpResult:
    """The outcome of one OpInfo on the neuron device."""

    op_id: str
    status: str  # passed | failed | skipped | excluded | crashed | timeout | error
    message: str = ""  # first failure (one paragraph), or the skip reason
    samples: int = 0  # samples run
    checks: dict[str, int] = field(default_factory=dict)  # checks that ran, by kind
    failures: list[str] = field(default_factory=list)  # every failing check, one line each
    seconds: float = 0.0

    @property
    def first_line(self) -> str:
        return self.message.strip().splitlines()[0] if self.message.strip() else ""


# ---------------------------------------------------------------------------------
# The op database
# ---------------------------------------------------------------------------------


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
    raw = os.environ.get("NEURON_OPINFO_SAMPLES", "").strip().lower()
    if not raw:
        return DEFAULT_SAMPLES
    if raw in ("all", "none", "0"):
        return None
    return max(1, int(raw))


def timeout_from_env() -> float:
    return float(os.environ.get("NEURON_OPINFO_TIMEOUT", DEFAULT_TIMEOUT))


# ---------------------------------------------------------------------------------
# Moving samples between devices
# ---------------------------------------------------------------------------------


def _is_dense(t: Any) -> bool:
    from torch._prims_common import is_non_overlapping_and_dense_or_false

    return bool(is_non_overlapping_and_dense_or_false(t))


def _copy_tensor(t: Any, device: str, keep_grad: bool) -> Any:
    """A fresh leaf copy of ``t`` on ``device`` with the same sizes, strides and offset."""
    import torch

    requires_grad = keep_grad and t.requires_grad
    src = t.detach()
    if src.layout != torch.strided or src.numel() == 0 or _is_dense(src):
        out = src.to(device, copy=True)  # preserve_format keeps dense strides
    else:
        # Overlapping or gappy views (expand, slicing with steps): copy the whole
        # storage and rebuild the same view over it.
        itemsize = src.element_size()
        nbytes = src.untyped_storage().nbytes()
        if nbytes % itemsize:
            out = src.to(device, copy=True)
        else:
            base = src.new_empty(0).set_(src.untyped_storage(), 0, (nbytes // itemsize,), (1,))
            out = base.to(device, copy=True).as_strided(src.size(), src.stride(), src.storage_offset())
    if requires_grad:
        out.requires_grad_(True)
    return out


def _move(value: Any, device: str, keep_grad: bool, placement: Optional[Iterator[str]] = None) -> Any:
    """Copies every tensor in a (nested) value onto ``device``; ``"cpu"`` devices become ``device``.

    ``placement`` (one device type per tensor, in walk order) overrides the target
    of each tensor: a tensor whose template is not on ``device`` stays where it is.
    """
    import torch

    if isinstance(value, torch.Tensor):
        target = device
        if placement is not None:
            where = next(placement)
            if where != torch.device(device).type:
                target = str(value.device)
        return _copy_tensor(value, target, keep_grad)
    if isinstance(value, torch.device):
        return torch.device(device) if value.type == "cpu" else value
    if isinstance(value, str) and value == "cpu":
        return device
    if isinstance(value, torch.Generator):
        gen = torch.Generator(device=device)
        gen.set_state(value.get_state())
        return gen
    if isinstance(value, list):
        return [_move(v, device, keep_grad, placement) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_move(v, device, keep_grad, placement) for v in value)
    if isinstance(value, dict):
        return {k: _move(v, device, keep_grad, placement) for k, v in value.items()}
    return value


def _tensor_devices(value: Any) -> list[str]:
    """The device type of every tensor in a (nested) value, in ``_move``'s walk order."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value.device.type]
    if isinstance(value, list) or (isinstance(value, tuple) and not hasattr(value, "_fields")):
        return [d for v in value for d in _tensor_devices(v)]
    if isinstance(value, dict):
        return [d for v in value.values() for d in _tensor_devices(v)]
    return []


@dataclass
class Call:
    input: Any
    args: tuple
    kwargs: dict


def move_sample(sample: Any, device: str, keep_grad: bool = True,
                placement: Optional[list[str]] = None) -> Call:
    """Fresh copies of a sample's tensors on ``device`` (see ``_move``)."""
    it = iter(placement) if placement is not None else None
    return Call(
        _move(sample.input, device, keep_grad, it),
        _move(sample.args, device, keep_grad, it),
        _move(sample.kwargs, device, keep_grad, it),
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
                got = _tensor_devices((tmpl.input, tmpl.args, tmpl.kwargs))
                if len(got) == len(_tensor_devices((sample.input, sample.args, sample.kwargs))):
                    where = got
            except Exception:
                dev_it = None
        yield sample, where


def _touches_device(call: Call) -> bool:
    """Whether a moved call involves the device at all (a device tensor or a device argument)."""
    import torch

    kind = torch.device(DEVICE).type
    for v in _flatten((call.input, call.args, call.kwargs)):
        if isinstance(v, torch.Tensor) and v.device.type == kind:
            return True
        if isinstance(v, torch.device) and v.type == kind:
            return True
        if isinstance(v, str) and v.split(":")[0] == kind:
            return True
    return False


def _flatten(value: Any) -> Iterator[Any]:
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from _flatten(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _flatten(v)
    else:
        yield value


# ---------------------------------------------------------------------------------
# Comparing results
# ---------------------------------------------------------------------------------


class Mismatch(AssertionError):
    pass


def compare(expected: Any, actual: Any, *, metadata_only: bool = False, path: str = "result") -> None:
    """Checks a neuron result against the CPU result; raises Mismatch on a difference."""
    import torch

    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            raise Mismatch(f"{path}: expected a tensor, got {type(actual).__name__}: {actual!r}"[:500])
        if expected.device.type == "cpu" and actual.device.type != DEVICE:
            raise Mismatch(f"{path}: result is on {actual.device}, expected the {DEVICE} device")
        if expected.requires_grad != actual.requires_grad:
            raise Mismatch(
                f"{path}: requires_grad={actual.requires_grad} on {DEVICE}, {expected.requires_grad} on cpu"
            )
        if expected.layout != actual.layout:
            raise Mismatch(f"{path}: layout {actual.layout} on {DEVICE}, {expected.layout} on cpu")
        if expected.dtype != actual.dtype or expected.shape != actual.shape:
            raise Mismatch(
                f"{path}: {actual.dtype}{list(actual.shape)} on {DEVICE}, "
                f"{expected.dtype}{list(expected.shape)} on cpu"
            )
        if metadata_only:
            if expected.layout == torch.strided and expected.stride() != actual.stride():
                raise Mismatch(f"{path}: strides {actual.stride()} on {DEVICE}, {expected.stride()} on cpu")
            return
        try:
            torch.testing.assert_close(
                actual.detach().cpu(), expected.detach(), equal_nan=True, check_device=False
            )
        except AssertionError as e:
            # One line: "Tensor-likes are not close!; Mismatched elements: ...; Greatest ..."
            text = "; ".join(line.strip() for line in str(e).splitlines() if line.strip())
            raise Mismatch(f"{path}: {text}") from None
        return
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            raise Mismatch(
                f"{path}: expected a {type(expected).__name__} of {len(expected)}, got "
                f"{type(actual).__name__}{'' if not isinstance(actual, (list, tuple)) else ' of ' + str(len(actual))}"
            )
        for i, (e, a) in enumerate(zip(expected, actual)):
            compare(e, a, metadata_only=metadata_only, path=f"{path}[{i}]")
        return
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or set(actual) != set(expected):
            raise Mismatch(f"{path}: expected a dict with keys {sorted(expected)}, got {actual!r}"[:500])
        for k in expected:
            compare(expected[k], actual[k], metadata_only=metadata_only, path=f"{path}[{k!r}]")
        return
    if isinstance(actual, torch.Tensor):
        raise Mismatch(f"{path}: expected {type(expected).__name__} {expected!r}, got a tensor")
    if isinstance(expected, float) and isinstance(actual, (float, int)):
        if math.isnan(expected) and math.isnan(actual):
            return
        if metadata_only:
            return
        if not math.isclose(expected, actual, rel_tol=1.3e-6, abs_tol=1e-5):
            raise Mismatch(f"{path}: {actual!r} on {DEVICE}, {expected!r} on cpu")
        return
    if expected != actual:
        raise Mismatch(f"{path}: {actual!r} on {DEVICE}, {expected!r} on cpu"[:500])


def _grad_roots(out: Any) -> list[Any]:
    import torch

    return [
        t
        for t in _flatten(out)
        if isinstance(t, torch.Tensor) and t.requires_grad and (t.is_floating_point() or t.is_complex())
    ]


def _loss(roots: list[Any]) -> Any:
    total = None
    for t in roots:
        s = t.sum()
        if s.is_complex():
            s = s.real + s.imag
        total = s if total is None else total + s
    return total


def _leaves(call: Call) -> list[Any]:
    import torch

    return [
        t
        for t in _flatten((call.input, call.args, call.kwargs))
        if isinstance(t, torch.Tensor) and t.requires_grad
    ]


# ---------------------------------------------------------------------------------
# Checking one op
# ---------------------------------------------------------------------------------


def _describe(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _summary(sample: Any) -> str:
    try:
        return sample.summary()
    except Exception:  # pragma: no cover - best effort
        return repr(sample)[:300]


def _run_pair(cpu_call, dev_call) -> tuple:
    """Runs the CPU reference, then the device call.

    Returns ``(cpu_result, cpu_exception, device_result, device_exception, device_traceback)``.
    """
    cpu_out = dev_out = cpu_exc = dev_exc = None
    dev_tb = ""
    try:
        cpu_out = cpu_call()
    except Exception as e:
        cpu_exc = e
    try:
        dev_out = dev_call()
    except Exception as e:
        dev_exc = e
        dev_tb = traceback.format_exc()
    return cpu_out, cpu_exc, dev_out, dev_exc, dev_tb


def _seeded(fn, *args, **kwargs):
    import torch

    torch.manual_seed(CALL_SEED)
    return fn(*args, **kwargs)


def check_op(op: Any, max_samples: Optional[int]) -> OpResult:
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
            return OpResult(key, "error", f"harness: sample_inputs raised {_describe(e)}",
                            seconds=time.perf_counter() - start)
        index += 1
        # ---- forward -----------------------------------------------------------
        try:
            dev = move_sample(sample, DEVICE, placement=where)
        except Exception as e:
            run += 1
            fail("move-inputs", index, sample, f"moving the sample to {DEVICE} raised {_describe(e)}")
            continue
        if not _touches_device(dev):
            # e.g. arange(2): no tensor and no device argument, so both runs are CPU runs.
            count("host_only")
            continue
        run += 1
        cpu = move_sample(sample, "cpu")
        cpu_out, cpu_exc, dev_out, dev_exc, dev_tb = _run_pair(
            lambda: _seeded(op, cpu.input, *cpu.args, **cpu.kwargs),
            lambda: _seeded(op, dev.input, *dev.args, **dev.kwargs),
        )
        if cpu_exc is not None:
            count("forward_cpu_raised")
            if dev_exc is None:
                fail("forward", index, sample,
                     f"the CPU reference raised {_describe(cpu_exc)}, but {DEVICE} did not raise")
            continue
        if dev_exc is not None:
            fail("forward", index, sample, _describe(dev_exc) + "\n" + dev_tb[-3000:])
            continue
        count("forward")
        try:
            compare(cpu_out, dev_out, metadata_only=metadata_only)
        except Mismatch as e:
            fail("forward", index, sample, str(e))
            continue
        except Exception as e:  # reading the neuron result raised
            fail("forward", index, sample, f"reading the result raised {_describe(e)}")
            continue

        # ---- backward ----------------------------------------------------------
        if op.supports_autograd:
            try:
                cpu_roots = _grad_roots(sample.output_process_fn_grad(cpu_out))
                cpu_leaves = _leaves(cpu)
            except Exception:
                cpu_roots = []
            if cpu_roots and cpu_leaves:
                try:
                    dev_roots = _grad_roots(sample.output_process_fn_grad(dev_out))
                    dev_leaves = _leaves(dev)
                except Exception as e:
                    fail("backward", index, sample, f"preparing the backward raised {_describe(e)}")
                    continue
                if len(dev_roots) != len(cpu_roots) or len(dev_leaves) != len(cpu_leaves):
                    fail("backward", index, sample,
                         f"{len(dev_roots)} differentiable outputs / {len(dev_leaves)} leaves on {DEVICE}, "
                         f"{len(cpu_roots)} / {len(cpu_leaves)} on cpu")
                    continue
                cpu_grads, cpu_exc, dev_grads, dev_exc, dev_tb = _run_pair(
                    lambda: _seeded(torch.autograd.grad, _loss(cpu_roots), cpu_leaves, allow_unused=True),
                    lambda: _seeded(torch.autograd.grad, _loss(dev_roots), dev_leaves, allow_unused=True),
                )
                count("backward")
                if cpu_exc is not None:
                    count("backward_cpu_raised")
                    if dev_exc is None:
                        fail("backward", index, sample,
                             f"the CPU backward raised {_describe(cpu_exc)}, but {DEVICE} did not raise")
                        continue
                elif dev_exc is not None:
                    fail("backward", index, sample, _describe(dev_exc) + "\n" + dev_tb[-3000:])
                    continue
                else:
                    try:
                        compare(list(cpu_grads), list(dev_grads), metadata_only=metadata_only, path="grad")
                    except Mismatch as e:
                        fail("backward", index, sample, str(e))
                        continue
                    except Exception as e:
                        fail("backward", index, sample, f"reading the gradient raised {_describe(e)}")
                        continue

        # ---- in-place variant ----------------------------------------------------
        if inplace is not None:
            cpu = move_sample(sample, "cpu", keep_grad=False)
            try:
                dev = move_sample(sample, DEVICE, keep_grad=False, placement=where)
            except Exception as e:
                fail("inplace", index, sample, f"moving the sample to {DEVICE} raised {_describe(e)}")
                continue
            try:
                cpu_ret = _seeded(inplace, cpu.input, *cpu.args, **cpu.kwargs)
            except Exception:
                count("inplace_cpu_raised")
                continue  # not a valid in-place sample (e.g. the input broadcasts)
            count("inplace")
            try:
                dev_ret = _seeded(inplace, dev.input, *dev.args, **dev.kwargs)
            except Exception as e:
                fail("inplace", index, sample, _describe(e) + "\n" + traceback.format_exc()[-3000:])
                continue
            try:
                if cpu_ret is cpu.input and dev_ret is not dev.input:
                    raise Mismatch(f"the in-place call returned a new object on {DEVICE}, not its input")
                compare(cpu.input, dev.input, metadata_only=metadata_only, path="mutated input")
                compare(cpu_ret, dev_ret, metadata_only=metadata_only, path="returned value")
            except Mismatch as e:
                fail("inplace", index, sample, str(e))
            except Exception as e:
                fail("inplace", index, sample, f"reading the result raised {_describe(e)}")

    seconds = time.perf_counter() - start
    if index < 0:
        return OpResult(key, "skipped", "no float32 samples", 0, checks, [], seconds)
    if not failures and not any(k != "host_only" for k in checks):
        return OpResult(key, "skipped", "no sample involves the device", run, checks, [], seconds)
    if failures:
        return OpResult(key, "failed", "\n".join(details), run, checks, failures, seconds)
    return OpResult(key, "passed", "", run, checks, [], seconds)


def run_in_process(key: str, max_samples: Optional[int]) -> OpResult:
    if key in EXCLUSIONS:
        return OpResult(key, "excluded", EXCLUSIONS[key])
    import torch

    import neuron_lab  # noqa: F401  (registers the device)

    prev_dtype = torch.get_default_dtype()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return check_op(all_ops()[key], max_samples)
        except Exception as e:
            return OpResult(key, "error", "harness error: " + _describe(e) + "\n" + traceback.format_exc())
        finally:
            torch.set_default_dtype(prev_dtype)


# ---------------------------------------------------------------------------------
# Crash-isolating worker
# ---------------------------------------------------------------------------------


def _worker_main() -> None:
    # The protocol goes over the original stdout; anything the ops print goes to stderr.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import torch  # noqa: F401  (before neuron_lab: importing neuron_lab first currently fails)

    import neuron_lab  # noqa: F401

    all_ops()
    proto.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        req = json.loads(line)
        print(f"=== op {req['op']}", file=sys.stderr, flush=True)
        res = run_in_process(req["op"], req["samples"])
        proto.write(json.dumps(asdict(res)) + "\n")


class OpRunner:
    """Runs ops one at a time in a worker subprocess, surviving crashes and hangs."""

    def __init__(self, max_samples: Optional[int], timeout: float = DEFAULT_TIMEOUT,
                 startup_timeout: float = 300.0):
        self.max_samples = max_samples
        self.timeout = timeout
        self.startup_timeout = startup_timeout
        self.proc: Optional[subprocess.Popen] = None
        self.log = None
        self.crashes = 0

    def _start(self) -> None:
        self.log = tempfile.TemporaryFile(mode="w+b")
        env = dict(os.environ)
        env["PYTHONPATH"] = REPO_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("PYTHONFAULTHANDLER", "1")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env, cwd=REPO_ROOT,
        )
        line = self._readline(self.startup_timeout)
        if line is None or not json.loads(line).get("ready"):
            tail = self._log_tail(0)
            self.close()
            raise RuntimeError(f"the OpInfo worker did not start:\n{tail}")

    def _readline(self, timeout: float) -> Optional[str]:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        buf = b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None  # EOF: the worker died
            buf += chunk
            if buf.endswith(b"\n"):
                return buf.decode()

    def _log_tail(self, since: int, limit: int = 4000) -> str:
        if self.log is None:
            return ""
        self.log.flush()
        self.log.seek(since)
        text = self.log.read().decode(errors="replace")
        self.log.seek(0, os.SEEK_END)
        return text[-limit:]

    def run(self, key: str) -> OpResult:
        if key in EXCLUSIONS:
            return OpResult(key, "excluded", EXCLUSIONS[key])
        if self.proc is None:
            self._start()
        assert self.proc is not None and self.proc.stdin is not None and self.log is not None
        self.log.seek(0, os.SEEK_END)
        since = self.log.tell()
        start = time.perf_counter()
        try:
            self.proc.stdin.write((json.dumps({"op": key, "samples": self.max_samples}) + "\n").encode())
            self.proc.stdin.flush()
            line = self._readline(self.timeout)
        except TimeoutError:
            tail = self._log_tail(since)
            self.close(kill=True)
            return OpResult(key, "timeout", f"no result after {self.timeout:.0f}s; worker killed\n{tail}",
                            seconds=time.perf_counter() - start)
        except BrokenPipeError:
            line = None
        if line is None:
            rc = self.proc.wait()
            tail = self._log_tail(since)
            self.close()
            self.crashes += 1
            if rc < 0:
                try:
                    how = f"killed by {signal.Signals(-rc).name}"
                except ValueError:
                    how = f"killed by signal {-rc}"
            else:
                how = f"exited with status {rc}"
            return OpResult(key, "crashed", f"the worker process {how}\n{tail}",
                            seconds=time.perf_counter() - start)
        data = json.loads(line)
        return OpResult(**data)

    def close(self, kill: bool = False) -> None:
        if self.proc is not None:
            try:
                if kill:
                    self.proc.kill()
                elif self.proc.stdin:
                    self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except Exception:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        if self.log is not None:
            self.log.close()
            self.log = None


def make_runner(max_samples: Optional[int], timeout: Optional[float] = None):
    """An OpRunner, or an in-process runner when ``NEURON_OPINFO_INPROCESS=1``."""
    if os.environ.get("NEURON_OPINFO_INPROCESS") == "1":

        class _InProcess:
            def run(self, key: str) -> OpResult:
                return run_in_process(key, max_samples)

            def close(self, kill: bool = False) -> None:
                pass

        return _InProcess()
    return OpRunner(max_samples, timeout if timeout is not None else timeout_from_env())


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        _worker_main()
    else:
        import argparse

        parser = argparse.ArgumentParser(description="Check OpInfo ops on the neuron device, in process.")
        parser.add_argument("--op", action="append", required=True, help="test id (repeatable)")
        parser.add_argument("--samples", type=int, default=0, help="samples per op (0: all)")
        ns = parser.parse_args()
        for key in ns.op:
            r = run_in_process(key, ns.samples or None)
            print(f"{r.op_id}: {r.status} ({r.samples} samples, {r.seconds:.1f}s)")
            if r.message:
                print(r.message)
