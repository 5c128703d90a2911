"""Result metadata of ops whose meta kernel is torch's Python code, computed in C++
(neuron_lab/adaptive_eager/csrc/shape_rules.cpp): layer norm, index_select, the CPU
flash attention kernel, and generate()'s set-up ops (masked_fill_, arange, where, max). A recorded op's results must have the CPU's sizes, strides, dtype
and bits; the cases a rule takes run no Python to size them; the cases it declines still
equal the CPU, and bad input still raises at the op."""

from __future__ import annotations

import contextlib
import math
import re
import sys
from typing import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F

from conftest import run_python
from neuron_lab import adaptive_eager as ae

# Where torch's Python meta kernels and the decompositions they call live.
PYTHON_META_FILES = ("_meta_registrations", "_refs", "_decomp", "_prims")


@contextlib.contextmanager
def python_metas_called() -> Iterator[list[str]]:
    """Collects the names of torch's Python meta functions called on this thread."""
    called: list[str] = []

    def profile(frame, event, arg):
        if event == "call" and any(part in frame.f_code.co_filename for part in PYTHON_META_FILES):
            called.append(frame.f_code.co_name)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield called
    finally:
        sys.setprofile(previous)


def as_tuple(result) -> tuple[torch.Tensor, ...]:
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def check_recorded_like_the_cpu(op: Callable, *inputs: torch.Tensor, name: str) -> None:
    """Records op on the neuron copies of inputs and compares every result with the CPU's:
    sizes, strides and dtype while still pending, then bits; the op must be recorded (not
    run inline) with no Python meta kernel called."""
    expected = as_tuple(op(*inputs))
    on_device = [t.to("neuron") for t in inputs]
    torch.neuron.synchronize()
    ae.reset_counters()
    with python_metas_called() as called:
        got = as_tuple(op(*on_device))
    assert ae.counters()["launches"] == 0, f"{name}: the op ran instead of being recorded"
    assert name not in ae.counters()["inline_by_op"], f"{name} ran inline"
    assert called == [], f"{name}: Python meta code ran: {called[:5]}"
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert (g.shape, g.stride(), g.dtype) == (e.shape, e.stride(), e.dtype), name
    for g, e in zip(got, expected):
        assert torch.equal(g.cpu(), e), name


def layer_norm(x, shape, weight=None, bias=None):
    return torch.ops.aten.native_layer_norm(x, shape, weight, bias, 1e-5)


LAYER_NORM_CASES = {
    "affine": lambda: (torch.randn(3, 5, 8), [8], torch.randn(8), torch.randn(8)),
    "two dims, no affine": lambda: (torch.randn(2, 3, 4, 6), [4, 6]),
    "whole tensor": lambda: (torch.randn(3, 5, 8), [3, 5, 8], torch.randn(3, 5, 8), None),
    "transposed input": lambda: (torch.randn(5, 3, 8).transpose(0, 1), [8], torch.randn(8), torch.randn(8)),
    "empty batch": lambda: (torch.randn(0, 8), [8], torch.randn(8), torch.randn(8)),
    "bf16 with float weight": lambda: (torch.randn(4, 16).bfloat16(), [16], torch.randn(16), torch.randn(16)),
    "bf16": lambda: (torch.randn(4, 16).bfloat16(), [16], torch.randn(16).bfloat16(), None),
    "half with float bias": lambda: (torch.randn(4, 16).half(), [16], None, torch.randn(16)),
    "double": lambda: (torch.randn(2, 7, dtype=torch.double), [7], torch.randn(7, dtype=torch.double), None),
}


@pytest.mark.parametrize("case", LAYER_NORM_CASES)
def test_layer_norm_is_recorded_with_the_cpus_results(case: str) -> None:
    x, shape, *params = LAYER_NORM_CASES[case]()
    params += [None] * (2 - len(params))
    present = [p for p in params if p is not None]

    def op(x, *given):
        given = iter(given)
        weight, bias = (None if p is None else next(given) for p in params)
        return layer_norm(x, shape, weight, bias)

    check_recorded_like_the_cpu(op, x, *present, name="aten::native_layer_norm")


