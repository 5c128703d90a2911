"""Ops whose results the device must give bit for bit as the CPU does, on every path (at
once, the fallback, replay of a recorded graph, out= twins): the checks _safe_softmax runs on
attention scores (all, isneginf, where over rows), layer norm, the structured unary ops of
rotary embeddings and activations (cos, sin, tanh, silu) and the CPU's flash attention. They
were the tests of the fast-path families softmax_masks and aten_direct, deleted under issue
47's rule (neuron_lab/fastpath/KERNELS.md); ATen's kernels run them now."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import neuron_lab
from elementwise_layouts import check_calls_equal_the_cpu, same_layout_on_device, with_unit_strides
from parity import bits, special_floats


# ---- the checks of _safe_softmax: all, isneginf and where over rows -----------------------


def masks() -> list[torch.Tensor]:
    """Bool tensors with all-true, all-false and mixed rows, of row lengths around the
    word sizes a row check might use."""
    g = torch.Generator().manual_seed(7)
    out = []
    for shape in [(5,), (3, 1), (4, 7), (2, 3, 64), (8, 4, 9, 65), (6, 33)]:
        m = torch.rand(shape, generator=g) > 0.1
        m.view(-1, shape[-1])[0] = True  # an all-true row
        if m.view(-1, shape[-1]).shape[0] > 1:
            m.view(-1, shape[-1])[-1] = False  # an all-false row
        out.append(m)
    return out


@pytest.mark.parametrize("keepdim", [False, True])
def test_all_over_rows_equals_the_cpu(mode, keepdim):
    for m in masks():
        for dim in range(-m.dim(), m.dim()):
            expected = torch.all(m, dim, keepdim=keepdim)
            got = torch.all(m.to("neuron"), dim, keepdim=keepdim).cpu()
            assert got.dtype == torch.bool and torch.equal(got, expected), (tuple(m.shape), dim, keepdim)


def test_all_out_equals_the_cpu_and_resizes_like_aten(mode):
    m = masks()[4]
    out = torch.empty(m.shape[:-1], dtype=torch.bool, device="neuron")
    returned = torch.all(m.to("neuron"), -1, out=out)
    assert returned.data_ptr() == out.data_ptr() and torch.equal(out.cpu(), m.all(-1))
    # An out= of the wrong shape is resized as ATen resizes it.
    wrong = torch.empty(3, dtype=torch.bool, device="neuron")
    torch.all(m.to("neuron"), -1, out=wrong)
    assert wrong.shape == m.shape[:-1] and torch.equal(wrong.cpu(), m.all(-1))


def test_all_of_other_inputs_equals_the_cpu(mode):
    m = masks()[3]
    strided = m.transpose(0, 1)  # not contiguous
    assert torch.equal(torch.all(strided.to("neuron"), -1).cpu(), strided.all(-1))
    as_bytes = m.to(torch.uint8)  # all() of uint8 returns uint8
    got = torch.all(as_bytes.to("neuron"), -1).cpu()
    assert got.dtype == torch.uint8 and torch.equal(got, as_bytes.all(-1))
    empty_rows = torch.ones(3, 0, dtype=torch.bool)
    assert torch.equal(torch.all(empty_rows.to("neuron"), -1).cpu(), empty_rows.all(-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_isneginf_equals_the_cpu(mode, dtype):
    for n in [0, 1, 15, 16, 17, 33, 64 * 64 + 5]:
        x = special_floats(dtype, n)
        for t in (x, x.view(1, -1) if n else x):
            assert torch.equal(t.to("neuron").isneginf().cpu(), t.isneginf()), (dtype, n)
        out = torch.empty(n, dtype=torch.bool, device="neuron")
        assert torch.isneginf(x.to("neuron"), out=out) is out and torch.equal(out.cpu(), x.isneginf())


def test_isneginf_of_other_inputs_equals_the_cpu(mode):
    x = special_floats(torch.float32, 40).view(4, 10)
    for t in (x.t(), x.half(), x.bfloat16(), torch.arange(6), torch.tensor([True, False])):
        assert torch.equal(t.to("neuron").isneginf().cpu(), t.isneginf()), t.dtype
    wrong = torch.empty(3, dtype=torch.bool, device="neuron")  # resized as ATen resizes it, with its warning
    with pytest.warns(UserWarning, match="resized"):
        torch.isneginf(x.to("neuron"), out=wrong)
    assert wrong.shape == x.shape and torch.equal(wrong.cpu(), x.isneginf())


def row_conditions(shape: tuple[int, ...]) -> torch.Tensor:
    """One bool per row of `shape` (its last dim 1), true and false rows mixed."""
    rows = torch.rand(*shape[:-1], 1, generator=torch.Generator().manual_seed(len(shape))) > 0.5
    rows.view(-1)[0], rows.view(-1)[-1] = True, False
    return rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool])
def test_where_over_rows_equals_the_cpu_bit_for_bit(mode, dtype):
    for shape in [(2, 1), (3, 17), (8, 4, 9, 65)]:
        full = special_floats(torch.float64, math.prod(shape)).view(shape)
        full = (full > 0) if dtype == torch.bool else full.to(dtype) if dtype.is_floating_point else (full * 100).to(dtype)
        scalar = torch.tensor(True if dtype == torch.bool else -0.0 if dtype.is_floating_point else -7, dtype=dtype)
        rows = row_conditions(shape)
        for args in [(rows, scalar, full), (rows, full, scalar)]:  # the scalar where true, and where false
            expected = torch.where(*args)
            for _ in range(3):  # recorded, then replayed from the graph cache
                got = torch.where(*(a.to("neuron") for a in args)).cpu()
                assert got.dtype == dtype and torch.equal(bits(got), bits(expected)), (dtype, shape)
            out = torch.empty(shape, dtype=dtype, device="neuron")
            assert torch.where(*(a.to("neuron") for a in args), out=out) is out
            assert torch.equal(bits(out.cpu()), bits(expected))


def test_where_of_other_inputs_equals_the_cpu(mode):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(6, 5, generator=g)
    rows, zero = row_conditions((6, 5)), torch.tensor(0.0)
    cases = [
        (torch.rand(6, 5, generator=g) > 0.5, zero, x),  # a condition per element
        (rows.view(6, 1)[:1].expand(1, 1), zero, x),  # a condition that broadcasts over rows
        (rows, torch.tensor(2.5, dtype=torch.float64), x),  # a double scalar: no promotion, a cast
        (rows, zero, x.t().contiguous().t()),  # not contiguous
        (rows, torch.tensor(3), x.double()),  # an integer scalar with doubles
        (rows.view(6), zero, x[:, 0]),  # a condition without its row dim of 1
    ]
    for args in cases:
        expected = torch.where(*args)
        got = torch.where(*(a.to("neuron") for a in args)).cpu()
        assert got.dtype == expected.dtype and torch.equal(bits(got), bits(expected)), [a.shape for a in args]
    # out= that must be resized.
    wrong = torch.empty(3, device="neuron")
    with pytest.warns(UserWarning, match="resized"):
        torch.where(rows.to("neuron"), zero.to("neuron"), x.to("neuron"), out=wrong)
    assert wrong.shape == x.shape and torch.equal(wrong.cpu(), torch.where(rows, zero, x))


def test_where_over_rows_into_its_own_input_and_overlaps(mode):
    """A recorded graph may place where's result in the memory of its full-size input: the
    rows are then filled or left in place. An out= that overlaps an input any other way
    raises ATen's error, and nothing is lost."""
    g = torch.Generator().manual_seed(12)
    x = torch.randn(6, 5, generator=g)
    rows, zero = row_conditions((6, 5)), torch.tensor(-0.0)
    for args in [(rows, zero, x), (rows, x, zero)]:
        expected = torch.where(*args)
        into = x.to("neuron")
        neuron_args = [into if a is x else a.to("neuron") for a in args]
        assert torch.where(*neuron_args, out=into) is into
        assert torch.equal(bits(into.cpu()), bits(expected))
    kept = x.to("neuron") * 1
    buffer = torch.randn(31, generator=g).to("neuron")
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        torch.where(rows.to("neuron"), zero.to("neuron"), buffer[:30].view(6, 5), out=buffer[1:].view(6, 5))
        buffer.cpu()
    assert torch.equal(kept.cpu(), x)  # the runtime and what it computed before are intact
    # The graph of a step that places where's result over softmax's (the way _safe_softmax's
    # where meets its input in a training step's replay): equal to the CPU, replayed.
    scores = torch.randn(4, 3, 8, 8, generator=g)
    scores[0, 1, 2] = float("-inf")
    expected = torch.ops.aten._safe_softmax(scores, -1) * 2
    for _ in range(3):
        got = torch.ops.aten._safe_softmax(scores.to("neuron"), -1) * 2
        assert torch.equal(bits(got.cpu()), bits(expected))


