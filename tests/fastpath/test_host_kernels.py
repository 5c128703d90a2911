"""Host kernels faster than ATen's CPU kernel (neuron_lab/fastpath, KERNELS.md): every
result must equal the CPU's bit for bit, in every mode and on every path (the fallback,
replay of a recorded graph, out= twins), and inputs the fast kernel does not take still run
ATen's kernel."""

from __future__ import annotations

import math
import random
import re
import warnings

import pytest
import torch
import torch.nn.functional as F

import neuron_lab
from conftest import run_python
from elementwise_layouts import (ARITH, check_calls_equal_the_cpu, check_elementwise_case, elementwise_sweep_case, same_layout_on_device,
                                 with_unit_strides)
from parity import bits, special_floats
from neuron_lab import fastpath
from neuron_lab.device import trace


@pytest.fixture(autouse=True)
def fast_kernels_running():
    """These tests are the fast kernels' own: they run them under NEURON_LAB_FASTPATH=off too
    (validate stays validate, comparing each with ATen's kernel)."""
    if fastpath.get_mode() != "off":
        yield
        return
    with fastpath.mode("on"):
        yield


def runs(fn) -> int:
    """How many of the ops `fn` runs a fast host kernel took (device_counters' host_kernel_ops)."""
    before = trace.device_counters()["host_kernel_ops"]
    fn()
    torch.neuron.synchronize()
    return trace.device_counters()["host_kernel_ops"] - before


# ---- small add, sub and mul (small_arith.cpp) ------------------------------------------------


def arith_operands(dtype: torch.dtype, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two operands of n elements: for floats the special values (NaN only in the first, so the
    NaN a result carries is that operand's, whatever the loop's operand order), for integers
    values at the ends of the range so that results wrap."""
    if dtype.is_floating_point:
        a = special_floats(dtype, n)
        b = special_floats(dtype, n + 5)[5:].clone()
        b[b.isnan()] = 2.5
        return a, b
    g = torch.Generator().manual_seed(seed)
    info = torch.iinfo(dtype)
    a = torch.randint(-1000, 1000, (n,), generator=g, dtype=dtype)
    b = torch.randint(-1000, 1000, (n,), generator=g, dtype=dtype)
    a[:: max(n // 3, 1)], b[1 :: max(n // 3, 1)] = info.max, info.min
    return a, b


SHAPE_PAIRS = [
    ((5,), (5,)),
    ((4, 1, 32), (4, 1, 32)),  # a size-1 dim: the result's strides must be ATen's
    ((1, 4, 32), (32,)),  # a bias-like block the first operand repeats
    ((32,), (1, 4, 32)),
    ((2, 3, 8), (3, 8)),
    ((1, 1, 40), (1, 1, 1)),  # one element of any shape
    ((1,), (6, 7)),
    ((), (9,)),
    ((), ()),
    ((3000, 11), (11,)),  # 33000 elements: past GRAIN_SIZE, ATen's kernel
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64])
def test_small_add_sub_mul_equal_the_cpu_bit_for_bit(mode, dtype):
    for op_name, op in ARITH.items():
        for shape_a, shape_b in SHAPE_PAIRS:
            a, b = arith_operands(dtype, max(math.prod(shape_a), math.prod(shape_b)), len(shape_a))
            a, b = a[: math.prod(shape_a)].reshape(shape_a), b[: math.prod(shape_b)].reshape(shape_b)
            for x, y in [(a, b), (b, a)]:
                expected = op(x, y)
                for _ in range(3):  # at once or recorded, then replayed from the graph cache
                    got = op(x.to("neuron"), y.to("neuron")).cpu()
                    assert got.dtype == expected.dtype and got.shape == expected.shape, (op_name, shape_a, shape_b)
                    assert got.stride() == expected.stride(), (op_name, shape_a, shape_b)
                    assert torch.equal(bits(got), bits(expected)), (op_name, dtype, x.shape, y.shape)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64])
def test_small_arith_with_python_numbers_equals_the_cpu_bit_for_bit(mode, dtype):
    a, _ = arith_operands(dtype, 40, 1)
    a = a.view(2, 20)
    numbers = [3, -1, 2**40 + 7] + ([0.1, -0.0, 1e-45, float("inf"), float("nan")] if dtype.is_floating_point else [])
    for number in numbers:
        # Where both operands are NaN, IEEE 754 leaves open which NaN the result carries (ATen's
        # own vector and scalar loops differ): a NaN number meets a tensor without NaNs.
        t = a.nan_to_num(nan=1.5) if isinstance(number, float) and math.isnan(number) else a
        for name, fn in [
            ("x + n", lambda t: t + number),
            ("n + x", lambda t: number + t),
            ("x - n", lambda t: t - number),
            ("n - x", lambda t: number - t),  # rsub: the number is the kernel's first operand
            ("x * n", lambda t: t * number),
            ("zero-dim x * n", lambda t: t[0, 3] * number),
        ]:
            expected = fn(t)
            for _ in range(3):
                got = fn(t.to("neuron")).cpu()
                assert got.dtype == expected.dtype and torch.equal(bits(got), bits(expected)), (name, number, dtype)


def test_small_arith_inputs_it_declines_still_equal_the_cpu(mode):
    """What the small kernel does not take runs ATen's kernel: other alphas (which ATen may
    fuse into an FMA), promotion, broadcasts that are not a trailing block, strided and
    reduced-precision operands, and in-place ops."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 6, generator=g)
    cases = [
        lambda t: torch.add(t, t * 3, alpha=0.3),
        lambda t: torch.sub(t, 1.25, alpha=3),
        lambda t: t[:, :1] + t[:1, :],  # [4, 1] + [1, 6]
        lambda t: t.t() * t.t(),  # not row-major
        lambda t: t[:, ::2] - 1,
        lambda t: t.half() * t.half(),
        lambda t: t.bfloat16() + 1,
        lambda t: (t > 0) * (t < 1),  # bool
        lambda t: t.long() * 0.5,  # an int tensor and a float number: promotion
        lambda t: t.int() + t.long(),  # two dtypes
        lambda t: t * t.double()[0, 0],  # a 0-dim tensor of another dtype
        lambda t: t.clone().add_(t, alpha=1),  # in place
        lambda t: torch.complex(t, t) * 2,
    ]
    for i, fn in enumerate(cases):
        expected = fn(x)
        got = fn(x.to("neuron")).cpu()
        assert got.dtype == expected.dtype and torch.equal(bits(got), bits(expected)), i


def test_small_arith_runs_where_it_applies_and_only_there():
    """Blocking mode runs these ops at once (the unboxed path), eager mode as one-op graphs
    (the out= twin through the fallback's table): in both, each call the small kernel takes
    counts once in host_kernel_ops, and a declined one does not."""

    x, bias = torch.randn(1, 4, 32, device="neuron"), torch.randn(32, device="neuron")
    ids = torch.arange(9, device="neuron")
    for mode in ("blocking", "eager"):
        with neuron_lab.mode(mode):
            assert runs(lambda: x + bias) == 1, mode
            assert runs(lambda: x * 0.5) == 1, mode
            assert runs(lambda: 1 - x) == 1, mode
            assert runs(lambda: ids - 1) == 1, mode
            assert runs(lambda: torch.add(x, bias, alpha=2)) == 0, mode
            assert runs(lambda: x.view(4, 32)[:, :1] * x.view(4, 32)[:1]) == 0, mode
            doubled = x.double()
            assert runs(lambda: doubled * x) == 0, mode  # two dtypes: promotion
            assert runs(lambda: x.half() + x.half()) == 0, mode


def test_small_arith_in_replay_writes_over_dead_inputs_bit_for_bit():
    """A recorded graph places a result in the memory of an input that dies with the op:
    the kernel then reads and writes the same elements, which must not change a bit."""
    from neuron_lab import adaptive_eager

    adaptive_eager.forget_repeats()
    a, b = arith_operands(torch.float32, 96, 0)
    c = torch.randn(96, generator=torch.Generator().manual_seed(2))

    def chain(x, y, z):
        return ((x + y) * z - y) * 0.25 + (z - x)

    expected = chain(a, b, c)
    with neuron_lab.mode("adaptive"):
        kernels_before = trace.device_counters()["host_kernel_ops"]
        for _ in range(5):  # recorded, then replayed
            got = chain(a.to("neuron"), b.to("neuron"), c.to("neuron")).cpu()
            assert torch.equal(bits(got), bits(expected))
        assert trace.device_counters()["host_kernel_ops"] > kernels_before


# ---- elementwise results of dense operands whose size-1 dims have other strides --------------

