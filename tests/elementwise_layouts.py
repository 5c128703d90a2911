"""Random elementwise calls whose operands are dense with other strides on their size-1
dims, and their check against the CPU: shared by tests/fastpath/test_host_kernels.py (CI-sized) and
scripts/sweep_elementwise_layouts.py (thousands of calls)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import torch

from neuron_lab.device import trace
from parity import same_bits

ARITH = {"add": torch.add, "sub": torch.sub, "mul": torch.mul}


def with_unit_strides(t: torch.Tensor, strides: dict[int, int]) -> torch.Tensor:
    """t's elements in the same memory, its size-1 dims given other strides: dense and
    is_contiguous(), but not row-major (a one-token query transposed to [1, heads, 1, dim]
    has stride heads * dim on its length-1 dim)."""
    new = list(t.stride())
    for dim, stride in strides.items():
        assert t.shape[dim] == 1
        new[dim] = stride
    return t.as_strided(t.shape, new)


def same_layout_on_device(t: object) -> object:
    """t on the device with t's strides (a number stays a number)."""
    if not isinstance(t, torch.Tensor):
        return t
    on_device = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="neuron").copy_(t)
    assert on_device.stride() == t.stride()
    return on_device


def elementwise_sweep_case(rng: random.Random) -> tuple[str, Callable, list]:
    """A random elementwise call of small operands: dense, some size-1 dims given other
    strides, the second a same-shape operand, a trailing block, one element per run of
    trailing dims ([rows, 1]), one element of any rank (0-dim included) or a Python number, in
    either order; the first sometimes partial too."""

    def dense(shape, dtype):
        if dtype == torch.bool:
            t = torch.rand(shape) < 0.5
        elif dtype.is_floating_point:
            t = (torch.randn(shape) * 3).to(dtype)
        else:
            t = torch.randint(-50, 50, shape, dtype=dtype)
        odd = {d: rng.choice([1, 2, 3, 8, 32, 100]) for d, n in enumerate(shape) if n == 1 and rng.random() < 0.7}
        return with_unit_strides(t, odd)

    def partner(shape, dtype):
        kind = rng.choice(["same", "block", "one", "rows"])
        if kind == "same":
            return dense(shape, dtype)
        if kind == "block":
            return dense([1] * rng.randint(0, 1) + shape[rng.randint(0, len(shape)):], dtype)
        if kind == "rows":  # trailing dims of one ([rows, 1] against [rows, cols]), leading ones maybe
            keep = rng.randint(0, len(shape))
            lead = rng.randint(0, keep)
            return dense([1] * lead + shape[lead:keep] + [1] * (len(shape) - keep), dtype)
        return dense([1] * rng.randint(0, 3), dtype)

    shape = [rng.choice([1, 1, 2, 3, 4, 8]) for _ in range(rng.randint(1, 5))]
    op = rng.choice(["add", "sub", "mul", "where", "and", "or"])
    if op == "where":
        dtype = rng.choice([torch.float32, torch.int64, torch.bool])
        args = [dense(shape, torch.bool), partner(shape, dtype), partner(shape, dtype)]
        if rng.random() < 0.3:
            args[0], args[1] = partner(shape, torch.bool), dense(shape, dtype)
        return op, torch.where, args
    if op in ("and", "or"):
        dtype = rng.choice([torch.bool, torch.int32, torch.int64])
        fn = torch.bitwise_and if op == "and" else torch.bitwise_or
    else:
        dtype = rng.choice([torch.float32, torch.float64, torch.int32, torch.int64])
        fn = ARITH[op]
    # & and | of an integer and a bool: ATen promotes the bool
    other_dtype = torch.bool if op in ("and", "or") and dtype != torch.bool and rng.random() < 0.3 else dtype
    other = partner(shape, other_dtype) if rng.random() < 0.8 else (2.5 if dtype.is_floating_point else 3)
    # mostly an operand of the result's shape; sometimes two partial ones ([rows, 1] and [cols])
    first = dense(shape, dtype) if rng.random() < 0.8 else partner(shape, dtype)
    args = [first, other]
    if rng.random() < 0.5:
        args.reverse()
    return op, fn, args


@dataclass
class Outcome:
    kernel_ran: bool        # a host kernel took the call (device_counters' host_kernel_ops)
    problem: Optional[str]  # what differs from the CPU, or None


def check_elementwise_case(op: str, fn: Callable, args: list) -> Outcome:
    """Runs fn on the CPU and on the device (in the current mode): dtype, shape, strides and
    bits must be equal. Shapes that do not broadcast raise on both: no problem."""
    try:
        expected = fn(*args)
    except RuntimeError:
        return Outcome(False, None)
    on_device = [same_layout_on_device(a) for a in args]
    torch.neuron.synchronize()
    before = trace.device_counters()["host_kernel_ops"]
    got = fn(*on_device).cpu()
    ran = trace.device_counters()["host_kernel_ops"] > before
    layouts = [(tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a for a in args]
    if got.dtype != expected.dtype or got.shape != expected.shape:
        return Outcome(ran, f"{op} {layouts}: {got.dtype} {tuple(got.shape)} != {expected.dtype} {tuple(expected.shape)}")
    if got.stride() != expected.stride():
        return Outcome(ran, f"{op} {layouts}: strides {got.stride()} != the CPU's {expected.stride()}")
    if not same_bits(got, expected):
        return Outcome(ran, f"{op} {layouts}: values differ from the CPU's")
    return Outcome(ran, None)


def check_calls_equal_the_cpu(sources, calls: dict, same) -> None:
    """Each call on a device copy of each source (its layout kept), twice (at once or recorded,
    then again), against the call on the CPU: dtype, shape, strides, and same(got, expected)."""
    for source in sources:
        on_device = same_layout_on_device(source) if source.numel() and not source.is_conj() else source.to("neuron")
        for name, call in calls.items():
            expected = call(source)
            for _ in range(2):
                got = call(on_device).cpu()
                assert got.dtype == expected.dtype and got.shape == expected.shape, (name, source.shape)
                assert got.stride() == expected.stride(), (name, source.shape, source.stride(), got.stride())
                assert same(got, expected), (name, source.dtype, source.shape)
