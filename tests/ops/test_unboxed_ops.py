"""The device's unboxed path (neuron_lab/device/csrc/aten/unboxed_ops.cpp): the ops a transformer
and a decoding loop run most skip boxing their arguments when the runtime runs them at once.
They must give the CPU's bits, keep eager's aliasing, out= and error semantics, and leave
the runtime as the boxed fallback would: recording where ops repeat, run at once where not."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import neuron_lab
from neuron_lab import adaptive_eager as ae
from neuron_lab.device.trace import device_counters
from parity import same_bits

pytestmark = pytest.mark.usefixtures("adaptive_runtime")


def unboxed_count() -> int:
    return device_counters()["unboxed_ops"]


def _a(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape).to(dtype)


def _grads(fn):
    """The gradients of fn's sum with respect to each argument, flattened into one tensor: the
    backward's ops run on the arguments' device."""
    def run(*args: torch.Tensor) -> torch.Tensor:
        leaves = [a.detach().requires_grad_(a.is_floating_point()) for a in args]
        wrt = [a for a in leaves if a.requires_grad]
        return torch.cat([g.flatten() for g in torch.autograd.grad(fn(*leaves).sum(), wrt)])
    return run


# Each case: a function of CPU tensors, and the tensors. Every op registered on the unboxed path
# appears, through the functional form users call (which reaches the device's out= kernel).
CASES = {
    "add": (lambda a, b: a + b * 0.5, (_a(3, 5), _a(5))),
    "add_int": (lambda a, b: torch.add(a, b, alpha=3), (torch.arange(12).view(3, 4), torch.arange(4))),
    "sub": (lambda a, b: torch.sub(a, b, alpha=2), (_a(4, 4), _a(4, 1))),
    "mul": (lambda a, b: a * b, (_a(2, 3, 4), _a(3, 1))),
    "div": (lambda a, b: a / (b.abs() + 1), (_a(6), _a(6))),
    "div_floor": (lambda a, b: torch.div(a, b.abs() + 1, rounding_mode="floor"), (_a(6), _a(6))),
    "addmm": (lambda b, x, w: torch.addmm(b, x, w, beta=0.5, alpha=2), (_a(7), _a(5, 3), _a(3, 7))),
    "mm": (lambda x, w: x @ w, (_a(5, 3), _a(3, 7))),
    "mm_transposed": (lambda x, w: x @ w.T, (_a(5, 3), _a(7, 3))),
    "bmm": (lambda x, w: torch.bmm(x, w), (_a(2, 5, 3), _a(2, 3, 4))),
    "baddbmm": (lambda b, x, w: torch.baddbmm(b, x, w, alpha=0.25), (_a(2, 5, 4), _a(2, 5, 3), _a(2, 3, 4))),
    "cat": (lambda a, b: torch.cat([a, b, a], dim=1), (_a(2, 3), _a(2, 5))),
    "cat_mixed_dtypes": (lambda a, b: torch.cat([a, b]), (_a(2, 3), _a(1, 3, dtype=torch.float64))),
    "tanh": (lambda a: torch.tanh(a), (_a(17),)),
    "pow_scalar": (lambda a: a.pow(2), (_a(9),)),
    "pow_tensor": (lambda a, b: a.abs().pow(b), (_a(9), _a(9))),
    "eq_scalar": (lambda a: a.round() == 0, (_a(20),)),
    "eq_tensor": (lambda a, b: a.round() == b.round(), (_a(20), _a(20))),
    "bitwise": (lambda a, b: (a > 0) | (b > 0) & ~(a > b), (_a(30), _a(30))),
    "where": (lambda c, a, b: torch.where(c > 0, a, b), (_a(4, 4), _a(4, 4), _a(4))),
    "gelu": (lambda a: F.gelu(a) + F.gelu(a, approximate="tanh"), (_a(33),)),
    "silu_neg_exp": (lambda a: F.silu(-a).exp(), (_a(33),)),
    "rsqrt_sigmoid": (lambda a: a.abs().rsqrt() * a.sigmoid(), (_a(33),)),
    "softmax": (lambda a: a.softmax(-1) + a.softmax(0), (_a(6, 9),)),
    "sum_mean": (lambda a: a.sum(-1) + a.mean(0), (_a(5, 5),)),
    "argmax": (lambda a: a.argmax(-1), (_a(4, 9),)),
    "cos_sin": (lambda a: a.cos() * 3 + a.sin(), (_a(1, 1, 37),)),  # a rotary table's: Sleef's vector loop and tail
    "any_rows": (lambda a: (a > 1).any(-1) | (a < -1).any(1, keepdim=True).squeeze(1), (_a(4, 6),)),
    "max_all": (lambda a, i: a.max() + i.max(), (_a(3, 7), torch.tensor([[4, -2, 9]]))),
    "index_select": (lambda a: a.index_select(0, torch.tensor([2, 0, 2], device=a.device)), (_a(4, 3),)),
    "embedding": (lambda w, i: F.embedding(i, w), (_a(10, 4), torch.tensor([[1, 9], [0, 1]]))),
    "isin": (lambda a, b: torch.isin(a, b), (torch.arange(10), torch.tensor([3, 7, 11]))),
    "arange": (lambda a: a + torch.arange(2, 2 + a.numel(), device=a.device), (_a(6),)),
    "fill": (lambda a: a.clone().fill_(2.5), (_a(6),)),
    "zeros_like": (lambda a: torch.zeros_like(a) + torch.full_like(a, 3.0), (_a(6),)),
    "layer_norm": (lambda a, w, b: F.layer_norm(a, (8,), w, b, eps=1e-5), (_a(3, 8), _a(8), _a(8))),
    "layer_norm_no_affine": (lambda a: F.layer_norm(a, (4, 8)), (_a(2, 4, 8),)),
    "sdpa": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
             (_a(1, 2, 5, 8), _a(1, 2, 5, 8), _a(1, 2, 5, 8))),
    "tril_zero": (lambda a: a.tril(-1) + a.clone().zero_(), (_a(5, 5),)),
    "isneginf_all_any": (lambda a: torch.cat([torch.isneginf(a / 0.0).flatten(), (a > -1).all(-1), (a > 0).any().view(1),
                                              (a > -5).all().view(1)]), (_a(3, 4),)),
    "layer_norm_tanh_backward": (_grads(lambda a, w, b: F.layer_norm(a, (8,), w, b).tanh()), (_a(3, 8), _a(8), _a(8))),
    "cross_entropy_backward": (_grads(lambda a, t: F.cross_entropy(a, t, ignore_index=2)),
                               (_a(6, 5), torch.tensor([0, 2, 4, 1, 2, 3]))),
    "softmax_backward": (_grads(lambda a, w: a.softmax(-1) * w), (_a(4, 6), _a(6))),
    "embedding_backward": (_grads(lambda w, i: F.embedding(i, w) * 3), (_a(10, 4), torch.tensor([[1, 9], [1, 1]]))),
    "activations_backward": (_grads(lambda a: F.silu(a) + F.gelu(a) + F.gelu(a, approximate="tanh") + a.sigmoid()
                                    + F.relu(a)), (_a(5, 7),)),
    "bf16": (lambda a, b: (a @ b).softmax(-1) * 2, (_a(4, 8, dtype=torch.bfloat16), _a(8, 4, dtype=torch.bfloat16))),
}

# The ops user models call beyond those above (T5's position buckets, masks, clamps, a CNN's
# activations): each case must take no boxed op at all.
USER_MODEL_CASES = {
    "compare": (lambda a, b: torch.stack([a < b, a <= 0.1, a > b, a >= 0.2, a != b, a < 0.3, a.le(b), a.gt(0.0),
                                          a.ge(b), a.ne(0.5)]), (_a(4, 6), _a(4, 6))),
    "unary_math": (lambda a: torch.cat([a.abs().sqrt(), a.abs().log(), a.abs().log1p(), a.abs().log2(), a.reciprocal(),
                                        a.sign(), a.erf(), (a * 3).floor(), (a * 3).ceil(), (a * 3).trunc(), a.exp2(),
                                        a.expm1(), a.relu(), (a / 0.0).nan_to_num(), (a / a.round()).isnan().float(),
                                        a.round().logical_not().float()]), (_a(4, 6),)),
    "binary_math": (lambda a, b: torch.cat([torch.minimum(a, b), torch.maximum(a, b), torch.atan2(a, b),
                                            torch.remainder(a, b.abs() + 0.5), a.clamp(-0.5, 0.5), a.clamp_min(0.1),
                                            torch.lerp(a, b, 0.3), torch.addcmul(a, a, b, value=0.5),
                                            torch.addcdiv(a, a, b.abs() + 1, value=2), 2 ** a]), (_a(4, 6), _a(4, 6))),
    "reductions": (lambda a, i: torch.cat([a.amax(-1), a.amin(0), a.cumsum(1).flatten(), a.gather(1, i).flatten(),
                                           a.triu(1).flatten()]), (_a(4, 6), torch.tensor([[0, 5], [1, 1], [4, 2], [3, 0]]))),
    "activations": (lambda a: torch.cat([F.leaky_relu(a, 0.2), F.softplus(a), F.elu(a), F.mish(a), F.hardsigmoid(a)]),
                    (_a(4, 6),)),
    "masked_fill_relu_": (lambda a: a.clone().masked_fill_(a > 0.5, -1.0).relu_(), (_a(4, 6),)),
    "conv_and_backward": (_grads(lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1).relu()
                                 + F.conv1d(x.flatten(2), w.flatten(2)[:, :, :3], b).sum()),
                          (_a(2, 3, 8, 8), _a(4, 3, 3, 3), _a(4))),
    "sdpa_backward": (_grads(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
                      (_a(1, 2, 5, 8), _a(1, 2, 5, 8), _a(1, 2, 5, 8))),
    # a mixture of experts' routing (topk, sort, scatter), max over a dim, sgn
    "routing_and_sorting": (lambda a, i: torch.cat([
        a.topk(2, dim=-1).values.flatten(), a.topk(3, dim=0, largest=False).indices.flatten().float(),
        a.sort(-1).values.flatten(), a.sort(dim=0, descending=True, stable=True).indices.flatten().float(),
        a.max(-1).values, a.max(0, keepdim=True).indices.flatten().float(),
        a.scatter(1, i, a[:, :2]).flatten(), a.scatter(1, i, 0.5).flatten(),
        a.clone().scatter_(1, i, a[:, 2:4]).flatten(), a.clone().scatter_(1, i, -1.0).flatten(),
        (a * (a.abs() > 0.5)).sgn().flatten()]), (_a(4, 6), torch.tensor([[0, 5], [1, 3], [4, 2], [3, 0]]))),
    "abs_backward": (_grads(lambda a: a.abs() * 3), (_a(5, 7),)),
    # x[idx], x[mask], x[:, idx], x[rows, cols] and their writes (index_put_, accumulating or not), index_add_, flip
    "indexing": (lambda a, i, v: torch.cat([
        a[i].flatten(), a[a > 0.5], a[:, i].flatten(), a[i, i], a.clone().index_put_((i,), v).flatten(),
        a.clone().index_put_((i, i), v[:, 0], accumulate=True).flatten(), a.clone().index_add_(0, i, v, alpha=2).flatten(),
        a.flip(-1).flatten(), a.flip(0, 1).flatten()]),
        (_a(4, 6), torch.tensor([3, 0, 3]), _a(3, 6))),
    "indexing_backward": (_grads(lambda a, v, i: a[i] * v + a[:, i].sum()), (_a(4, 6), _a(3, 6), torch.tensor([3, 0, 3]))),
    # a CNN's and a UNet's: max pooling, group norm, nearest upsampling, with their backward
    "pool_group_norm_upsample_backward": (_grads(lambda x, w, b: F.max_pool2d(x, 2).exp()
                                                 + F.interpolate(F.group_norm(x, 2, w, b), scale_factor=0.5)
                                                 + F.interpolate(x[:, :, ::4, ::4], scale_factor=2.0, mode="nearest")),
                                          (_a(2, 4, 8, 8), _a(4), _a(4))),
    "norms_variance_mse_backward": (_grads(lambda a, b: a.norm() + torch.linalg.vector_norm(a, 1, dim=-1).sum()
                                           + a.var(-1).sum() + F.mse_loss(a, b)), (_a(4, 6), _a(4, 6))),
    # a mixture of experts' grouped matmul over tokens sorted by expert, and its backward; the
    # routing's floor division (perm // top_k)
    "grouped_mm_backward": (_grads(lambda x, w, offs: torch._grouped_mm(x, w, offs=offs).tanh()),
                            (_a(12, 8), _a(3, 8, 4), torch.tensor([4, 4, 12], dtype=torch.int32))),
    "floor_divide": (lambda a, i: torch.cat([(i // 2).float(), (a // 0.3).flatten(), torch.floor_divide(a, a.flip(0))
                                             .flatten(), a.clone().floor_divide_(a.abs() + 0.5).flatten()]),
                     (_a(3, 4), torch.tensor([5, -3, 7, 0]))),
    # an optimizer's per-tensor updates (foreach=False) and a model's in-place clamps
    "in_place_updates": (lambda a, b: torch.cat([
        a.clone().sub_(b, alpha=2), a.clone().div_(b.abs() + 1), a.clone().addcmul_(a, b, value=0.1),
        a.clone().addcdiv_(a, b.abs() + 1, value=-0.5), a.clone().lerp_(b, 0.9), a.abs().sqrt_(), a.clone().exp_(),
        a.clone().clamp_(-0.2, 0.3), a.clone().clamp_min_(0.0)]), (_a(4, 6), _a(4, 6))),
}
CASES.update(USER_MODEL_CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_unboxed_op_gives_the_cpus_bits_when_run_at_once(name: str) -> None:
    fn, args = CASES[name]
    want = fn(*args)
    before = unboxed_count()
    with neuron_lab.mode("blocking"):  # every op runs at once
        got = fn(*(a.to("neuron") for a in args)).cpu()
    assert same_bits(got, want), (name, got, want)
    assert unboxed_count() > before  # the path under test was taken


@pytest.mark.parametrize("name", ["add", "addmm", "layer_norm", "softmax", "cat"])
def test_the_same_ops_recorded_into_graphs_give_the_same_bits(name: str) -> None:
    """While ops repeat they are recorded and replayed, not run by the unboxed path."""
    fn, args = CASES[name]
    want = fn(*args)
    xs = [a.to("neuron") for a in args]
    before = unboxed_count()
    for _ in range(5):
        got = fn(*xs)
        assert same_bits(got.cpu(), want)
    assert unboxed_count() == before
    assert ae.counters()["ops_recorded"] > 0


def test_in_place_ops_see_their_own_aliasing() -> None:
    """x.add_(x) and an out= that is an input: one host storage per neuron storage."""
    x = torch.randn(5, 4)
    with neuron_lab.mode("blocking"):
        n = x.to("neuron")
        n.add_(n, alpha=2)
        torch.mul(n, n, out=n)
        with pytest.raises(RuntimeError, match="single memory location"):  # as on the CPU
            torch.mul(n, n[0], out=n)
        v = n[1:3]  # a view: the kernel writes through it into n
        torch.add(v, n[0], out=v)
        n[:, 1].mul_(n[:, 0])  # an in-place op on a strided view
        with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):  # as on the CPU
            n[0].add_(torch.ones(5, 4, device="neuron"))
        got = n.cpu()
    want = x.clone()
    want.add_(want, alpha=2)
    torch.mul(want, want, out=want)
    with pytest.raises(RuntimeError, match="single memory location"):
        torch.mul(want, want[0], out=want)
    torch.add(want[1:3], want[0], out=want[1:3])
    want[:, 1].mul_(want[:, 0])
    assert same_bits(got, want)


def test_out_arguments_are_resized_and_restrided_as_on_the_cpu() -> None:
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    with neuron_lab.mode("blocking"):
        out = torch.empty(0, device="neuron")
        result = torch.mm(a.to("neuron"), b.to("neuron"), out=out)
        assert result is out and out.shape == (3, 5)
        assert same_bits(out.cpu(), a @ b)
        wrong = torch.empty(2, 2, device="neuron")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.add(a.to("neuron"), 1, out=wrong)  # resizing a non-empty out= warns, as on the CPU
        assert any("resized" in str(w.message) for w in caught), [str(w.message) for w in caught]
        assert wrong.shape == (3, 4) and same_bits(wrong.cpu(), a + 1)
        t = torch.empty(5, 3, device="neuron").T  # a transposed out= keeps its strides
        torch.mm(a.to("neuron"), b.to("neuron"), out=t)
        assert t.stride() == (1, 3) and same_bits(t.cpu(), a @ b)


def test_cpu_scalars_pass_through_and_mixed_devices_get_the_fallbacks_error() -> None:
    a = torch.randn(4)
    with neuron_lab.mode("blocking"):
        before = unboxed_count()
        got = a.to("neuron") * torch.tensor(3.0)  # a CPU 0-dim tensor: allowed, as on CUDA
        got = got + 1  # a Python scalar: the same, wrapped by torch
        assert unboxed_count() == before + 2
        assert same_bits(got.cpu(), a * torch.tensor(3.0) + 1)
        with pytest.raises(RuntimeError, match="found at least two devices, neuron:0 and cpu"):
            a.to("neuron") + torch.randn(4)
        out = torch.empty(4)
        with pytest.raises(RuntimeError, match="argument out in method aten::add.out.*Move them with"):
            torch.add(a.to("neuron"), 1, out=out)
        assert same_bits((a.to("neuron") + 1).cpu(), a + 1)  # the runtime is intact
        assert unboxed_count() == before + 3


def test_a_kernel_error_leaves_the_runtime_and_every_tensor_intact() -> None:
    x = torch.randn(3, 4)
    with neuron_lab.mode("blocking"):
        n = x.to("neuron")
        with pytest.raises(RuntimeError, match="cannot be multiplied"):
            n @ n
        with pytest.raises(RuntimeError):
            torch.cat([n, torch.randn(3, 5, device="neuron")], dim=0)
        assert same_bits(n.cpu(), x)
        assert same_bits((n @ n.T).cpu(), x @ x.T)
    # after an error inside a kernel the runtime records as before
    for _ in range(3):
        assert same_bits((n * 2 + 1).cpu(), x * 2 + 1)
    assert ae.counters()["ops_recorded"] > 0


def test_a_value_never_computed_is_not_read_by_an_unboxed_op() -> None:
    x = torch.randn(64, device="neuron")
    bad = torch.tensor([0, 700], device="neuron")
    never_computed = x[bad] + 1  # index out of range: raised at the next wait
    with pytest.raises(IndexError):
        torch.neuron.synchronize()
    with neuron_lab.mode("blocking"):
        with pytest.raises(RuntimeError, match="never computed"):
            never_computed * 2
        never_computed.fill_(1.0)  # written, not read: allowed, and the value is computed now
        assert same_bits((never_computed * 2).cpu(), torch.full((2,), 2.0))


def test_ops_run_at_once_in_adaptive_mode_take_the_unboxed_path() -> None:
    """A loop whose graphs never repeat: the runtime runs its ops at once, unboxed."""
    w_cpu = torch.randn(8, 8)
    w = w_cpu.to("neuron")
    steps = []
    for n in range(1, 61):  # a new length every step, as generate()'s growing KV cache
        x = torch.randn(n, 8)
        steps.append((x, torch.tanh(x @ w_cpu).softmax(-1).sum(0)))
    before_unboxed, before_at_once = unboxed_count(), ae.counters()["ops_run_at_once"]
    for x, want in steps:
        got = torch.tanh(x.to("neuron") @ w).softmax(-1).sum(0)
        assert same_bits(got.cpu(), want)
    c = ae.counters()
    assert c["graphs_unrepeated"] and c["ops_run_at_once"] > before_at_once
    assert unboxed_count() - before_unboxed > 60


def test_a_module_trains_the_same_through_the_unboxed_path() -> None:
    """Forward and backward of a small transformer block in blocking mode equal the CPU's."""
    torch.manual_seed(1)
    block = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    x = torch.randn(2, 5, 16)
    dev_block = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    dev_block.load_state_dict(block.state_dict())
    dev_block.to("neuron")
    block(x).square().mean().backward()
    with neuron_lab.mode("blocking"):
        dev_block(x.to("neuron")).square().mean().backward()
    for (name, p), q in zip(block.named_parameters(), dev_block.parameters()):
        assert same_bits(q.grad.cpu(), p.grad), name