INDEX_SELECT_CASES = {
    "rows": lambda: (torch.randn(6, 4), 0, torch.tensor([3, 0, 5, 3])),
    "last dim, int32 index": lambda: (torch.randn(6, 4), -1, torch.tensor([2, 1], dtype=torch.int32)),
    "0-d index": lambda: (torch.randn(6, 4), 1, torch.tensor(2)),
    "empty index": lambda: (torch.randn(6, 4), 0, torch.tensor([], dtype=torch.long)),
    "transposed self": lambda: (torch.randn(4, 6).t(), 0, torch.tensor([5, 0])),
    "middle of 3-d, ints": lambda: (torch.arange(60).view(3, 4, 5), 1, torch.tensor([3, 3, 0])),
    "embedding rows": lambda: (torch.randn(50, 16), 0, torch.randint(0, 50, (7,))),
}


@pytest.mark.parametrize("case", INDEX_SELECT_CASES)
def test_index_select_is_recorded_with_the_cpus_results(case: str) -> None:
    x, dim, index = INDEX_SELECT_CASES[case]()
    check_recorded_like_the_cpu(lambda x, index: torch.index_select(x, dim, index), x, index,
                                name="aten::index_select")


def flash(q, k, v, causal=False, scale=None):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)


def heads_last(batch, length, heads, dim, dtype=torch.float32):
    """[B, H, L, D] as a transformer makes it: a [B, L, H, D] projection transposed."""
    return torch.randn(batch, length, heads, dim, dtype=dtype).transpose(1, 2)


FLASH_CASES = {
    "contiguous": lambda: (torch.randn(1, 4, 5, 8), torch.randn(1, 4, 7, 8), torch.randn(1, 4, 7, 8)),
    "heads transposed (a transformer's q)": lambda: (heads_last(2, 5, 4, 8), heads_last(2, 9, 4, 8),
                                                     heads_last(2, 9, 4, 8)),
    "one query token, causal": lambda: (heads_last(1, 1, 4, 8), heads_last(1, 33, 4, 8), heads_last(1, 33, 4, 8)),
    "one head": lambda: (torch.randn(3, 1, 6, 16), torch.randn(3, 1, 6, 16), torch.randn(3, 1, 6, 16)),
    "bf16": lambda: tuple(heads_last(1, 6, 2, 8, torch.bfloat16) for _ in range(3)),
    "double": lambda: tuple(torch.randn(1, 2, 3, 4, dtype=torch.double) for _ in range(3)),
}


@pytest.mark.parametrize("case", FLASH_CASES)
def test_cpu_flash_attention_is_recorded_with_the_cpus_results(case: str) -> None:
    causal = "causal" in case
    check_recorded_like_the_cpu(lambda q, k, v: flash(q, k, v, causal, scale=0.3 if causal else None),
                                *FLASH_CASES[case](), name="aten::_scaled_dot_product_flash_attention_for_cpu")


def test_a_transformers_attention_is_recorded_without_python() -> None:
    """F.scaled_dot_product_attention as transformers calls it, with layer norm and an
    embedding lookup before it: all recorded, no Python meta code."""
    torch.manual_seed(0)
    embedding, norm = torch.nn.Embedding(40, 32), torch.nn.LayerNorm(32)

    def block(ids, emb, norm_weight, norm_bias):
        h = F.layer_norm(F.embedding(ids, emb), (32,), norm_weight, norm_bias)
        q = h.view(1, 6, 4, 8).transpose(1, 2)
        return F.scaled_dot_product_attention(q, q, q, is_causal=True)

    check_recorded_like_the_cpu(block, torch.randint(0, 40, (1, 6)), embedding.weight.detach(),
                                norm.weight.detach(), norm.bias.detach(), name="aten::index_select")


# ---- generate()'s set-up ops: masked_fill_, arange, where, max -------------------------------