def test_safe_softmax_of_fully_masked_rows_equals_the_cpu(mode):
    # scaled_dot_product_attention's math path checks every row of scores with all().
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 16, 8, generator=g) for _ in range(3))
    mask = torch.rand(2, 1, 16, 16, generator=g) > 0.3
    mask[:, :, 5] = False  # rows that attend to nothing: zeros, not NaN
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    for _ in range(3):  # recorded, then replayed from the graph cache
        got = F.scaled_dot_product_attention(*(t.to("neuron") for t in (q, k, v)), attn_mask=mask.to("neuron"))
        assert torch.equal(got.cpu(), expected)
    scores = torch.randn(4, 6, generator=g)
    scores[1] = float("-inf")  # a fully masked row: zeros
    scores[2, 3] = float("nan")  # a NaN row stays NaN, bit for bit
    scores[3, :5] = float("-inf")
    expected = torch.ops.aten._safe_softmax(scores, -1)
    for _ in range(3):
        assert torch.equal(bits(torch.ops.aten._safe_softmax(scores.to("neuron"), -1).cpu()), bits(expected))


def test_isneginf_in_tiled_replay_equals_the_cpu():
    """Replay runs a chain of elementwise ops over large tensors tile by tile: the bits must
    not change."""
    from neuron_lab import adaptive_eager
    from neuron_lab.adaptive_eager.stats import counters

    adaptive_eager.forget_repeats()  # record, whatever earlier tests ran at once
    x = special_floats(torch.float32, 4 * 65536)
    x[::977], x[5::1013] = float("-inf"), float("nan")

    def checks(t):
        return ((t * 1.5).isneginf() & (t - 1.0).isneginf()) | (t * 0.5).isneginf()

    expected, on_device = checks(x), x.to("neuron")
    with neuron_lab.mode("adaptive"):
        tiled_before = counters()["tiled_runs"]
        for _ in range(4):  # recorded, then replayed
            assert torch.equal(checks(on_device).cpu(), expected)
        assert counters()["tiled_runs"] > tiled_before