def test_host_aliases_reused_across_ops_follow_every_change_of_their_tensor() -> None:
    """The path keeps each recent tensor's host alias for the next op. Whatever changes a tensor
    in place between ops (a transpose, a resize, set_, an out= that reshapes it, its memory freed
    and given to another tensor) must give the next op the tensor as it is now."""

    # Ops that hand the CPU kernel host aliases (small add/sub/mul need none: small_arith.cpp).
    def program(x: torch.Tensor, other: torch.Tensor) -> list[torch.Tensor]:
        seen = [x.exp()]
        x.t_()
        seen.append(x.neg())
        x.resize_(6, 6)  # grows the storage: new memory
        x.fill_(0.5)
        seen.append(x / other[:6, :6])
        x.resize_(2, 3)  # shrinks within the same memory
        seen.append(x.sum(0))
        torch.mul(other[:2, :3], 3, out=x)
        seen.append(x.pow(2))
        x.set_(other)  # another tensor's memory
        seen.append(x.mean(1))
        torch.add(other, 1, out=x)  # writes other's memory through x
        seen.append(other.tanh())
        for n in range(1, 12):  # tensors freed and their memory reused at other shapes
            y = torch.ones(n, device=x.device) * n
            seen.append(y.pow(2))
        return seen

    a, b = torch.randn(4, 4), torch.randn(8, 8)
    want = program(a.clone(), b.clone())
    with neuron_lab.mode("blocking"):
        before = unboxed_count()
        got = program(a.to("neuron"), b.to("neuron"))
        assert unboxed_count() - before >= len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert same_bits(g.cpu(), w), i