MASKED_FILL_CASES = {
    "broadcast mask": lambda: (lambda x, m: torch.masked_fill(x, m, 0.0), torch.randn(4, 5), torch.rand(5) > 0.5),
    "position ids (generate)": lambda: (lambda x, m: torch.masked_fill(x, m, 0), torch.arange(8).view(1, 8),
                                        torch.tensor([[True, False] * 4])),
    "0-d mask": lambda: (lambda x, m: torch.masked_fill(x, m, -2.5), torch.randn(3, 2), torch.tensor(True)),
    "in place into a transposed view": lambda: (lambda x, m: (x * 1).t().masked_fill_(m, -1.0),
                                                torch.randn(5, 4), torch.rand(4, 5) > 0.5),
    "bf16, int value": lambda: (lambda x, m: torch.masked_fill(x, m, 3), torch.randn(2, 6).bfloat16(),
                                torch.rand(2, 1) > 0.5),
}


@pytest.mark.parametrize("case", MASKED_FILL_CASES)
def test_masked_fill_is_recorded_with_the_cpus_results(case: str) -> None:
    op, *inputs = MASKED_FILL_CASES[case]()
    check_recorded_like_the_cpu(op, *inputs, name="aten::masked_fill_")


def arange_on(*args, **kwargs) -> Callable[[torch.Tensor], torch.Tensor]:
    """torch.arange on the device of its one input (the inputs say where the op runs)."""
    return lambda where: torch.arange(*args, device=where.device, **kwargs)


ARANGE_CASES = {
    "end": arange_on(7),
    "start, end, step": arange_on(2, 20, 3),
    "negative step": arange_on(10, -5, -4),
    "empty": arange_on(5, 5),
    "int32": arange_on(0, 9, 2, dtype=torch.int32),
    "uint8 down": arange_on(200, 3, -7, dtype=torch.uint8),
    "float steps": arange_on(0, 1, 0.1),
    "double, fractional": arange_on(0.5, 3.25, 0.25, dtype=torch.double),
    "float result of int bounds": arange_on(3, 40, 5, dtype=torch.float32),
    "int64 near 2**52": arange_on(2**52 - 10, 2**52, 3),
}


@pytest.mark.parametrize("case", ARANGE_CASES)
def test_arange_is_recorded_with_the_cpus_results(case: str) -> None:
    check_recorded_like_the_cpu(ARANGE_CASES[case], torch.zeros(1), name="aten::arange")


WHERE_CASES = {
    "same shape": lambda: (torch.rand(4, 5) > 0.5, torch.randn(4, 5), torch.randn(4, 5)),
    "broadcast": lambda: (torch.rand(4, 1) > 0.5, torch.randn(1, 5), torch.randn(5)),
    "one-element operand": lambda: (torch.rand(3, 4) > 0.5, torch.tensor([2.0]), torch.randn(3, 4)),
    "int64": lambda: (torch.rand(2, 3) > 0.5, torch.arange(6).view(2, 3), torch.zeros(2, 3, dtype=torch.long)),
    "bool": lambda: (torch.rand(7) > 0.5, torch.rand(7) > 0.2, torch.rand(7) > 0.8),
    "size-1 dims of odd strides": lambda: (torch.rand(1, 6) > 0.5, torch.randn(6, 1).t(), torch.randn(1, 6)),
}


@pytest.mark.parametrize("case", WHERE_CASES)
def test_where_is_recorded_with_the_cpus_results(case: str) -> None:
    check_recorded_like_the_cpu(torch.where, *WHERE_CASES[case](), name="aten::where")


def test_where_of_a_python_number_is_recorded_with_the_cpus_dtype() -> None:
    """generate()'s min-length processor: torch.where(mask, -inf, scores), a Python float
    (a 0-dim double) against float32 scores: the result is float32."""
    check_recorded_like_the_cpu(lambda mask, scores: torch.where(mask, -math.inf, scores),
                                torch.rand(1, 50) > 0.9, torch.randn(1, 50), name="aten::where")


