"""Every OpInfo error input that fails on the CPU fails on neuron too, and the process survives.

PyTorch's op_db lists, per op, inputs that must fail (``op.error_inputs``): wrong
shapes, out-of-range indices, out= tensors that overlap an input, bad dtypes.
Each runs on neuron with the same storage sharing as on the CPU. Where the CPU
raises, neuron must raise an exception too (the type may differ where PyTorch
gives PrivateUse1 a generic kernel: ``narrow_copy`` raises IndexError instead of
RuntimeError for a bad dim); an input the CPU accepts is device-specific and is
skipped, as are inputs whose error is about mixing devices.
"""

from __future__ import annotations

import contextlib
import unittest.mock
import warnings

import pytest
import torch
from torch.testing._internal import common_utils
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.opinfo import core as opinfo_core
from torch.utils._pytree import tree_map

OPS = [op for op in op_db if op.error_inputs_func is not None]


class SharingMover:
    """Moves CPU tensors to neuron keeping which of them share storage (views stay views)."""

    def __init__(self) -> None:
        self.bases: dict[tuple[int, torch.dtype], torch.Tensor] = {}

    def __call__(self, x):
        if not isinstance(x, torch.Tensor) or x.device.type != "cpu":
            return x
        key = (x.untyped_storage().data_ptr(), x.dtype)
        if key not in self.bases:
            flat = torch.empty(0, dtype=x.dtype).set_(x.untyped_storage())
            self.bases[key] = flat.to("neuron")
        return torch.as_strided(self.bases[key], x.size(), x.stride(), x.storage_offset())


@contextlib.contextmanager
def without_test_lookup():
    """OpInfo's input iterators look for the running unittest test on the stack (to seed by
    its name); under pytest that costs 0.1 s per iterator. They seed with the default."""
    with unittest.mock.patch.object(common_utils, "extract_test_fn", lambda: None), \
            unittest.mock.patch.object(opinfo_core, "extract_test_fn", lambda: None):
        yield


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name + (f".{op.variant_test_name}" if op.variant_test_name else ""))
def test_error_inputs_raise_like_the_cpu(op) -> None:
    with without_test_lookup():
        error_inputs = list(op.error_inputs("cpu"))
    for error_input in error_inputs:
        if "device" in error_input.error_regex:
            continue
        sample = error_input.sample_input
        move = SharingMover()
        args = tree_map(move, sample.args)
        kwargs = tree_map(move, sample.kwargs)
        inp = move(sample.input)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                op(sample.input, *sample.args, **sample.kwargs)
                continue  # the CPU accepts it: an error input for another device
            except Exception:
                pass
            with pytest.raises(Exception) as raised:
                op(inp, *args, **kwargs)
                # In the asynchronous modes a kernel's error is raised at the next wait.
                torch.neuron.synchronize()
        assert str(raised.value), "the error must say what is wrong"
    assert torch.ones(2, device="neuron").sum().item() == 2.0  # the device still works


# ---- errors raise at the op, in every mode -------------------------------------------------
#
# In the asynchronous modes an op is recorded with its results' metadata from its meta
# kernel and runs later. A check of the CPU kernel that depends only on the call's
# signature (shapes, dtypes, aliasing, argument values) must still raise at the op, as
# CUDA's host code raises it: where the meta kernel misses it, the runtime runs the
# first call of each signature at once (``ops_checked_at_first_call``). Only checks of
# tensor values may raise at the next wait, as CUDA's device-side asserts do.

import re  # noqa: E402

import neuron_lab  # noqa: E402
import neuron_lab.adaptive_eager as ae  # noqa: E402
from neuron_lab.adaptive_eager._native import native  # noqa: E402

# Error inputs whose check reads tensor values, by (OpInfo name, error regex): they raise
# at the next wait in the asynchronous modes. One place; each entry must still be one.
VALUE_CHECKS: dict[tuple[str, str], str] = {
    ("gather", "index 23 is out of bounds for dimension"): "an index tensor's values",
    ("scatter", "index 34 is out of bounds for dimension 0 with size 3"): "an index tensor's values",
    ("scatter_add", "index 34 is out of bounds for dimension 0 with size 3"): "an index tensor's values",
}

# Error inputs from PyTorch's device-generic tests that OpInfo's error_inputs lack
# (nn/test_pooling): (name, function of the device, error regex).
EXTRA_ERROR_CASES = [
    ("fractional_max_pool2d", lambda d: torch.nn.functional.fractional_max_pool2d(
        torch.randn(1, 1, 8, 8, device=d), 2, output_size=4, _random_samples=torch.rand(1, 1, 3, device=d)),
     r"_random_samples\.size\(2\)"),
    ("fractional_max_pool2d", lambda d: torch.nn.functional.fractional_max_pool2d(
        torch.randn(2, 1, 8, 8, device=d), 2, output_size=4, _random_samples=torch.rand(1, 1, 2, device=d)),
     r"_random_samples\.size\(0\)"),
    ("fractional_max_pool3d", lambda d: torch.nn.functional.fractional_max_pool3d(
        torch.randn(1, 1, 8, 8, 8, device=d), 2, output_size=4, _random_samples=torch.rand(1, 1, 2, device=d)),
     r"_random_samples\.size\(2\)"),
]