def recycled_count() -> int:
    return device_counters()["aliases_recycled"]


def test_recycled_host_aliases_take_each_new_tensors_dtype_shape_and_bits() -> None:
    """A miss in the alias cache re-points the slot's old alias at the new tensor instead of
    making one (unboxed_ops.cpp's AliasCache, fallback.cpp's realias). A chain whose fresh
    results change dtype, shape, strides, storage offset and conj bit op after op must give
    the CPU's bits; an alias a kernel still holds, or one an out= kernel resized into memory
    of its own, must not be re-pointed under it."""

    def program(x: torch.Tensor) -> list[torch.Tensor]:
        seen = []
        for i in range(40):
            scaled = x.exp() * (i % 3 + 1)  # float, fresh every step
            ints = (scaled > 1).to(torch.int64).cumsum(0)  # int64
            wide = scaled.t().double().sqrt()  # double, transposed strides
            strided = torch.cat([scaled, scaled])[1::2, 1:]  # storage offset, step
            conj = torch.complex(scaled, -scaled).conj().exp()  # conj bit, complex
            out = torch.empty(0, device=x.device)
            torch.exp(strided, out=out)  # resized into new memory by the kernel
            x = (scaled.log() + strided.sum() * 1e-3).tanh()
            seen += [ints, wide, torch.view_as_real(conj.resolve_conj()), out, x]
        return seen

    start = torch.randn(6, 5)
    want = program(start.clone())
    with neuron_lab.mode("blocking"):
        program(start.to("neuron"))  # fills the cache's slots, whatever ran before this test
        recycled = recycled_count()
        got = program(start.to("neuron"))
        assert recycled_count() - recycled > 50  # the path below is exercised, many times over
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, i
        assert same_bits(g.cpu(), w), i