MAX_CASES = {
    "float": lambda: torch.randn(3, 4),
    "transposed int": lambda: torch.randint(-9, 9, (4, 3)).t(),
    "bool": lambda: torch.rand(5) > 0.5,
    "one element, bf16": lambda: torch.randn(1).bfloat16(),
}


@pytest.mark.parametrize("case", MAX_CASES)
def test_max_is_recorded_with_the_cpus_results(case: str) -> None:
    check_recorded_like_the_cpu(torch.max, MAX_CASES[case](), name="aten::max")


# ---- what the rules decline, and what ATen rejects ---------------------------------------


UNUSUAL = {
    "index_select of a 0-d tensor": lambda: torch.index_select(torch.tensor(3.0), 0, torch.tensor([0])),
    "flash attention of an expanded query": lambda: flash(torch.randn(1, 2, 1, 8).expand(1, 2, 5, 8),
                                                          torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)),
    "layer norm with int64 weight": lambda: layer_norm(torch.randn(2, 3), [3], torch.ones(3, dtype=torch.long)),
    "arange of fractional bounds into int64": lambda: torch.arange(0.5, 7.25, 1.5, dtype=torch.long),
    "arange into half": lambda: torch.arange(0, 3, 0.25, dtype=torch.half),
    "arange past 2**52": lambda: torch.arange(2**60, 2**60 + 7, 2),
    "arange from the smallest int64": lambda: torch.arange(-(2**63), -(2**63) + 5),
    "where of a transposed operand": lambda: torch.where(torch.rand(4, 5) > 0.5, torch.randn(5, 4).t(),
                                                         torch.randn(4, 5)),
    "where of a uint8 condition": lambda: torch.where(torch.tensor([1, 0, 1], dtype=torch.uint8),
                                                      torch.randn(3), torch.randn(3)),
    "where promoting a tensor operand": lambda: torch.where(torch.rand(3) > 0.5, torch.arange(3),
                                                            torch.randn(3)),
    "masked_fill_ of an expanded mask": lambda: torch.randn(3, 4).masked_fill_(
        (torch.rand(1, 4) > 0.5).expand(3, 4), 1.0),
    "max of complex": lambda: torch.randn(3, dtype=torch.cfloat).max(),
    "masked_fill_ into overlapping elements (ATen warns)": lambda: torch.zeros(1).expand(3).masked_fill_(
        torch.tensor([True, False, True]), 1.0),
}


def on_neuron(make: Callable[[], object]) -> object:
    """Runs make with every tensor it creates on the neuron device (the default device)."""
    with torch.device("neuron"):
        return make()


@pytest.mark.parametrize("case", UNUSUAL)
def test_calls_the_rules_decline_equal_the_cpu(case: str) -> None:
    make = UNUSUAL[case]
    torch.manual_seed(1)
    try:
        expected = as_tuple(make())
    except RuntimeError as error:  # then the neuron device must raise it too
        torch.manual_seed(1)
        with pytest.raises(RuntimeError, match=re.escape(str(error).split("\n")[0][:40])):
            on_neuron(make)
            torch.neuron.synchronize()
        return
    torch.manual_seed(1)
    got = as_tuple(on_neuron(make))
    for g, e in zip(got, expected):
        assert (g.shape, g.dtype) == (e.shape, e.dtype)
        assert torch.equal(g.cpu(), e), case


