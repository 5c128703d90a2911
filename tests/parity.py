"""Moving test inputs to the neuron device and comparing results with the CPU's.

Shared by the conformance suites driven by PyTorch's own databases (OpInfo's
``op_db``, ``module_db``, ``optim_db``): each runs the same thing on CPU copies and on
neuron copies of its inputs and checks the neuron results against the CPU's with
:func:`compare`.
"""

from __future__ import annotations

import math
import traceback
from typing import Any, Callable, Iterator, Optional

DEVICE = "neuron"
CALL_SEED = 0  # torch.manual_seed before each side's call


def bits(t: Any) -> Any:
    """``t`` on the CPU with its values as integers of the same width (floating and complex
    dtypes), so that NaN payloads and the sign of zero count; other dtypes as they are."""
    import torch

    t = t.detach().cpu().resolve_conj().resolve_neg()
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.is_floating_point():
        width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
        return t.contiguous().view(width)
    return t


def special_floats(dtype: Any, n: int) -> Any:
    """n values of dtype, among them -inf, +inf, NaNs of both signs, -0.0, subnormals and
    the extreme finite values, at positions that fall in vector blocks and in the tail."""
    import torch

    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g, dtype=torch.float64).to(dtype)
    info = torch.finfo(dtype)
    specials = [float("-inf"), float("inf"), float("nan"), -float("nan"), -0.0, info.tiny / 4, -info.tiny / 4,
                info.max, info.min, float("-inf")]
    for i, v in enumerate(specials):
        if n:
            x[(i * 7) % n] = v
    return x


def same_bits(actual: Any, expected: Any) -> bool:
    """Whether two tensors, on any devices, have the same dtype, shape and bits (NaN payloads
    and signed zeros included): the device's promise, checked on the CPU. The one bit-equality
    check of the tests (``bitwise_support`` reports how results differ, NaN matching NaN)."""
    import torch

    return (actual.dtype == expected.dtype and actual.shape == expected.shape
            and torch.equal(bits(actual), bits(expected)))


def is_dense(t: Any) -> bool:
    from torch._prims_common import is_non_overlapping_and_dense_or_false

    return bool(is_non_overlapping_and_dense_or_false(t))


def copy_tensor(t: Any, device: str, keep_grad: bool) -> Any:
    """A fresh leaf copy of ``t`` on ``device`` with the same sizes, strides and offset."""
    import torch

    requires_grad = keep_grad and t.requires_grad
    src = t.detach()
    if src.layout != torch.strided or src.numel() == 0 or is_dense(src):
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


def move(value: Any, device: str, keep_grad: bool = True, placement: Optional[Iterator[str]] = None) -> Any:
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
        return copy_tensor(value, target, keep_grad)
    if isinstance(value, torch.device):
        return torch.device(device) if value.type == "cpu" else value
    if isinstance(value, str) and value == "cpu":
        return device
    if isinstance(value, torch.Generator):
        gen = torch.Generator(device=device)
        gen.set_state(value.get_state())
        return gen
    if isinstance(value, list):
        return [move(v, device, keep_grad, placement) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(move(v, device, keep_grad, placement) for v in value)
    if isinstance(value, dict):
        return {k: move(v, device, keep_grad, placement) for k, v in value.items()}
    return value


def tensor_devices(value: Any) -> list[str]:
    """The device type of every tensor in a (nested) value, in ``move``'s walk order."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value.device.type]
    if isinstance(value, list) or (isinstance(value, tuple) and not hasattr(value, "_fields")):
        return [d for v in value for d in tensor_devices(v)]
    if isinstance(value, dict):
        return [d for v in value.values() for d in tensor_devices(v)]
    return []


def flatten(value: Any) -> Iterator[Any]:
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from flatten(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from flatten(v)
    else:
        yield value


# ---------------------------------------------------------------------------------
# Comparing results
# ---------------------------------------------------------------------------------


class Mismatch(AssertionError):
    pass


def compare(expected: Any, actual: Any, *, metadata_only: bool = False, path: str = "result",
            exact: bool = False, check_device: bool = True) -> None:
    """Checks a neuron result against the CPU result; raises Mismatch on a difference.

    Tensors are compared with ``torch.testing.assert_close`` (its default tolerances
    for the dtype), or bit for bit with ``exact``. A CPU tensor's counterpart must be a
    neuron tensor, unless ``check_device`` is False (state that stays on the host on
    every accelerator, such as an optimizer's step counts)."""
    import torch

    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            raise Mismatch(f"{path}: expected a tensor, got {type(actual).__name__}: {actual!r}"[:500])
        if check_device and expected.device.type == "cpu" and actual.device.type != DEVICE:
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
        tolerance = {"rtol": 0.0, "atol": 0.0} if exact else {}
        try:
            torch.testing.assert_close(
                actual.detach().cpu(), expected.detach(), equal_nan=True, check_device=False, **tolerance
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
            compare(e, a, metadata_only=metadata_only, path=f"{path}[{i}]", exact=exact, check_device=check_device)
        return
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or set(actual) != set(expected):
            raise Mismatch(f"{path}: expected a dict with keys {sorted(expected)}, got {actual!r}"[:500])
        for k in expected:
            compare(expected[k], actual[k], metadata_only=metadata_only, path=f"{path}[{k!r}]", exact=exact,
                    check_device=check_device)
        return
    if isinstance(actual, torch.Tensor):
        raise Mismatch(f"{path}: expected {type(expected).__name__} {expected!r}, got a tensor")
    if isinstance(expected, float) and isinstance(actual, (float, int)):
        if math.isnan(expected) and math.isnan(actual):
            return
        if metadata_only:
            return
        close = expected == actual if exact else math.isclose(expected, actual, rel_tol=1.3e-6, abs_tol=1e-5)
        if not close:
            raise Mismatch(f"{path}: {actual!r} on {DEVICE}, {expected!r} on cpu")
        return
    if expected != actual:
        raise Mismatch(f"{path}: {actual!r} on {DEVICE}, {expected!r} on cpu"[:500])


def grad_roots(out: Any) -> list[Any]:
    """The floating (or complex) tensors of a result that require grad."""
    import torch

    return [
        t
        for t in flatten(out)
        if isinstance(t, torch.Tensor) and t.requires_grad and (t.is_floating_point() or t.is_complex())
    ]


def total_loss(roots: list[Any]) -> Any:
    """The sum of every element of ``roots`` (complex: real plus imaginary part)."""
    total = None
    for t in roots:
        s = t.sum()
        if s.is_complex():
            s = s.real + s.imag
        total = s if total is None else total + s
    return total


def describe(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def run_pair(cpu_call: Callable[[], Any], dev_call: Callable[[], Any]) -> tuple:
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


def seeded(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` right after ``torch.manual_seed(CALL_SEED)`` (seeds neuron too)."""
    import torch

    torch.manual_seed(CALL_SEED)
    return fn(*args, **kwargs)