@pytest.mark.parametrize("grad_mode", ["grad", "no_grad", "inference_mode"])
def test_fresh_results_are_neuron_tensors_like_any_other(grad_mode: str) -> None:
    """A kernel's fresh result becomes the neuron tensor itself (its TensorImpl takes the device
    memory and the neuron keys). It must be indistinguishable from a tensor made on the device in
    the same grad mode: the same dispatch keys, device, memory accounting and autograd."""
    ctx = {"grad": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}[grad_mode]
    a_cpu, b_cpu = torch.randn(3, 4), torch.randn(4)
    with neuron_lab.mode("blocking"), ctx():
        a, b = a_cpu.to("neuron"), b_cpu.to("neuron")
        torch.neuron.synchronize()
        allocated = torch.neuron.memory_allocated()
        before = unboxed_count()
        results = {"add": a + b, "softmax": a.softmax(-1), "mm": a @ a.T, "cat": torch.cat([a, a])}
        made_here = torch.empty(2, device="neuron")
        assert unboxed_count() - before == len(results)
        for name, r in results.items():
            assert r.device == torch.device("neuron", 0), name
            assert torch._C._dispatch_keys(r) == torch._C._dispatch_keys(made_here), name
            assert r.is_inference() == made_here.is_inference(), name
            assert r.untyped_storage().device == r.device, name
        assert torch.neuron.memory_allocated() - allocated >= sum(r.untyped_storage().nbytes() for r in results.values())
        views = results["cat"][1:4].T  # a view of a fresh result shares its memory
        views.mul_(2)
    assert torch.equal(results["cat"].cpu()[1:4], torch.cat([a_cpu, a_cpu])[1:4] * 2)
    assert same_bits(results["add"].cpu(), a_cpu + b_cpu)
    # An adopted storage is the device's in every way: it grows through the device allocator
    # keeping its bytes, and its memory goes back to the device when the last tensor goes.
    grown = results["softmax"].detach().clone() if grad_mode == "grad" else results["softmax"]
    grown.untyped_storage().resize_(grown.untyped_storage().nbytes() * 2)
    assert torch.equal(grown.cpu(), a_cpu.softmax(-1))
    if grad_mode != "grad":
        del results, views, grown, made_here, r  # r: the loop's last result
        torch.neuron.synchronize()
        assert torch.neuron.memory_allocated() == allocated
    if grad_mode == "grad":  # the result takes part in autograd as any neuron tensor does
        w = torch.randn(4, requires_grad=True, device="neuron")
        (results["softmax"] * w).sum().backward()
        assert torch.equal(w.grad.cpu(), a_cpu.softmax(-1).sum(0))