def rotary_cases(dtype: torch.dtype) -> list[tuple[str, object, object]]:
    """Operand pairs as a decoding step's rotary embedding makes them, and one-element operands
    whose size-1 strides decide the result's dim order (TensorIterator sorts dims by stride
    where the operands' shapes differ)."""
    g = torch.Generator().manual_seed(11)

    def rand(*shape):
        return (torch.randn(*shape, generator=g) * 4).to(dtype)

    q = rand(1, 1, 4, 8).transpose(1, 2)  # [1, 4, 1, 8], strides (32, 8, 32, 1)
    k2 = rand(2, 1, 2, 8).transpose(1, 2)  # batch 2: (16, 8, 16, 1)
    cos = rand(1, 1, 8)[:, None]  # [1, 1, 1, 8]
    rotated = rand(1, 4, 1, 8)
    one = with_unit_strides(rand(1, 1, 1), {0: 3, 2: 32})
    return [
        ("q * cos", q, cos),
        ("cos * q", cos, q),
        ("q + rotated (same shape: row-major)", q, rotated),
        ("q + q", q, q),
        ("q * number", q, 2.0 if dtype.is_floating_point else 3),
        ("k (batch 2) * cos", k2, cos),
        ("k (batch 2) * per-batch cos (declined: not a trailing block)", k2, rand(2, 1, 1, 8)),
        ("q * bias block", q, rand(8)),
        ("odd one-element * column", one, rand(4, 1)),
        ("column - odd one-element", rand(4, 1), one),
        ("odd one-element + odd one-element", one, with_unit_strides(rand(1, 1), {0: 5})),
        ("x * rsqrt(variance): a row's statistic [2, 3, 1]", rand(2, 3, 8), rand(2, 3, 1)),
        ("q - a head's statistic [1, 4, 1, 1]", q, rand(1, 4, 1, 1)),
        ("rows * cols: two partial operands", rand(4, 1), rand(8)),
        ("heads' statistic * bias block", rand(1, 4, 1), rand(4, 8)[:, None].squeeze(1)),
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_small_arith_of_dense_operands_with_unit_dim_strides_equals_the_cpu(mode, dtype):
    """The kernel takes dense operands whose size-1 dims have any stride, and gives ATen's
    result strides: row-major where the operands' shapes match, else those of TensorIterator's
    dim order, which such strides change (q * cos keeps q's stride on its length-1 dim)."""
    for name, x, y in rotary_cases(dtype):
        for op_name, op in ARITH.items():
            expected = op(x, y)
            for _ in range(3):  # at once or recorded, then replayed
                got = op(same_layout_on_device(x), same_layout_on_device(y)).cpu()
                assert got.dtype == expected.dtype and got.shape == expected.shape, (name, op_name)
                assert got.stride() == expected.stride(), (name, op_name, got.stride(), expected.stride())
                assert torch.equal(bits(got), bits(expected)), (name, op_name)


def test_small_arith_of_dense_operands_with_unit_dim_strides_runs_the_kernel():
    for mode in ("blocking", "eager"):
        with neuron_lab.mode(mode):
            for name, x, y in rotary_cases(torch.float32):
                x, y = same_layout_on_device(x), same_layout_on_device(y)
                assert runs(lambda: x * y) == (0 if "declined" in name else 1), (mode, name)


@pytest.mark.parametrize("mode", ["adaptive", "eager", "blocking"])
def test_elementwise_kernels_give_atens_result_strides_on_a_random_sweep(mode):
    """add, sub, mul, where, & and | of random small operands, against the CPU: the bits, and
    the strides, which a one-element operand's own size-1 strides can decide (a kernel that
    made every result row-major gave wrong strides there). CI runs 150 calls a mode;
    scripts/sweep_elementwise_layouts.py runs thousands."""
    rng = random.Random(7)
    taken = 0
    with neuron_lab.mode(mode):
        for i in range(150):
            outcome = check_elementwise_case(*elementwise_sweep_case(rng))
            assert outcome.problem is None, (i, outcome.problem)
            taken += outcome.kernel_ran
    if mode == "blocking":
        assert taken >= 75, taken  # the sweep exercises the kernels, not only ATen's


# ---- cat of small row-major tensors (dense_cat.cpp) -------------------------------------------

CAT_CASES = [
    ([(1, 4, 5, 8), (1, 4, 1, 8)], -2),  # a KV cache growing by one token
    ([(1, 9), (1, 1)], -1),  # generated ids
    ([(3, 2), (1, 2), (4, 2)], 0),
    ([(2, 3, 1), (2, 3, 4)], 2),
    ([(2, 0, 3), (2, 5, 3)], 1),  # an empty input along dim
    ([(7,)], 0),  # one input
    ([(1, 1, 1, 1), (1, 1, 1, 1)], 1),  # all size-1: memory format ambiguities
    ([(2, 1, 4, 4), (2, 1, 4, 4)], 1),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_cat_of_row_major_tensors_equals_the_cpu_bit_for_bit(mode, dtype):
    g = torch.Generator().manual_seed(9)
    for shapes, dim in CAT_CASES:
        parts = [(torch.randn(s, generator=g) * 100).to(dtype) for s in shapes]
        if dtype.is_floating_point and parts[0].numel():
            parts[0].view(-1)[0] = float("nan")
        expected = torch.cat(parts, dim)
        for _ in range(3):  # at once or recorded, then replayed
            got = torch.cat([p.to("neuron") for p in parts], dim).cpu()
            assert got.shape == expected.shape and got.stride() == expected.stride(), (shapes, dim)
            assert torch.equal(bits(got), bits(expected)), (shapes, dim, dtype)


def test_cat_inputs_the_block_copy_declines_still_equal_the_cpu(mode):
    g = torch.Generator().manual_seed(10)
    x = torch.randn(2, 3, 4, 4, generator=g)
    cases = [
        ([x, x.double()], 1),  # promotion
        ([x.transpose(2, 3), x], 1),  # not row-major
        ([x.contiguous(memory_format=torch.channels_last)] * 2, 1),
        ([x[:, :, :2], x[:, :, 2:]], 2),  # views with gaps
        ([torch.empty(0), x.view(-1)], 0),  # a legacy empty 1-D input
        ([torch.empty(0), x], -2),  # ... which ATen skips when it wraps dim
        ([x.view(-1)[:10], x.view(-1)], 0),  # the same storage twice
        ([torch.complex(x, x).conj(), torch.complex(x, x)], 0),
    ]
    for parts, dim in cases:
        expected = torch.cat(parts, dim)
        got = torch.cat([p.to("neuron") for p in parts], dim).cpu()
        assert got.dtype == expected.dtype and got.stride() == expected.stride()
        assert torch.equal(got.resolve_conj(), expected.resolve_conj()), [tuple(p.shape) for p in parts]
    with pytest.raises(RuntimeError, match="Sizes of tensors must match"):
        torch.cat([x.to("neuron"), x[:, :, :2].contiguous().to("neuron")], 1)


def test_cat_block_copy_runs_where_it_applies_and_only_there():
    cache, token = torch.randn(1, 4, 6, 8, device="neuron"), torch.randn(1, 4, 1, 8, device="neuron")
    with neuron_lab.mode("blocking"):
        assert runs(lambda: torch.cat([cache, token], -2)) == 1
        assert runs(lambda: torch.cat([cache.transpose(2, 3), token.transpose(2, 3)], -1)) == 0
        token_double = token.double()
        assert runs(lambda: torch.cat([cache, token_double], -2)) == 0


# ---- addmm and mm as ATen's BLAS call (blas_matmul.cpp) -------------------------------------

# (rows, inner, cols): a decoding step's token against a weight, small batches, and the
# single rows and columns where ATen's choice of transposes and leading dimensions turns.
MATMUL_SHAPES = [(1, 32, 96), (1, 64, 1), (3, 1, 5), (7, 100, 129), (33, 5, 3), (2, 64, 64)]


def matmul_operands(rows, inner, cols, dtype, layouts, g):
    """mat1 and mat2 row-major ('c') or as the transpose of a row-major tensor ('t')."""
    mat1 = torch.randn(rows, inner, generator=g, dtype=dtype)
    mat2 = torch.randn(inner, cols, generator=g, dtype=dtype)
    if layouts[0] == "t":
        mat1 = mat1.t().contiguous().t()
    if layouts[1] == "t":
        mat2 = mat2.t().contiguous().t()
    return mat1, mat2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matmul_equals_the_cpu_bit_for_bit(mode, dtype):
    """MKL's results depend on the transposes and leading dimensions of the call (a
    transposed copy of the same weight gives other bits): every layout must make ATen's call."""
    g = torch.Generator().manual_seed(11)
    for rows, inner, cols in MATMUL_SHAPES:
        for layouts in ["cc", "ct", "tc", "tt"]:
            mat1, mat2 = matmul_operands(rows, inner, cols, dtype, layouts, g)
            biases = [torch.randn(cols, generator=g, dtype=dtype), torch.randn(rows, 1, generator=g, dtype=dtype)]
            biases.append(torch.randn(cols, rows, generator=g, dtype=dtype).t())  # strided [rows, cols]
            calls = [("mm", lambda a, b, bias: torch.mm(a, b), None)]
            for bias in biases:
                for beta, alpha in [(1, 1), (0.5, -2), (0, 1)]:
                    calls.append(
                        ("addmm", lambda a, b, bias, beta=beta, alpha=alpha: torch.addmm(bias, a, b, beta=beta, alpha=alpha), bias)
                    )
            for name, fn, bias in calls:
                expected = fn(mat1, mat2, bias)
                for _ in range(3):  # at once or recorded, then replayed
                    on_device = None if bias is None else bias.to("neuron")
                    got = fn(mat1.to("neuron"), mat2.to("neuron"), on_device).cpu()
                    assert got.shape == expected.shape and got.stride() == expected.stride(), (name, rows, inner, cols)
                    assert torch.equal(bits(got), bits(expected)), (name, rows, inner, cols, layouts, dtype)


def test_linear_layers_equal_the_cpu_bit_for_bit(mode):
    """nn.Linear (weight transposed) and GPT-2's Conv1D (addmm of a [in, out] weight) on a
    token, a batch of tokens and a 3-d input."""
    g = torch.Generator().manual_seed(12)
    linear = torch.nn.Linear(32, 96)
    weight, bias = torch.randn(32, 96, generator=g), torch.randn(96, generator=g)
    for x in [torch.randn(1, 32, generator=g), torch.randn(5, 32, generator=g), torch.randn(2, 3, 32, generator=g)]:
        expected = [linear(x), torch.addmm(bias, x.view(-1, 32), weight), F.linear(x, linear.weight)]
        moved = linear.to("neuron")
        xd = x.to("neuron")
        got = [moved(xd), torch.addmm(bias.to("neuron"), xd.view(-1, 32), weight.to("neuron")), F.linear(xd, moved.weight)]
        linear.to("cpu")
        for e, r in zip(expected, got):
            assert torch.equal(bits(r.detach().cpu()), bits(e.detach())), tuple(x.shape)


def test_matmul_inputs_the_blas_path_declines_still_equal_the_cpu(mode):
    """Reduced precision, integers, complex numbers, strides BLAS does not take (ATen copies
    first), empty products, another precision setting for float matmuls: ATen's kernel, with
    ATen's results and errors."""
    g = torch.Generator().manual_seed(13)
    a, b, bias = torch.randn(4, 6, generator=g), torch.randn(6, 5, generator=g), torch.randn(5, generator=g)
    cases = [
        lambda a, b, bias: a.half() @ b.half(),
        lambda a, b, bias: torch.addmm(bias.bfloat16(), a.bfloat16(), b.bfloat16()),
        lambda a, b, bias: (a * 10).long() @ (b * 10).long(),
        lambda a, b, bias: torch.complex(a, a) @ torch.complex(b, b),
        lambda a, b, bias: a[:, ::2] @ b[::2],  # strided: ATen copies mat1 first
        lambda a, b, bias: torch.addmm(bias, a[:, :0], b[:0]),  # an empty product: the bias scaled
        lambda a, b, bias: torch.addmm(bias, a[:0], b),
        lambda a, b, bias: torch.addmm(bias, a, b, beta=1.5, alpha=True),
    ]
    for i, fn in enumerate(cases):
        expected = fn(a, b, bias)
        got = fn(a.to("neuron"), b.to("neuron"), bias.to("neuron")).cpu()
        assert got.dtype == expected.dtype and got.shape == expected.shape, i
        assert torch.equal(bits(got.resolve_conj()), bits(expected.resolve_conj())), i
    ad, bd = a.to("neuron"), b.to("neuron")
    # Eager mode records an op and raises its error when its launch runs: read the result.
    with pytest.raises(RuntimeError, match="same dtype"):
        (ad @ bd.double()).cpu()
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        (ad @ ad).cpu()
    with pytest.raises(RuntimeError, match="overflow"):
        torch.addmm(bias.to("neuron"), ad, bd, alpha=1e300).cpu()
    torch.testing.assert_close((ad @ bd).cpu(), a @ b, rtol=0, atol=0)  # the runtime goes on


def test_matmul_under_reduced_float32_precision_equals_the_cpu():
    """With oneDNN allowed bf16 for float matmuls, ATen may leave BLAS: the device follows."""
    g = torch.Generator().manual_seed(14)
    a, b = torch.randn(8, 64, generator=g), torch.randn(64, 32, generator=g)
    before = torch.backends.mkldnn.matmul.fp32_precision
    try:
        torch.backends.mkldnn.matmul.fp32_precision = "bf16"
        with neuron_lab.mode("blocking"):
            kernels = trace.device_counters()["host_kernel_ops"]
            got = (a.to("neuron") @ b.to("neuron")).cpu()
            assert trace.device_counters()["host_kernel_ops"] == kernels
        assert torch.equal(bits(got), bits(a @ b))
    finally:
        torch.backends.mkldnn.matmul.fp32_precision = before


def test_matmul_blas_path_runs_where_it_applies_and_only_there():
    x, w, bias = torch.randn(1, 32, device="neuron"), torch.randn(96, 32, device="neuron"), torch.randn(96, device="neuron")
    xd, wd, xh, wh = x.double(), w.double(), x.half(), w.half()
    with neuron_lab.mode("blocking"):
        assert runs(lambda: F.linear(x, w, bias)) == 1
        assert runs(lambda: x @ w.t()) == 1
        assert runs(lambda: torch.addmm(bias, x, w.t(), beta=0)) == 1
        assert runs(lambda: xd @ wd.t()) == 1
        assert runs(lambda: x[:, ::2] @ w.t()[::2]) == 0
        assert runs(lambda: xh @ wh.t()) == 0


# ---- index_select of contiguous tensors (dense_index_select.cpp) -----------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_index_select_equals_the_cpu_bit_for_bit(mode, dtype):
    g = torch.Generator().manual_seed(17)
    table = (torch.randn(50, 8, generator=g) * 100).to(dtype)
    if dtype.is_floating_point:
        table[3, 2] = float("nan")
    cube = (torch.randn(4, 6, 5, generator=g) * 100).to(dtype)
    cases = [
        (table, 0, torch.tensor([3, 0, 49, 3])),  # embedding rows, repeated
        (table, 0, torch.tensor([7], dtype=torch.int32)),
        (table, 0, torch.tensor(5)),  # a 0-d index
        (table, 1, torch.tensor([7, 0])),  # columns
        (table, -1, torch.tensor([1, 1, 1])),
        (cube, 1, torch.tensor([5, 2])),  # a middle dim
        (table[:0], 1, torch.tensor([0])),  # empty self
        (table, 0, torch.tensor([], dtype=torch.long)),  # empty index
    ]
    for self, dim, index in cases:
        expected = torch.index_select(self, dim, index)
        for _ in range(3):  # at once or recorded, then replayed
            got = torch.index_select(self.to("neuron"), dim, index.to("neuron")).cpu()
            assert got.shape == expected.shape and got.stride() == expected.stride(), (tuple(self.shape), dim)
            assert torch.equal(bits(got) if dtype != torch.bool else got, bits(expected) if dtype != torch.bool else expected)


def test_index_select_inputs_the_block_copy_declines_still_equal_the_cpu(mode):
    g = torch.Generator().manual_seed(18)
    table = torch.randn(10, 6, generator=g)
    index = torch.tensor([4, 1])
    cases = [
        (table.t(), 0, index),  # not contiguous
        (table, 0, torch.tensor([0, 2, 4, 6])[::2]),  # a strided index
        (table, 0, torch.tensor([[1, 2]]).view(-1)),
        (torch.complex(table, table).conj(), 0, index),
        (torch.randn(40000, 2, generator=g), 0, torch.arange(39999, -1, -1)),  # past GRAIN_SIZE
    ]
    for self, dim, idx in cases:
        expected = torch.index_select(self, dim, idx)
        got = torch.index_select(self.to("neuron"), dim, idx.to("neuron")).cpu()
        assert got.stride() == expected.stride() and torch.equal(got.resolve_conj(), expected.resolve_conj())
    t = table.to("neuron")
    with pytest.raises(IndexError, match="out of range"):
        torch.index_select(t, 0, torch.tensor([10], device="neuron")).cpu()
    with pytest.raises(IndexError, match="out of range"):
        torch.index_select(t, 0, torch.tensor([-1], device="neuron")).cpu()
    with pytest.raises(RuntimeError, match="int32 or int64"):
        torch.index_select(t, 0, torch.tensor([1.0], device="neuron")).cpu()
    assert torch.equal(torch.index_select(t, 0, index.to("neuron")).cpu(), table[[4, 1]])  # the runtime goes on


def test_index_select_block_copy_runs_where_it_applies_and_only_there():
    embedding = torch.nn.Embedding(100, 32).to("neuron")
    ids = torch.tensor([[5, 9, 9]], device="neuron")
    with neuron_lab.mode("blocking"), torch.no_grad():
        assert runs(lambda: embedding(ids)) == 1
        assert runs(lambda: torch.index_select(embedding.weight.t(), 1, ids.view(-1))) == 0


# ---- neg, rsqrt and pow by 2, 3, -1, -0.5 (small_unary.cpp) ----------------------------------

UNARY = {
    "neg": torch.neg,
    "rsqrt": torch.rsqrt,
    "pow 2": lambda t: t.pow(2),
    "pow 2.0": lambda t: torch.pow(t, 2.0),
    "pow 3": lambda t: t**3,
    "pow -1": lambda t: t.pow(-1),
    "pow -0.5": lambda t: t.pow(-0.5),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_small_unary_equals_the_cpu_bit_for_bit(mode, dtype):
    """NaNs of both signs, signed zeros, subnormals, infinities and negative numbers (rsqrt's
    NaN), in vector blocks and tails: every bit as ATen's vector and scalar loops give it."""
    for n in [1, 7, 16, 33, 1000]:
        x = special_floats(dtype, n) * (1 if n < 33 else 3)
        for shape in [(n,), (1, 1, n)] + ([()] if n == 1 else []):
            t = x.reshape(shape)
            for name, fn in UNARY.items():
                expected = fn(t)
                for _ in range(3):  # at once or recorded, then replayed
                    got = fn(t.to("neuron")).cpu()
                    assert got.shape == expected.shape and got.stride() == expected.stride(), (name, shape)
                    assert torch.equal(bits(got), bits(expected)), (name, dtype, shape)


def strided_views(count: int, seed: int) -> list[torch.Tensor]:
    """Views that are neither contiguous nor dense: permuted, sliced and stepped, with size-1
    dims among them (whose strides TensorIterator still sorts by), plus the rotary embedding's
    halves of a transposed query at one and at five tokens."""
    g = torch.Generator().manual_seed(seed)
    rng = __import__("random").Random(seed)
    views = []
    for batch, tokens, heads, dim in [(1, 1, 4, 8), (1, 1, 2, 8), (1, 5, 4, 8), (2, 5, 4, 8)]:
        q = special_floats(torch.float32, batch * tokens * heads * dim).view(batch, tokens, heads, dim)
        views += [q.transpose(1, 2)[..., dim // 2 :], q.transpose(1, 2)[..., : dim // 2]]
    while len(views) < count:
        nd = rng.randint(1, 5)
        base = torch.randn([2 * rng.randint(1, 4) for _ in range(nd)], generator=g, dtype=torch.float64)
        view = base.permute(*rng.sample(range(nd), nd))[
            tuple(slice(rng.randint(0, 1), None, rng.choice([1, 2])) for _ in range(nd))
        ]
        if view.numel() > 0 and not view.is_contiguous():
            views.append(view)
    return views


def on_device(view: torch.Tensor) -> torch.Tensor:
    """The same view (sizes, strides, offset) of a device copy of its base."""
    base = view._base if view._base is not None else view
    return base.to("neuron").as_strided(view.shape, view.stride(), view.storage_offset())


def test_small_unary_of_strided_views_equals_the_cpu_layout_and_bits(mode):
    """A strided input that is not dense gets ATen's result layout (TensorIterator's, in the
    order of the input's strides, size-1 dims included) and its bits."""
    for i, view in enumerate(strided_views(60, seed=23)):
        device_view = on_device(view)
        assert device_view.stride() == view.stride()
        for name, fn in UNARY.items():
            expected = fn(view)
            got = fn(device_view).cpu()
            assert got.shape == expected.shape and got.stride() == expected.stride(), (i, name, view.stride())
            assert torch.equal(bits(got), bits(expected)), (i, name)


def test_small_unary_inputs_it_declines_still_equal_the_cpu(mode):
    """Exponents ATen computes otherwise (sqrt for 0.5, a double division for -2, std::pow,
    fill and copy for 0 and 1), integer and reduced-precision tensors, dense permuted,
    broadcast, overlapping and conjugate inputs, and more than GRAIN_SIZE elements: ATen's
    kernel."""
    x = special_floats(torch.float32, 40).view(4, 10)
    big = torch.randn(40000, generator=torch.Generator().manual_seed(19)).abs() + 0.5
    cases = [
        lambda t: t.pow(0.5),
        lambda t: t.pow(-2),
        lambda t: t.pow(4),
        lambda t: t.pow(0),
        lambda t: t.pow(1),
        lambda t: (t.nan_to_num() * 10).long().pow(2),
        lambda t: t.half().pow(2),
        lambda t: t.bfloat16().neg(),
        lambda t: t.t().rsqrt(),
        lambda t: t[:, ::2].neg(),
        lambda t: t[:1].expand(3, 10).rsqrt(),
        lambda t: t.as_strided((3, 4), (2, 1)).neg(),
        lambda t: t.view(2, 2, 10).permute(2, 0, 1).neg(),
        lambda t: torch.complex(t, t).conj().neg(),
        lambda t: t.pow(2 + 0j),
    ]
    for i, fn in enumerate(cases):
        expected = fn(x)
        got = fn(x.to("neuron")).cpu()
        assert got.dtype == expected.dtype and got.stride() == expected.stride(), i
        as_bytes = [r.resolve_conj().contiguous().view(torch.uint8) for r in (got, expected)]
        assert torch.equal(*as_bytes), i
    assert torch.equal(big.to("neuron").pow(-0.5).cpu(), big.pow(-0.5))


def test_small_unary_runs_where_it_applies_and_only_there():
    x = torch.randn(1, 1, 64, device="neuron")
    xd, xh = x.double(), x.half()
    with neuron_lab.mode("blocking"):
        for fn in UNARY.values():
            assert runs(lambda: fn(x)) == 1
            assert runs(lambda: fn(xd)) == 1
        assert runs(lambda: x.pow(0.5)) == 0
        assert runs(lambda: x.pow(-2)) == 0
        assert runs(lambda: xh.neg()) == 0
        assert runs(lambda: x.transpose(0, 2).neg()) == 0  # dense: ATen keeps its strides
        rotary = torch.randn(1, 1, 4, 8, device="neuron").transpose(1, 2)
        assert runs(lambda: rotary[..., 4:].neg()) == 1
        assert runs(lambda: x[..., ::2].rsqrt()) == 1
        assert runs(lambda: x[0, :1].expand(3, 64).neg()) == 0  # broadcast
        assert runs(lambda: x.view(64).as_strided((8, 8), (4, 1)).neg()) == 0  # overlapping


# ---- isin of small integer tensors (small_isin.cpp) ------------------------------------------


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_small_isin_equals_the_cpu(mode, dtype):
    """A decoding loop's end-of-sequence checks, and the edges of ATen's choice between its
    scan and its sorting algorithm (the answers agree for integers)."""
    g = torch.Generator().manual_seed(20)
    ids = torch.randint(0, 50, (3, 17), generator=g).to(dtype)
    cases = [
        (ids[:, -1:].contiguous(), torch.tensor([2], dtype=dtype)),  # the newest ids against one EOS
        (ids, torch.tensor([7, 0, 49, 7], dtype=dtype)),  # repeated test elements
        (ids, torch.arange(0, 50, 3, dtype=dtype)),  # enough test elements for ATen's sorting path
        (ids[0, 0].clone(), torch.tensor([ids[0, 0].item()], dtype=dtype)),  # a 0-d element
        (ids, torch.tensor([], dtype=dtype)),  # no test elements
        (torch.tensor([-(2**31), 2**31 - 1], dtype=dtype), torch.tensor([2**31 - 1], dtype=dtype)),
    ]
    for elements, tests in cases:
        for invert in (False, True):
            expected = torch.isin(elements, tests, invert=invert)
            for _ in range(3):  # at once or recorded, then replayed
                got = torch.isin(elements.to("neuron"), tests.to("neuron"), invert=invert).cpu()
                assert got.dtype == torch.bool and got.shape == expected.shape and got.stride() == expected.stride()
                assert torch.equal(got, expected), (tuple(elements.shape), tests.tolist(), invert)


def test_small_isin_inputs_it_declines_still_equal_the_cpu(mode):
    x = torch.tensor([[0.0, -0.0, float("nan"), 1.5]])
    ids = torch.arange(12).view(3, 4)
    cases = [
        (x, torch.tensor([0.0, float("nan")])),  # floats: signed zeros and NaNs as ATen compares them
        (ids, torch.tensor([3, 5], dtype=torch.int32)),  # promotion
        (ids.t(), torch.tensor([3, 5])),  # not contiguous
        (ids, torch.arange(100)),  # more test elements than the scan takes
    ]
    for elements, tests in cases:
        expected = torch.isin(elements, tests)
        assert torch.equal(torch.isin(elements.to("neuron"), tests.to("neuron")).cpu(), expected)


def test_small_isin_runs_where_it_applies_and_only_there():
    ids, eos = torch.tensor([[5, 9, 2]], device="neuron"), torch.tensor([2, 0], device="neuron")
    floats = ids.float()
    with neuron_lab.mode("blocking"):
        assert runs(lambda: torch.isin(ids, eos)) == 1
        assert runs(lambda: torch.isin(ids[:, -1], eos, invert=True)) == 1
        assert runs(lambda: torch.isin(floats, floats)) == 0


# ---- where of small operands (small_where.cpp) -----------------------------------------------

WHERE_SHAPES = [  # condition, self, other
    ((99,), (), (1, 99)),  # a logits processor's mask over a [1, vocab] row
    ((2, 3, 17), (2, 3, 17), (17,)),
    ((2, 3, 17), (3, 17), (17,)),  # three periods: runs of 17, each operand at its own offset
    ((2, 3, 1), (2, 3, 17), (1, 17)),  # a mask per row, repeated over the row
    ((3, 1), (1, 3, 1), (4,)),  # rows against columns: no operand of the result's shape
    ((3, 17), (17,), ()),
    ((1,), (3, 9), (3, 9)),
    ((3, 9), (1, 1, 9), ()),
    ((5,), (), ()),
    ((), (1, 1), (1,)),
]


def where_operands(shapes, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    condition = torch.rand(shapes[0], generator=g) > 0.5
    values = []
    for k, shape in enumerate(shapes[1:]):
        n = math.prod(shape)
        if dtype.is_floating_point:
            t = special_floats(dtype, n + 3 * k)[3 * k :]
        elif dtype == torch.bool:
            t = torch.rand(n, generator=g) > 0.5
        else:
            t = torch.randint(-(2**15), 2**15, (n,), generator=g).to(dtype)
        values.append(t.reshape(shape))
    return condition, *values


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool])
def test_small_where_equals_the_cpu_bit_for_bit(mode, dtype):
    """Every broadcast the kernel takes (trailing blocks, single elements, 0-d tensors): the
    chosen elements' bits (NaN payloads, -0.0), the result's shape, strides and dtype."""
    for i, shapes in enumerate(WHERE_SHAPES):
        condition, a, b = where_operands(shapes, dtype, seed=i)
        expected = torch.where(condition, a, b)
        for _ in range(3):  # at once or recorded, then replayed
            got = torch.where(condition.to("neuron"), a.to("neuron"), b.to("neuron")).cpu()
            assert got.shape == expected.shape and got.stride() == expected.stride(), shapes
            assert got.dtype == expected.dtype and torch.equal(bits(got), bits(expected)), (shapes, dtype)


def test_small_where_inputs_it_declines_still_equal_the_cpu(mode):
    """Promotion (a 0-d double tensor with a float one gives float), a condition repeated along an inner dim, strided operands, complex values and more than GRAIN_SIZE elements run ATen's
    kernel; a 0-d CPU tensor among device tensors is read where it is."""
    condition, a, b = where_operands(((4, 9), (4, 9), (4, 9)), torch.float32, seed=5)
    big = torch.rand(40000, generator=torch.Generator().manual_seed(2)) > 0.5
    cases = [
        lambda c, x, y: torch.where(c, x, y.double()),
        lambda c, x, y: torch.where(c, x, torch.tensor(2.5, dtype=torch.float64, device=x.device)),
        lambda c, x, y: torch.where(c[:, :1], x, y),
        lambda c, x, y: torch.where(c, x.t().contiguous().t(), y),
        lambda c, x, y: torch.where(c.t(), x.t(), y.t()),
        lambda c, x, y: torch.where(c, torch.complex(x, y), torch.complex(y, x)),
        lambda c, x, y: torch.where(c, x, 7.0),
    ]
    for i, fn in enumerate(cases):
        expected = fn(condition, a, b)
        got = fn(condition.to("neuron"), a.to("neuron"), b.to("neuron")).cpu()
        assert got.dtype == expected.dtype and got.stride() == expected.stride(), i
        assert torch.equal(got.isnan(), expected.isnan()) and torch.equal(got.nan_to_num(), expected.nan_to_num()), i
    cpu_scalar = torch.tensor(-1.5)
    expected = torch.where(condition, cpu_scalar, b)
    assert torch.equal(torch.where(condition.to("neuron"), cpu_scalar, b.to("neuron")).cpu().nan_to_num(),
                       expected.nan_to_num())
    ones = torch.ones(40000)
    assert torch.equal(torch.where(big.to("neuron"), ones.to("neuron"), -ones.to("neuron")).cpu(),
                       torch.where(big, ones, -ones))
    with warnings.catch_warnings():  # ATen's kernel, with its deprecation warning (once a process)
        warnings.simplefilter("ignore")
        got = torch.where(condition.to(torch.uint8).to("neuron"), a.to("neuron"), b.to("neuron"))
    assert torch.equal(got.cpu().nan_to_num(), torch.where(condition, a, b).nan_to_num())
    with pytest.raises(RuntimeError, match="must match the size"):
        torch.where(condition.to("neuron"), a.to("neuron"), b[:, :5].to("neuron"))
    assert torch.equal(torch.where(condition.to("neuron"), a.to("neuron"), 0.0).cpu().nan_to_num(),
                       torch.where(condition, a, 0.0).nan_to_num())  # the runtime goes on


def test_small_where_runs_where_it_applies_and_only_there():
    condition = torch.rand(99, device="neuron") > 0.5
    row = torch.randn(1, 99, device="neuron")
    masked = torch.tensor(float("-inf"), device="neuron")
    with neuron_lab.mode("blocking"):
        assert runs(lambda: torch.where(condition, masked, row)) == 1
        row_double = row.double()
        assert runs(lambda: torch.where(condition, row, row_double)) == 0
        assert runs(lambda: torch.where(condition.view(99, 1), row, masked)) == 1  # each element over a row
        assert runs(lambda: torch.where(condition.view(1, 99), row.view(99), row)) == 1
        assert runs(lambda: torch.where(condition, row.expand(2, 99).t().t(), masked)) == 0  # strided


# ---- fill_ of small tensors (small_fill.cpp) -------------------------------------------------


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int8, torch.bool]
)
def test_small_fill_equals_the_cpu(mode, dtype):
    """torch.full, ones, zeros, scalar_tensor and fill_ itself: the bytes of value.to<T>(),
    infinities, NaN and values that round included."""
    values = [0, 1, -3, True, 2.5, -0.0, 1 / 3, 65504.5, float("inf"), float("nan")]
    for value in values:
        if not dtype.is_floating_point and (isinstance(value, float) and not math.isfinite(value)):
            continue
        for shape in [(), (1,), (3, 4), (1, 5, 1)]:
            try:
                expected = torch.full(shape, value, dtype=dtype)
            except RuntimeError as error:  # out of the dtype's range: ATen's error, nothing written
                with pytest.raises(RuntimeError, match=re.escape(str(error).splitlines()[0])):
                    torch.full(shape, value, dtype=dtype, device="neuron").cpu()
                continue
            for _ in range(2):
                got = torch.full(shape, value, dtype=dtype, device="neuron").cpu()
                assert got.shape == expected.shape and torch.equal(bits(got), bits(expected)), (value, shape)
            t = torch.empty(shape, dtype=dtype, device="neuron")
            assert t.fill_(value) is t and torch.equal(bits(t.cpu()), bits(expected)), (value, shape)
    for make in (torch.ones, torch.zeros):
        assert torch.equal(make(2, 3, dtype=dtype, device="neuron").cpu(), make(2, 3, dtype=dtype))
    assert torch.equal(bits(torch.scalar_tensor(-0.0, device="neuron").cpu()), bits(torch.scalar_tensor(-0.0)))


def test_small_fill_errors_and_declined_inputs_equal_the_cpu(mode):
    """An out-of-range value raises ATen's error and writes nothing; strided views, complex
    values and more than GRAIN_SIZE elements run ATen's kernel."""
    t = torch.arange(4, dtype=torch.int8, device="neuron")
    with pytest.raises(RuntimeError, match="without overflow"):
        t.fill_(300)
        torch.neuron.synchronize()  # where the op was recorded, its error comes at the wait
    with pytest.raises(RuntimeError, match="without overflow"):
        torch.arange(4, dtype=torch.int8).fill_(300)
    try:  # run at once, the op raised before writing; recorded, what it writes is marked so
        assert torch.equal(t.cpu(), torch.arange(4, dtype=torch.int8))
    except RuntimeError as error:
        assert mode != "blocking" and "never computed" in str(error)
    again = torch.arange(4, dtype=torch.int8, device="neuron").fill_(3)
    assert torch.equal(again.cpu(), torch.full((4,), 3, dtype=torch.int8))
    x = torch.zeros(4, 6)
    xd = x.to("neuron")
    x[:, ::2].fill_(7)
    xd[:, ::2].fill_(7)
    assert torch.equal(xd.cpu(), x)
    c = torch.zeros(3, dtype=torch.complex64)
    assert torch.equal(c.to("neuron").fill_(1 + 2j).cpu(), c.fill_(1 + 2j))
    assert torch.equal(torch.full((40000,), 0.1, device="neuron").cpu(), torch.full((40000,), 0.1))


def test_small_fill_runs_where_it_applies_and_only_there():
    with neuron_lab.mode("blocking"):
        assert runs(lambda: torch.full((1,), False, device="neuron")) == 1
        assert runs(lambda: torch.empty(3, 4, device="neuron").fill_(2.0)) == 1
        x = torch.zeros(4, 6, device="neuron")
        assert runs(lambda: x[:, ::2].fill_(1)) == 0
        assert runs(lambda: torch.zeros(3, dtype=torch.complex64, device="neuron").fill_(1j)) == 0
        assert runs(lambda: torch.zeros(3, dtype=torch.float16, device="neuron").fill_(1)) == 0


# ---- integer arange (small_arange.cpp) -------------------------------------------------------

ARANGES = [(99,), (1,), (0,), (5, 17, 3), (17, 5, -3), (-7, 7, 2), (3, 4), (4, 4), (-5, -20, -4), (0, 100, 7)]


def test_small_arange_equals_the_cpu(mode):
    """Sizes by ATen's integer formula (empty, one, remainders of the step, negative steps)
    and values start + step * i; out= tensors of that size or empty, resized as ATen resizes."""
    for args in ARANGES:
        expected = torch.arange(*args)
        for _ in range(2):
            got = torch.arange(*args, device="neuron").cpu()
            assert got.dtype == expected.dtype == torch.int64 and torch.equal(got, expected), args
        empty = torch.empty(0, dtype=torch.int64, device="neuron")
        assert torch.arange(*args, out=empty) is empty and torch.equal(empty.cpu(), expected), args
        sized = torch.full(expected.shape, -1, dtype=torch.int64, device="neuron")
        assert torch.arange(*args, out=sized) is sized and torch.equal(sized.cpu(), expected), args


def test_small_arange_inputs_it_declines_and_errors_equal_the_cpu(mode):
    """Floating bounds and results, int32 and big bounds run ATen's kernel, an out= of
    another size is resized with ATen's warning, and a zero or inconsistent step raises ATen's
    error with the runtime going on."""
    cases = [
        lambda **kw: torch.arange(0.5, 3, **kw),
        lambda **kw: torch.arange(5, dtype=torch.float32, **kw),
        lambda **kw: torch.arange(2, 9, 2, dtype=torch.int32, **kw),
        lambda **kw: torch.arange(2**60, 2**60 + 5, **kw),
        lambda **kw: torch.arange(0, 1, 0.25, **kw),
    ]
    for i, fn in enumerate(cases):
        expected = fn()
        got = fn(device="neuron").cpu()
        assert got.dtype == expected.dtype and torch.equal(got, expected), i
    wrong = torch.empty(3, dtype=torch.int64, device="neuron")
    with pytest.warns(UserWarning, match="will be resized"):
        torch.arange(10, out=wrong)
    assert torch.equal(wrong.cpu(), torch.arange(10))
    for args, message in [((0, 5, 0), "step must be nonzero"), ((5, 0, 1), "inconsistent with step sign")]:
        with pytest.raises(RuntimeError, match=message):
            torch.arange(*args, device="neuron").cpu()
    assert torch.equal(torch.arange(4, device="neuron").cpu(), torch.arange(4))  # the runtime goes on


def test_small_arange_runs_where_it_applies_and_only_there():
    with neuron_lab.mode("blocking"):
        assert runs(lambda: torch.arange(99, device="neuron")) == 1
        assert runs(lambda: torch.arange(3, 30, 4, device="neuron")) == 1
        assert runs(lambda: torch.arange(5, dtype=torch.float32, device="neuron")) == 0
        assert runs(lambda: torch.arange(0.5, 3, device="neuron")) == 0
        assert runs(lambda: torch.arange(40000, device="neuron")) == 0  # more than GRAIN_SIZE


# ---- bitwise and / or / not (small_bitwise.cpp) ----------------------------------------------

BITWISE_SHAPES = [((1,), (1,)), ((), ()), ((5, 7), (7,)), ((2, 1, 9), (2, 1, 9)), ((33,), ())]


def bitwise_operand(shape, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    info = torch.iinfo(dtype)
    t = torch.randint(-(2**30), 2**30, shape, generator=g, dtype=torch.int64).to(dtype)
    if t.numel() > 2:
        t.view(-1)[:2] = torch.tensor([info.min, info.max], dtype=dtype)
    return t


@pytest.mark.parametrize("dtype", [torch.bool, torch.int32, torch.int64])
def test_small_bitwise_equals_the_cpu(mode, dtype):
    """&, | and ~ of bool masks (logical, as ATen's bool kernels) and integers (the extremes
    among them), broadcast as the kernel takes them, in either operand order."""
    g = torch.Generator().manual_seed(11)
    for shapes in BITWISE_SHAPES:
        a, b = (bitwise_operand(s, dtype, g) for s in shapes)
        for x, y in ((a, b), (b, a)):
            for fn in (torch.bitwise_and, torch.bitwise_or):
                expected = fn(x, y)
                got = fn(x.to("neuron"), y.to("neuron")).cpu()
                assert got.dtype == expected.dtype and got.stride() == expected.stride(), shapes
                assert torch.equal(got, expected), (fn.__name__, shapes, dtype)
        for x in (a, b):
            assert torch.equal(torch.bitwise_not(x.to("neuron")).cpu(), torch.bitwise_not(x)), shapes


def test_small_bitwise_inputs_it_declines_still_equal_the_cpu(mode):
    """Promotion (int64 with int32), Python numbers, strided operands, other dtypes and more
    than GRAIN_SIZE elements run ATen's kernel; float operands raise ATen's error."""
    g = torch.Generator().manual_seed(12)
    ids = torch.randint(0, 9, (4, 6), generator=g)
    mask = torch.rand(4, 6, generator=g) > 0.5
    big = torch.rand(40000, generator=g) > 0.5
    cases = [
        lambda i, m: i & i.int(),
        lambda i, m: i | 3,
        lambda i, m: m.t() | m.t(),
        lambda i, m: ~i.to(torch.uint8),
        lambda i, m: ~i[:, ::2],
        lambda i, m: i.to(torch.int16) & i.to(torch.int16),
    ]
    for k, fn in enumerate(cases):
        expected = fn(ids, mask)
        got = fn(ids.to("neuron"), mask.to("neuron")).cpu()
        assert got.dtype == expected.dtype and torch.equal(got, expected), k
    assert torch.equal((big.to("neuron") | ~big.to("neuron")).cpu(), big | ~big)
    with pytest.raises(RuntimeError, match="bitwise_or"):
        torch.bitwise_or(torch.ones(2, device="neuron"), torch.ones(2, device="neuron")).cpu()
    assert torch.equal((mask.to("neuron") | mask.to("neuron")).cpu(), mask)  # the runtime goes on


def test_small_bitwise_runs_where_it_applies_and_only_there():
    done = torch.zeros(1, dtype=torch.bool, device="neuron")
    ids = torch.ones(1, dtype=torch.int64, device="neuron")
    with neuron_lab.mode("blocking"):
        assert runs(lambda: done | done) == 1
        assert runs(lambda: ~done) == 1
        assert runs(lambda: ids & ids) == 1
        assert runs(lambda: ids & done) == 1  # an integer and a bool: the bool promoted
        assert runs(lambda: ids & ids.int()) == 0  # two integer dtypes: ATen's promotion
        assert runs(lambda: ~torch.zeros(4, 4, dtype=torch.bool, device="neuron").t()[::2]) == 0


# ---- argmax over rows and integer eq (small_reduce_compare.cpp) -----------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64])
def test_small_argmax_over_rows_equals_the_cpu(mode, dtype):
    """Greedy search's argmax over a [1, vocab] row and more: ties keep the first index, the
    first NaN wins over everything, infinities and -0.0 / 0.0 ties, keepdim either way."""
    g = torch.Generator().manual_seed(21)
    rows = []
    for shape in [(1, 99), (5,), (3, 4, 17), (2, 1), (1, 1)]:
        if dtype.is_floating_point:
            rows.append(special_floats(dtype, math.prod(shape)).reshape(shape))
            rows.append(torch.randint(-3, 3, shape, generator=g).to(dtype))  # many ties
        else:
            rows.append(torch.randint(-3, 3, shape, generator=g).to(dtype))
    if dtype.is_floating_point:
        rows += [torch.tensor([[0.0, -0.0, 0.0]], dtype=dtype), torch.full((2, 6), float("-inf"), dtype=dtype),
                 torch.tensor([[1.0, float("nan"), 5.0, float("nan")]], dtype=dtype)]
    else:
        info = torch.iinfo(dtype)
        rows.append(torch.tensor([[info.min, info.min], [info.max, info.min]], dtype=dtype))
    for x in rows:
        for keepdim in (False, True):
            expected = torch.argmax(x, dim=-1, keepdim=keepdim)
            got = torch.argmax(x.to("neuron"), dim=-1, keepdim=keepdim).cpu()
            assert got.shape == expected.shape and got.dtype == expected.dtype and torch.equal(got, expected), x


def test_small_argmax_and_eq_inputs_they_decline_still_equal_the_cpu(mode):
    """argmax over all elements or another dim, of strided or half tensors, and its errors for
    an empty or a bool tensor; eq of floats, of out-of-range numbers for int32, of strided tensors."""
    x = special_floats(torch.float32, 40).view(4, 10)
    ids = torch.randint(0, 5, (4, 6), generator=torch.Generator().manual_seed(3), dtype=torch.int32)
    cases = [
        lambda t, i: torch.argmax(t),
        lambda t, i: torch.argmax(t, dim=0),
        lambda t, i: torch.argmax(t.t(), dim=-1),
        lambda t, i: torch.argmax(t.half(), dim=-1),
        lambda t, i: t == 0.5,
        lambda t, i: i == 2**33,
        lambda t, i: i.t() == 2,
        lambda t, i: i.long()[:, ::2] == 1,
    ]
    for k, fn in enumerate(cases):
        expected = fn(x, ids)
        got = fn(x.to("neuron"), ids.to("neuron")).cpu()
        assert got.dtype == expected.dtype and got.shape == expected.shape and torch.equal(got, expected), k
    with pytest.raises(IndexError, match="numel"):
        torch.argmax(torch.empty(0, device="neuron")).cpu()
    with pytest.raises(RuntimeError, match="does not support bool"):
        torch.argmax(ids.to("neuron") > 2, dim=-1).cpu()
    assert torch.equal(torch.argmax(x.to("neuron"), dim=-1).cpu(), torch.argmax(x, dim=-1))  # the runtime goes on


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_small_eq_of_integers_equals_the_cpu(mode, dtype):
    info = torch.iinfo(dtype)
    x = torch.tensor([[0, 1, -1, info.min, info.max, 0]], dtype=dtype)
    for t in (x, x.view(-1), x[0, 0]):  # a 0-d tensor too: a decoding loop's step counter
        for value in (0, 1, -1, info.min, info.max, True):
            expected = t == value
            got = (t.to("neuron") == value).cpu()
            assert got.dtype == torch.bool and got.shape == expected.shape and torch.equal(got, expected), value


def test_small_argmax_and_eq_run_where_they_apply_and_only_there():
    logits = torch.randn(1, 99, device="neuron")
    step = torch.tensor(3, device="neuron")
    with neuron_lab.mode("blocking"):
        assert runs(lambda: torch.argmax(logits, dim=-1)) == 1
        assert runs(lambda: torch.argmax(logits)) == 0
        assert runs(lambda: torch.argmax(logits, dim=0)) == 0
        assert runs(lambda: step == 0) == 1
        assert runs(lambda: logits == 0.5) == 0


# ---- the stopping criteria: any over rows, max, an int64 & a bool (small_reduce_compare.cpp,
# small_bitwise.cpp) ---------------------------------------------------------------------------


def test_small_any_over_rows_and_max_equal_the_cpu(mode):
    """generate()'s stopping criteria every step: any over a row of bool flags (keepdim either
    way, rows all false, all true, mixed, non-0/1 bytes read as true) and max of all elements
    of bool and integer tensors (their extremes)."""
    g = torch.Generator().manual_seed(8)
    flags = [torch.zeros(1, 1, dtype=torch.bool), torch.ones(1, 1, dtype=torch.bool),
             torch.rand(4, 7, generator=g) < 0.1, torch.rand(2, 3, 33, generator=g) < 0.02, torch.zeros(5, dtype=torch.bool),
             torch.tensor([0, 2, 0, 255], dtype=torch.uint8).view(torch.bool).view(2, 2)]
    for x in flags:
        for keepdim in (False, True):
            expected = x.any(-1, keepdim=keepdim)
            got = x.to("neuron").any(-1, keepdim=keepdim).cpu()
            assert got.dtype == expected.dtype and got.shape == expected.shape and got.stride() == expected.stride()
            assert torch.equal(got, expected), (x, keepdim)
    for dtype in (torch.int32, torch.int64):
        info = torch.iinfo(dtype)
        for values in ([[1]], [info.min, info.min], [[3, info.max, -1], [info.min, 0, 2]], [-5, -9]):
            x = torch.tensor(values, dtype=dtype)
            got = x.to("neuron").max().cpu()
            assert got.dtype == dtype and got.shape == () and torch.equal(got, x.max()), values
    for x in flags[:5]:
        assert torch.equal(x.to("neuron").max().cpu(), x.max())


def test_small_any_and_max_inputs_they_decline_still_equal_the_cpu(mode):
    """any of other dims, of floats (NaN counts as true), of uint8 (ATen's uint8 result) and of
    strided rows; max of floats (NaN, signed zeros) and strided tensors; max's error for an
    empty tensor, with the runtime going on."""
    x = torch.tensor([[0.0, float("nan")], [-0.0, 0.0]])
    flags = torch.tensor([[True, False, False], [False, False, True]])
    cases = [
        lambda t, f: f.any(0), lambda t, f: t.any(-1), lambda t, f: f.to(torch.uint8).any(-1),
        lambda t, f: f.t().any(-1), lambda t, f: t.max(), lambda t, f: t[1].max(), lambda t, f: f.long().t().max(),
    ]
    for k, fn in enumerate(cases):
        expected = fn(x, flags)
        got = fn(x.to("neuron"), flags.to("neuron")).cpu()
        assert got.dtype == expected.dtype and got.shape == expected.shape, k
        assert torch.equal(bits(got), bits(expected)), k
    with pytest.raises(RuntimeError, match="numel"):
        torch.empty(0, dtype=torch.int64, device="neuron").max().cpu()
    assert flags.to("neuron").any(-1).cpu().tolist() == [True, True]  # the runtime goes on


@pytest.mark.parametrize("mode", ["adaptive", "eager", "blocking"])
def test_max_and_min_of_an_empty_tensor_raise_as_the_cpu_once_python_metas_are_loaded(mode):
    """With torch._dynamo loaded (any torch.compile earlier in a session), the runtime records
    max() and min() from their Python meta kernels, which take an empty tensor; the out= twins
    a graph replays do not check it and gave the reduction's identity (INT64_MIN) where the CPU
    raises. The check is made at the op."""
    import torch._dynamo  # noqa: F401  (what makes the Python metas used)

    with neuron_lab.mode(mode):
        for reduce in (torch.max, torch.min):
            for dtype in (torch.int64, torch.float32):
                empty = torch.empty(0, dtype=dtype, device="neuron")
                with pytest.raises(RuntimeError, match=rf"{reduce.__name__}\(\): Expected reduction dim"):
                    reduce(empty).cpu()
        x = torch.tensor([3, -2, 7], device="neuron")
        assert (x.max().item(), x.min().item()) == (7, -2)  # the runtime goes on


def test_small_bitwise_of_an_integer_and_a_bool_promotes_as_the_cpu(mode):
    """unfinished_sequences (int64) & ~is_done (bool): ATen promotes the bool to the integer's
    dtype; both orders, broadcast, int32, integer extremes and |."""
    info = torch.iinfo(torch.int64)
    ints = torch.tensor([[1, 0, -1, info.max, info.min, 6]])
    mask = torch.tensor([[True, True, False, True, False, True]])
    for a, b in [(ints, mask), (mask, ints), (ints[0, :1], mask[0, :1]), (ints, mask[:, :1]), (ints.int(), mask),
                 (mask[0, 0], ints)]:
        for op in (torch.bitwise_and, torch.bitwise_or):
            expected = op(a, b)
            got = op(a.to("neuron"), b.to("neuron")).cpu()
            assert got.dtype == expected.dtype and got.shape == expected.shape and got.stride() == expected.stride()
            assert torch.equal(got, expected), (op.__name__, a.dtype, b.dtype, a.shape, b.shape)


def test_the_stopping_criteria_kernels_run_where_they_apply_and_only_there():
    done = torch.tensor([[False]], device="neuron")
    unfinished = torch.ones(1, dtype=torch.int64, device="neuron")
    with neuron_lab.mode("blocking"):
        assert runs(lambda: done.any(-1)) == 1
        assert runs(lambda: done.any(0)) == 0
        assert runs(lambda: unfinished.max()) == 1
        unfinished_float = unfinished.float()
        assert runs(lambda: unfinished_float.max()) == 0  # the float max is ATen's
        assert runs(lambda: unfinished & ~done[0]) == 2  # ~ and the promoting &
        assert runs(lambda: unfinished & 1) == 0  # a Python number: ATen's


# ---- clone and same-device _to_copy as one block copy (unboxed_ops.cpp) ----------------------


def copy_sources() -> list[torch.Tensor]:
    """Dense tensors of several layouts (contiguous, transposed, size-1 dims of other strides,
    0-dim) and dtypes, and ones the block copy leaves to torch: strided, empty, conjugate."""
    g = torch.Generator().manual_seed(30)
    base = torch.randn(2, 3, 4, generator=g)
    return [
        base, base.transpose(0, 2), base.permute(1, 0, 2), with_unit_strides(torch.randn(1, 4, 1, 8, generator=g), {2: 32}),
        torch.tensor(2.5), torch.tensor([[7]]), (base > 0), base.half(), base.to(torch.bfloat16), base.long(),
        torch.arange(12).view(1, 12)[:, -1:], torch.randn(1, 5, generator=g).t(),  # row-major save size-1 dims
        base[:, ::2], torch.empty(0, 3), torch.complex(base, base).conj(),
    ]


def test_clone_and_to_copy_equal_the_cpu(mode):
    """clone (formats preserved, contiguous, channels-last) and _to_copy (copy=True, a new
    dtype): values, dtype and strides equal the CPU's; the conj bit resolves as torch
    resolves it."""
    calls = {
        "clone": lambda t: t.clone(),
        "clone contiguous": lambda t: t.clone(memory_format=torch.contiguous_format),
        "to copy": lambda t: t.to(copy=True),
        "to copy contiguous": lambda t: t.to(copy=True, memory_format=torch.contiguous_format),
        "to own dtype": lambda t: t.to(t.dtype, copy=True),
        "to float64": lambda t: t.to(torch.float64) if not t.is_complex() else t.to(torch.complex128),
    }
    check_calls_equal_the_cpu(copy_sources(), calls, lambda a, b: torch.equal(a.resolve_conj(), b.resolve_conj()))
    x = torch.randn(2, 1, 3, 3)
    assert torch.equal(x.to("neuron").clone(memory_format=torch.channels_last).cpu(), x)


def test_clone_and_to_copy_copy_blocks_where_they_apply_and_only_there():
    x = torch.randn(1, 99, device="neuron")
    ids = torch.arange(12, device="neuron").view(1, 12)[:, -1:]  # generate()'s last token: (12, 1) strides
    with neuron_lab.mode("blocking"):
        assert runs(lambda: x.clone()) == 1
        assert runs(lambda: ids.clone()) == 1
        assert runs(lambda: x.to(copy=True, dtype=torch.float32)) == 1
        assert runs(lambda: x.clone(memory_format=torch.contiguous_format)) == 1  # already contiguous: the same
        # row-major save its size-1 dims: the contiguous result holds the same bytes
        assert runs(lambda: ids.clone(memory_format=torch.contiguous_format)) == 1
        assert runs(lambda: x.t().clone(memory_format=torch.contiguous_format)) == 1
        assert runs(lambda: x.view(9, 11).t().clone(memory_format=torch.contiguous_format)) == 0
        assert runs(lambda: x[:, ::2].clone()) == 0
        assert runs(lambda: x.double()) == 1  # a conversion (small_convert.cpp)
        assert runs(lambda: x.cpu()) == 0
    # the copy is a new tensor: writing it leaves the source as it was
    y = x.clone()
    y.add_(1)
    assert torch.equal(y.cpu(), x.cpu() + 1)


# ---- small dtype conversions: _to_copy to float32 or float64 (small_convert.cpp) -------------


def conversion_sources() -> list[torch.Tensor]:
    """Every dtype the small conversion takes, with values at the edges of what float32 and
    float64 hold (int64 around 2^53, past it where a conversion through double would round
    twice, and the extremes; doubles that overflow float32 or fall below its subnormals; NaNs, signed
    zeros), in several layouts, in vectors long enough for ATen's vector loop, and a tensor
    past GRAIN_SIZE (ATen's own kernel)."""
    g = torch.Generator().manual_seed(31)
    big = 2**53
    ints = torch.tensor([0, 1, -1, 2**24 + 1, -(2**24) - 3, big - 1, big, -big, 2**31 - 1, 12345678901, -7, 99])
    past = torch.tensor([2**60 + 2**36 + 1, big + 1, -(big + 3), 2**63 - 1, -(2**63), 5])
    doubles = special_floats(torch.float64, 40)
    doubles[3], doubles[5], doubles[9] = 1e300, 1e-300, 1.0 + 2.0**-30  # past float32's range, precision
    base = torch.randn(2, 3, 4, generator=g)
    return [
        ints, past, ints.int(), ints.short(), ints.to(torch.int8), ints.to(torch.uint8), base > 0,
        doubles, special_floats(torch.float32, 40), base.transpose(0, 2), base.permute(1, 0, 2).double(),
        with_unit_strides(torch.randn(1, 4, 1, 8, generator=g), {2: 32}).double(), torch.tensor(7),
        torch.arange(8).view(1, 1, 8)[:, :, -1:],  # a Llama step's position
        torch.randint(-(2**40), 2**40, (2001,), generator=g), torch.randint(-9, 9, (1, 37), generator=g).int(),
        torch.arange(70000),
    ]


def test_small_conversions_equal_the_cpu_bit_for_bit(mode):
    """int, bool, float and double tensors to float32 and float64, the format preserved or
    contiguous: dtype, shape, strides and bits equal the CPU's."""
    calls = {
        "float": lambda t: t.float(),
        "double": lambda t: t.double(),
        "float, contiguous": lambda t: t.to(torch.float32, memory_format=torch.contiguous_format),
        "double, copy": lambda t: t.to(torch.float64, copy=True),
    }
    check_calls_equal_the_cpu(conversion_sources(), calls, lambda a, b: torch.equal(bits(a), bits(b)))


def test_small_conversions_run_where_they_apply_and_only_there():
    position = torch.arange(8, device="neuron").view(1, 1, 8)[:, :, -1:]
    x = torch.randn(1, 99, device="neuron")
    past = torch.tensor([2**60 + 2**36 + 1], device="neuron")
    with neuron_lab.mode("blocking"):
        assert runs(lambda: position.float()) == 1
        assert runs(lambda: (x > 0).double()) >= 1
        assert runs(lambda: x.t().double()) == 1  # preserved format: the transposed layout, in one block
        assert runs(lambda: past.float()) == 1
        assert runs(lambda: x.half()) == 0
        assert runs(lambda: position.float().int()) == 1  # float to int: ATen's
        assert runs(lambda: torch.arange(70000, device="neuron").float()) == 0  # past GRAIN_SIZE
        assert runs(lambda: x.view(9, 11).t().to(torch.float64, memory_format=torch.contiguous_format)) == 0


# ---- sum and mean over rows in ATen's order of additions (small_sum.cpp) -------------------


def sum_rows_cases(dtype: torch.dtype) -> list[torch.Tensor]:
    """Rows shorter than a vector, a vector and a tail, four vectors and more, long enough for
    the cascade's second and third levels (16 and 256 steps of four vectors), of values whose
    magnitudes differ so that the order of additions shows in the last bits; special values
    (infinities, NaNs of both signs, -0.0, subnormals) in some rows; a transposed one-token
    tensor (size-1 dims with other strides)."""
    g = torch.Generator().manual_seed(11)
    cases = []
    for rows, row in [(1, 2), (3, 3), (2, 7), (1, 8), (5, 9), (1, 32), (4, 33), (2, 63), (1, 64), (3, 100),
                      (1, 513), (2, 1029), (1, 8200), (1, 32767 - 1)]:
        x = torch.randn(rows, row, generator=g, dtype=torch.float64).mul(
            torch.randn(rows, row, generator=g, dtype=torch.float64).mul(6).exp()).to(dtype)
        cases.append(x)
    cases.append(special_floats(dtype, 40).view(2, 20))
    cases.append(torch.tensor([[-0.0, -0.0, -0.0]], dtype=dtype))
    cases.append(torch.randn(1, 4, 1, 32, generator=g, dtype=dtype).transpose(1, 2))
    return cases


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_small_sum_and_mean_over_rows_equal_the_cpu_bit_for_bit(mode, dtype):
    for x in sum_rows_cases(dtype):
        on_device = same_layout_on_device(x)
        for op in ("sum", "mean"):
            for keepdim in (False, True):
                expected = getattr(torch, op)(x, -1, keepdim=keepdim)
                for _ in range(3):  # at once or recorded, then replayed
                    got = getattr(torch, op)(on_device, dim=x.dim() - 1, keepdim=keepdim).cpu()
                    assert got.shape == expected.shape and got.stride() == expected.stride(), (op, x.shape)
                    assert torch.equal(bits(got), bits(expected)), (op, dtype, x.shape, keepdim)


def test_small_sum_equals_the_cpu_under_each_cpu_capability():
    """ATen's sum kernel is 32 bytes wide under every x86 capability (its AVX512 slot is empty,
    so AVX512 CPUs run the AVX2 kernel): the same bits with ATEN_CPU_CAPABILITY lowered."""
    code = """
        import torch, neuron_lab
        g = torch.Generator().manual_seed(3)
        bad = []
        with neuron_lab.mode("blocking"):
            for row in (5, 8, 37, 300, 5000):
                x = torch.randn(3, row, generator=g).mul(torch.randn(3, row, generator=g).mul(6).exp())
                for op in ("sum", "mean"):
                    if not torch.equal(getattr(x.to("neuron"), op)(-1).cpu().view(torch.int32), getattr(x, op)(-1).view(torch.int32)):
                        bad.append((row, op))
        print(torch.backends.cpu.get_cpu_capability(), bad)
    """
    for capability in ("avx2", "default"):
        result = run_python(code, env={"ATEN_CPU_CAPABILITY": capability})
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.split()[0] == capability.upper() and result.stdout.rstrip().endswith("[]"), result.stdout


def test_small_sum_and_mean_inputs_they_decline_still_equal_the_cpu(mode):
    """Other dims, several dims, all elements, another result dtype, reduced-precision and
    integer tensors, strided rows, rows of one element, empty rows and GRAIN_SIZE elements or
    more (ATen splits those between threads): ATen's kernel."""
    g = torch.Generator().manual_seed(12)
    x = torch.randn(6, 40, generator=g).mul(torch.randn(6, 40, generator=g).mul(6).exp())
    big = torch.randn(2, 20000, generator=g)
    cases = [
        lambda t: t.sum(0), lambda t: t.mean((0, 1)), lambda t: t.sum(), lambda t: t.mean(-1, dtype=torch.float64),
        lambda t: t.sum(-1, dtype=torch.float32), lambda t: t.half().sum(-1), lambda t: t.bfloat16().mean(-1),
        lambda t: t.long().sum(-1), lambda t: t.t().sum(-1), lambda t: t[:, ::2].mean(-1),
        lambda t: t[:, :1].sum(-1), lambda t: t[:, :0].sum(-1), lambda t: t[:, :0].mean(-1),
    ]
    for k, fn in enumerate(cases):
        expected = fn(x)
        got = fn(x.to("neuron")).cpu()
        assert got.dtype == expected.dtype and got.shape == expected.shape and got.stride() == expected.stride(), k
        assert torch.equal(bits(got), bits(expected)) or (got.isnan() & expected.isnan()).all(), k
    for op in ("sum", "mean"):
        assert torch.equal(bits(getattr(big.to("neuron"), op)(-1).cpu()), bits(getattr(big, op)(-1))), op


def test_small_sum_and_mean_run_where_they_apply_and_only_there():
    x = torch.randn(1, 1, 32, device="neuron")
    with neuron_lab.mode("blocking"):
        assert runs(lambda: x.pow(2).mean(-1, keepdim=True)) == 2  # an RMSNorm's pow and mean
        assert runs(lambda: x.sum(-1)) == 1
        x_double = x.double()
        assert runs(lambda: x_double.mean(2)) == 1
        assert runs(lambda: x.sum(-1, dtype=torch.float32)) == 1
        assert runs(lambda: x.mean(-1, dtype=torch.float64)) == 0
        assert runs(lambda: x.sum()) == 0
        assert runs(lambda: x.mean(1)) == 0
        assert runs(lambda: x.half().sum(-1)) == 0
        assert runs(lambda: x.view(4, 8).t().sum(-1)) == 0
        assert runs(lambda: torch.randn(2, 20000, device="neuron").sum(-1)) == 0