REJECTED = {
    "index_select with a 2-d index": lambda: torch.index_select(torch.randn(4, 3), 0, torch.tensor([[0, 1]])),
    "index_select with a float index": lambda: torch.index_select(torch.randn(4, 3), 0, torch.tensor([0.0])),
    "index_select past the last dim": lambda: torch.index_select(torch.randn(4, 3), 2, torch.tensor([0])),
    "layer norm of an int tensor": lambda: layer_norm(torch.arange(6).view(2, 3), [3]),
    "layer norm over a wrong shape": lambda: layer_norm(torch.randn(3, 5), [4]),
    "layer norm with a wrong weight": lambda: layer_norm(torch.randn(3, 5), [5], torch.ones(4)),
    "flash attention of 3-d inputs": lambda: flash(torch.randn(2, 5, 8), torch.randn(2, 5, 8),
                                                   torch.randn(2, 5, 8)),
    "flash attention of mixed dtypes": lambda: flash(torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8).double(),
                                                     torch.randn(1, 2, 5, 8)),
    "flash attention of other head sizes": lambda: flash(torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 4),
                                                         torch.randn(1, 2, 5, 4)),
    "masked_fill_ with a float mask": lambda: torch.randn(3).masked_fill_(torch.tensor([1.0, 0.0, 1.0]), 0.0),
    "masked_fill_ with a mask that does not broadcast": lambda: torch.randn(3).masked_fill_(
        torch.tensor([True, False]), 0.0),
    "arange with a zero step": lambda: torch.arange(0, 5, 0),
    "arange against its step's sign": lambda: torch.arange(5, 0, 1),
    "arange to infinity": lambda: torch.arange(0, math.inf, 1.0),
    "where of a float condition": lambda: torch.where(torch.tensor([1.0, 0.0]), torch.randn(2), torch.randn(2)),
    "where of shapes that do not broadcast": lambda: torch.where(torch.rand(3) > 0.5, torch.randn(3),
                                                                 torch.randn(4)),
    "max of an empty tensor": lambda: torch.randn(0).max(),
}


@pytest.mark.parametrize("case", REJECTED)
def test_calls_aten_rejects_raise_its_error_at_the_op(case: str) -> None:
    """Even with torch's Python meta kernels loaded (which take a 2-d index for index_select,
    and would leave the error to a later wait): raised at the op, the runtime intact."""
    import torch._dynamo  # noqa: F401  (loads the Python meta kernels' dependencies)

    make = REJECTED[case]
    with pytest.raises((RuntimeError, IndexError)) as on_cpu:
        make()
    before = torch.full((3,), 2.0, device="neuron")
    with pytest.raises(type(on_cpu.value), match=re.escape(str(on_cpu.value).split("\n")[0][:40])):
        on_neuron(make)  # at the op, not at a later wait
    torch.neuron.synchronize()  # nothing left to raise
    assert before.sum().item() == 6.0


def test_empty_attention_that_would_end_the_process_raises_in_every_mode() -> None:
    """ATen's CPU flash-attention kernel divides by zero (SIGFPE, on the CPU device too) on an
    empty query or key length or zero heads. On the neuron device a direct call raises a
    clear error in every mode instead, and the process and runtime go on; the public
    F.scaled_dot_product_attention takes the same shapes. A fresh process: a crash fails the
    test instead of ending the run."""
    result = run_python(
        """
        import torch, torch.nn.functional as F
        import neuron_lab
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        shapes = [((1, 2, 0, 8), (1, 2, 5, 8)), ((1, 2, 3, 8), (1, 2, 0, 8)), ((1, 0, 3, 8), (1, 0, 5, 8))]
        for mode in ("adaptive", "eager", "blocking"):
            with neuron_lab.mode(mode):
                for q_shape, k_shape in shapes:
                    q, k = torch.randn(q_shape, device="neuron"), torch.randn(k_shape, device="neuron")
                    try:
                        flash(q, k, k)
                        torch.neuron.synchronize()
                        print("no error", mode, q_shape)
                    except RuntimeError as error:
                        assert "divides by zero" in str(error) and "scaled_dot_product_attention" in str(error)
                    out = F.scaled_dot_product_attention(q, k, k)
                    want = F.scaled_dot_product_attention(q.cpu(), k.cpu(), k.cpu())
                    assert torch.equal(out.cpu(), want), (mode, q_shape)
        print("ok", (torch.ones(3, device="neuron") * 2).sum().item())
        """
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["ok", "6.0"], result.stdout