_ERROR_CASES: list = []


def error_cases():
    """(case id, OpInfo name, function of the device, error regex) of every error input the CPU
    rejects; made once."""
    if not _ERROR_CASES:
        with without_test_lookup():
            _ERROR_CASES.extend(_make_error_cases())
    return _ERROR_CASES


def _make_error_cases():
    cases = []
    for op in OPS:
        for k, error_input in enumerate(op.error_inputs("cpu")):
            if "device" in error_input.error_regex:
                continue
            sample = error_input.sample_input

            def run(device, op=op, sample=sample):
                if device == "cpu":
                    return op(sample.input, *sample.args, **sample.kwargs)
                move = SharingMover()
                return op(move(sample.input), *tree_map(move, sample.args), **tree_map(move, sample.kwargs))

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    run("cpu")
                    continue  # the CPU accepts it: an error input for another device
                except Exception:
                    pass
            cases.append((f"{op.name}[{k}]", op.name, run, error_input.error_regex))
    for name, run, regex in EXTRA_ERROR_CASES:
        cases.append((name, name, run, regex))
    return cases


def raised_where(run) -> str:
    """"op" if the call raised, "wait" if the next synchronize did, "nowhere" otherwise; and
    the device must be usable, with nothing left to raise, afterwards."""
    ae.forget_repeats()  # record, rather than run ops at once because graphs never repeat
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            run("neuron")
        except Exception:
            where = "op"
        else:
            try:
                torch.neuron.synchronize()
                where = "nowhere"
            except Exception:
                where = "wait"
    torch.neuron.synchronize()  # an error is reported once
    return where


@pytest.mark.parametrize("mode", ["adaptive", "eager", "blocking"])
def test_errors_of_signatures_raise_at_the_op(mode: str) -> None:
    late = []
    cases = error_cases()
    with neuron_lab.mode(mode):
        for case, name, run, regex in cases:
            # Twice: a signature whose first call failed is never taken as checked.
            for attempt in range(2):
                where = raised_where(run)
                if where == "op" or ((name, regex) in VALUE_CHECKS and where == "wait"):
                    continue
                late.append(f"{case} (call {attempt + 1}): raised at {where}, expected at the op: {regex}")
    assert not late, "\n".join(late)
    stale = set(VALUE_CHECKS) - {(name, regex) for _, name, _, regex in cases}
    assert not stale, f"VALUE_CHECKS entries that match no error input (remove them): {sorted(stale)}"
    assert torch.ones(2, device="neuron").sum().item() == 2.0


def test_every_op_checked_at_first_call_is_still_needed() -> None:
    """Without its entry, some error input of the op raises late: the meta kernel still misses it."""
    listed = native.ops_checked_at_first_call()
    cases = error_cases()
    unneeded = []
    try:
        with neuron_lab.mode("eager"):
            for entry, why in listed.items():
                if not why.startswith("check:"):
                    continue  # a result's metadata: tests/ops/test_bitwise.py and test_recurrent_bits.py
                native.set_ops_checked_at_first_call({op: w for op, w in listed.items() if op != entry})
                short = entry.split("::")[1].rstrip("_")
                mine = [c for c in cases if re.sub(r"^nn\.functional\.", "", c[1]).rstrip("_") == short]
                if not any(raised_where(run) == "wait" for _, _, run, _ in mine):
                    unneeded.append(entry)
    finally:
        native.set_ops_checked_at_first_call(listed)
    assert not unneeded, f"ops_checked_at_first_call entries whose errors raise at the op anyway: {unneeded}"


@pytest.mark.parametrize("mode", ["adaptive", "eager"])
def test_a_checked_signature_does_not_hide_a_later_error(mode: str) -> None:
    """After a good call, a bad one that the meta signature cannot tell apart still raises
    at the op: a value that overflows the dtype, an out= that overlaps the input."""
    with neuron_lab.mode(mode):
        x = torch.zeros(4, device="neuron")
        mask = torch.tensor([True, False, True, False], device="neuron")
        for _ in range(3):
            ae.forget_repeats()
            x.masked_fill_(mask, 2.0)  # checked, then recorded
        with pytest.raises(RuntimeError, match="overflow"):
            x.masked_fill_(mask, 1e300)
        src = torch.arange(6.0, device="neuron")
        index = torch.tensor([0, 1, 2], device="neuron")
        for _ in range(3):
            ae.forget_repeats()
            torch.take(src, index, out=torch.empty(3, device="neuron"))
        with pytest.raises(RuntimeError, match="memory location"):
            torch.take(src, index, out=src[:3])
        torch.neuron.synchronize()
        assert x.cpu().tolist() == [2.0, 0.0, 2.0, 0.0]