def _boxed_count() -> int:
    """Ops the boxed fallback ran (the unboxed path's count within fallback_ops taken out)."""
    c = device_counters()
    return c["fallback_ops"] - c["unboxed_ops"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_dropout_run_at_once_takes_the_unboxed_path_with_the_cpus_draws(dtype: torch.dtype) -> None:
    """Dropout's steps (neuron::bernoulli_, neuron::dropout_apply, neuron::masked_scale; float16
    takes bernoulli_ and two multiplies) run at once without the boxed fallback, draw from the
    device's generator as the CPU's native_dropout draws from the CPU's, and give its bits,
    forward and backward, with and without an explicit generator."""
    x_cpu = torch.randn(6, 33).to(dtype)
    seeds = [3, 4, 5]
    expected = []
    for seed in seeds:
        torch.manual_seed(seed)
        leaf = x_cpu.clone().requires_grad_(dtype != torch.float16)
        out, mask = torch.native_dropout(leaf, 0.3, True)
        grad = torch.ops.aten.native_dropout_backward(torch.ones_like(out), mask, 1 / 0.7)
        expected.append((out.detach(), mask, grad))
    torch.manual_seed(6)
    cpu_bernoulli = torch.empty(40, dtype=dtype).bernoulli_(0.25, generator=torch.Generator().manual_seed(11))
    with neuron_lab.mode("blocking"):
        x = x_cpu.to("neuron")
        boxed = _boxed_count()
        for seed, (want_out, want_mask, want_grad) in zip(seeds, expected):
            torch.manual_seed(seed)
            out, mask = torch.native_dropout(x, 0.3, True)
            grad = torch.ops.aten.native_dropout_backward(torch.ones_like(out), mask, 1 / 0.7)
            assert same_bits(out.cpu(), want_out) and torch.equal(mask.cpu(), want_mask)
            assert same_bits(grad.cpu(), want_grad)
        explicit = torch.Generator(device="neuron").manual_seed(11)
        got_bernoulli = torch.empty(40, dtype=dtype, device="neuron").bernoulli_(0.25, generator=explicit)
        assert same_bits(got_bernoulli.cpu(), cpu_bernoulli)
        assert _boxed_count() == boxed, "a dropout step took the boxed fallback"


@pytest.mark.parametrize("name", sorted(USER_MODEL_CASES))
def test_user_models_pointwise_ops_take_no_boxed_op(name: str) -> None:
    """Comparisons, math, clamps, reductions and activations run at once on the unboxed path:
    the boxed fallback's stack cost each of them 3 to 4 times the unboxed path's overhead."""
    fn, args = USER_MODEL_CASES[name]
    want = fn(*args)
    inputs = [a.to("neuron") for a in args]
    with neuron_lab.mode("blocking"):
        fn(*inputs)  # first calls settle anything made once (generators, tables)
        boxed = _boxed_count()
        got = fn(*inputs).cpu()
        boxed = _boxed_count() - boxed
    assert same_bits(got, want), (name, got, want)
    assert boxed == 0, f"{name}: {boxed} op(s) took the boxed fallback"


def test_copies_within_a_core_run_at_once_as_the_cpus() -> None:
    """copy_ between neuron tensors of one core, run at once: contiguous bytes, a transposed
    layout, a cast, and views of one storage (ATen's copy sees a partial overlap, and raises)."""
    base_cpu = torch.randn(8, 8)
    with neuron_lab.mode("blocking"):
        base = base_cpu.to("neuron")
        contiguous = torch.empty(8, 8, device="neuron").copy_(base)
        transposed = torch.empty(8, 8, device="neuron").copy_(base.t())
        cast = torch.empty(8, 8, dtype=torch.float64, device="neuron").copy_(base)
        shifted = base.clone()
        shifted[4:].copy_(shifted[:4])
        with pytest.raises(RuntimeError, match="refer to a single memory location"):
            shifted[1:].copy_(shifted[:-1])  # a partial overlap: the CPU's error, nothing written
        clone_of_view = base[:, 2:5].clone()
    want_shifted = base_cpu.clone()
    want_shifted[4:].copy_(want_shifted[:4])
    assert same_bits(contiguous.cpu(), base_cpu)
    assert same_bits(transposed.cpu(), base_cpu.t().contiguous())
    assert same_bits(cast.cpu(), base_cpu.double())
    assert same_bits(shifted.cpu(), want_shifted)
    assert same_bits(clone_of_view.cpu(), base_cpu[:, 2:5].clone())


def test_copies_into_a_core_run_at_once_in_adaptive_mode_as_the_cpus() -> None:
    """In adaptive mode, where ops run at once (shapes that never repeat), a copy from the host
    into a core and a copy within it run at once too, with the CPU's bits: a transposed source,
    a cast, and a destination that a later op reads."""
    w_cpu = torch.randn(8, 8)
    w = w_cpu.to("neuron")
    before = ae.counters()["ops_run_at_once"]
    for n in range(1, 41):  # a new length every step, as generate()'s growing KV cache
        x_cpu = torch.randn(8, n)
        x = torch.empty(n, 8, device="neuron").copy_(x_cpu.t())  # host -> core, transposed
        wide = torch.empty(n, 8, dtype=torch.float64, device="neuron").copy_(x)  # within the core, a cast
        got = torch.tanh(x @ w) + wide.float()
        assert same_bits(got.cpu(), torch.tanh(x_cpu.t() @ w_cpu) + x_cpu.t().double().float())
    c = ae.counters()
    assert c["graphs_unrepeated"] and c["ops_run_at_once"] > before


def test_a_grouped_matmul_runs_whole_without_reading_its_offsets_back() -> None:
    """A mixture of experts' _grouped_mm: its composite kernel run on the device copied the
    offsets to the host (a wait on every call, forward and backward) and ran one matmul per
    group; run whole, as on the CPU, it moves nothing to the host and gives the CPU's bits."""
    fn, args = USER_MODEL_CASES["grouped_mm_backward"]
    want = fn(*args)
    inputs = [a.to("neuron") for a in args]
    for mode in ("blocking", "adaptive"):
        with neuron_lab.mode(mode):
            before = device_counters()["device_to_host_bytes"]
            got = fn(*inputs)
            moved = device_counters()["device_to_host_bytes"] - before
        assert same_bits(got.cpu(), want), mode
        assert moved == 0, f"{mode}: {moved} bytes went to the host"