# ---- layer norm ------------------------------------------------------------------------------

LAYER_NORM_CASES = [
    ((1, 1, 32), (32,)),  # one token
    ((2, 7, 48), (48,)),
    ((3, 4, 5), (4, 5)),  # two normalized dims
    ((6,), (6,)),  # the whole tensor
    ((5, 1000), (1000,)),  # rows past a vector's width, with a tail
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_layer_norm_equals_the_cpu_bit_for_bit(mode, dtype):
    g = torch.Generator().manual_seed(15)
    for shape, normalized in LAYER_NORM_CASES:
        x = torch.randn(shape, generator=g, dtype=dtype) * 3 + 1
        weight = torch.randn(normalized, generator=g, dtype=dtype)
        bias = torch.randn(normalized, generator=g, dtype=dtype)
        for w, b in [(weight, bias), (weight, None), (None, None)]:
            expected = torch.native_layer_norm(x, normalized, w, b, 1e-5)
            for _ in range(3):  # at once or recorded, then replayed
                on = [None if t is None else t.to("neuron") for t in (w, b)]
                got = [r.cpu() for r in torch.native_layer_norm(x.to("neuron"), normalized, on[0], on[1], 1e-5)]
                for e, r in zip(expected, got):
                    assert r.shape == e.shape and r.stride() == e.stride() and r.dtype == e.dtype, (shape, normalized)
                    assert torch.equal(bits(r), bits(e)), (shape, normalized, w is None, b is None, dtype)


def test_layer_norm_of_other_inputs_equals_the_cpu(mode):
    g = torch.Generator().manual_seed(16)
    x = torch.randn(4, 6, 8, generator=g)
    w, b = torch.randn(8, generator=g), torch.randn(8, generator=g)
    cases = [
        lambda x, w, b: F.layer_norm(x.transpose(0, 1), (8,), w, b),  # not row-major: ATen copies it
        lambda x, w, b: F.layer_norm(x.bfloat16(), (8,), w.bfloat16(), b.bfloat16()),
        lambda x, w, b: F.layer_norm(x.bfloat16(), (8,), w, b),  # mixed dtypes
        lambda x, w, b: F.layer_norm(x[:, :, ::2], (4,), w[::2], b[::2]),
        lambda x, w, b: F.layer_norm(x[:0], (8,), w, b),  # empty
    ]
    for i, fn in enumerate(cases):
        expected = fn(x, w, b)
        got = fn(x.to("neuron"), w.to("neuron"), b.to("neuron")).cpu()
        assert got.dtype == expected.dtype and got.stride() == expected.stride(), i
        assert torch.equal(bits(got), bits(expected)), i
    with pytest.raises(RuntimeError, match="normalized_shape"):
        F.layer_norm(x.to("neuron"), (6,), w.to("neuron"), b.to("neuron")).cpu()


# ---- structured unary ops -------------------------------------------------------------------


STRUCTURED_UNARY = {"cos": torch.cos, "sin": torch.sin, "tanh": torch.tanh, "silu": F.silu}


def structured_unary_sources() -> list[torch.Tensor]:
    """Floating-point tensors of every layout TensorIterator treats apart: contiguous (vector
    blocks and a tail), transposed, sliced with steps, size-1 dims of other strides, 0-dim,
    empty, more than GRAIN_SIZE elements (split between threads), the reduced-precision
    dtypes; special values among them."""
    g = torch.Generator().manual_seed(31)
    base = torch.randn(3, 5, 37, generator=g) * 4
    return [
        base, special_floats(torch.float32, 70), base.transpose(0, 2), base[:, ::2, 1:], base.double(),
        base.half(), base.to(torch.bfloat16), with_unit_strides(torch.randn(1, 4, 1, 8, generator=g), {2: 32}),
        torch.tensor(0.75), torch.empty(0, 3), torch.randn(70000, generator=g),
    ]


def test_structured_unary_ops_equal_the_cpu_bit_for_bit(mode):
    check_calls_equal_the_cpu(structured_unary_sources(), STRUCTURED_UNARY, lambda a, b: torch.equal(bits(a), bits(b)))
    ints = torch.arange(5)  # promoted to float
    assert torch.equal(torch.cos(ints.to("neuron")).cpu(), torch.cos(ints))


# ---- the CPU's flash attention called on the device's tensors ----------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_on_the_device_tensors_equals_the_cpu(mode, causal):
    """The CPU's flash-attention function called on the device's tensors: one query (a decode
    step) and several, grouped heads' layouts (transposed from [batch, length, heads, dim]),
    a float mask; results and their strides as the CPU's, bit for bit."""
    g = torch.Generator().manual_seed(32)
    for batch, heads, q_len, kv_len, dim in [(1, 4, 1, 9, 8), (2, 2, 5, 5, 16), (1, 4, 1, 300, 8), (1, 2, 7, 7, 64)]:
        q, k, v = (torch.randn(batch, n, heads, dim, generator=g).transpose(1, 2) for n in (q_len, kv_len, kv_len))
        masks = [None] if causal else [None, torch.randn(batch, 1, q_len, kv_len, generator=g)]
        for mask in masks:
            expected = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=mask)
            on_device = [same_layout_on_device(t) for t in (q, k, v)]
            device_mask = None if mask is None else mask.to("neuron")
            got = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(*on_device, 0.0, causal, attn_mask=device_mask)
            for e, r in zip(expected, got):
                assert r.device.type == "neuron" and r.stride() == e.stride(), (q.shape, k.shape)
                assert torch.equal(bits(r.cpu()), bits(e)), (q.shape, k.shape, mask is not None)