# Random ops whose CPU kernel checks its distribution's parameters on the host, as CUDA's
# does: (name, call with good or bad parameters on a pending tensor of the device).
RANDOM_PARAMETER_CASES = {
    "uniform_": lambda x, bad: x.uniform_(3.0, -1.0) if bad else x.uniform_(0.0, 1.0),
    "normal_": lambda x, bad: x.normal_(0.0, -1.0) if bad else x.normal_(0.0, 1.0),
    "random_": lambda x, bad: x.random_(5, 2) if bad else x.random_(2, 5),
    "exponential_": lambda x, bad: x.exponential_(-1.0) if bad else x.exponential_(1.0),
    "bernoulli_": lambda x, bad: x.bernoulli_(1.5) if bad else x.bernoulli_(0.5),
    "multinomial": lambda x, bad: torch.multinomial(x.abs() + 1, 9 if bad else 2),
}


@pytest.mark.parametrize("mode", ["adaptive", "eager"])
@pytest.mark.parametrize("case", RANDOM_PARAMETER_CASES)
def test_a_random_op_checks_its_parameters_at_the_op(case: str, mode: str) -> None:
    """A good call of the signature first, then a bad one: the parameters are part of what
    is checked, so the bad call still raises at the op, not at the next wait."""
    call = RANDOM_PARAMETER_CASES[case]
    with pytest.raises(RuntimeError):
        call(torch.ones(4), True)
    with neuron_lab.mode(mode):
        for _ in range(3):
            ae.forget_repeats()
            call(torch.ones(4, device="neuron") * 2, False)  # a pending tensor
        ae.forget_repeats()
        with pytest.raises(RuntimeError):
            call(torch.ones(4, device="neuron") * 2, True)
        torch.neuron.synchronize()  # nothing left to raise


# Ops given a number (Scalar) that overflows the tensor's dtype: the CPU kernel converts it
# with a check that meta kernels lack. (op, call with a number of the device).
NUMBER_CASES = {
    "fill_": lambda d, v: torch.zeros(3, device=d).fill_(v),
    "full": lambda d, v: torch.full((3,), v, device=d),
    "masked_fill_": lambda d, v: torch.zeros(3, device=d).masked_fill_(torch.tensor([True, False, True], device=d), v),
    "index_fill_": lambda d, v: torch.zeros(3, device=d).index_fill_(0, torch.tensor([0], device=d), v),
    "threshold": lambda d, v: torch.nn.functional.threshold(torch.zeros(3, device=d), v, 2.0),
    "elu": lambda d, v: torch.nn.functional.elu(torch.zeros(3, device=d), alpha=v),
    "leaky_relu": lambda d, v: torch.nn.functional.leaky_relu(torch.zeros(3, device=d), v),
    "softplus": lambda d, v: torch.nn.functional.softplus(torch.zeros(3, device=d), beta=v),
    "clamp_": lambda d, v: torch.zeros(3, device=d).clamp_(min=v),
    "fill_ half": lambda d, v: torch.zeros(3, dtype=torch.half, device=d).fill_(v * 1e-294),
}


@pytest.mark.parametrize("mode", ["adaptive", "eager", "blocking"])
@pytest.mark.parametrize("case", NUMBER_CASES)
def test_a_number_that_overflows_the_dtype_raises_at_the_op(case: str, mode: str) -> None:
    call = NUMBER_CASES[case]
    with pytest.raises(RuntimeError):
        call("cpu", 1e300)
    with neuron_lab.mode(mode):
        for _ in range(3):  # a fitting value first: its signature is known (and checked)
            ae.forget_repeats()
            call("neuron", 2.0)
        assert raised_where(lambda d: call(d, 1e300)) == "op"


def test_numbers_that_fit_their_tensor_are_recorded() -> None:
    """The overflow rule looks at the tensor a number is computed in (not a bool mask, not a
    comparison's bool result): -inf as where's or masked_fill's value, a large clamp bound, a
    token id compared, are recorded as usual."""
    with neuron_lab.mode("adaptive"):
        x = torch.randn(8, device="neuron")
        ids = torch.arange(8, device="neuron")
        mask = x > 0
        calls = [lambda: torch.where(mask, x, float("-inf")), lambda: x.masked_fill(mask, float("-inf")),
                 lambda: x.clamp(min=-1e30), lambda: torch.where(mask, x, -1e9),
                 lambda: (ids + 1) == 50256, lambda: ids < 1e12, lambda: x > 1e30]
        for _ in range(3):  # first calls: signatures checked or learned
            for call in calls:
                call()
        torch.neuron.synchronize()
        ae.forget_repeats()
        ae.reset_counters()
        for call in calls:
            call()
        recorded = ae.counters()["ops_recorded"]
        inline = ae.counters()["inline_by_op"]
        torch.neuron.synchronize()
    assert recorded >= len(calls) and not inline, inline
