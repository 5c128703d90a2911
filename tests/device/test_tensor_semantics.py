"""Everyday tensor semantics: views, in-place, out=, tuples, scalars, printing, convolution."""

from __future__ import annotations

import pytest
import torch

import neuron_lab


def test_views_share_storage_and_update_base() -> None:
    x = torch.zeros(3, 4, device="neuron")
    row = x[0]
    assert row._base is x
    row.add_(1)
    x.t()[2].fill_(5)  # column 2 through a transposed view
    assert x.cpu().tolist()[0] == [1.0, 1.0, 5.0, 1.0]
    assert x.view(12).data_ptr() == x.data_ptr()
    assert x.unfold(1, 2, 2).shape == (3, 2, 2)
    assert x.as_strided((2,), (1,)).cpu().tolist() == [1.0, 1.0]
    assert x.reshape(4, 3).data_ptr() == x.data_ptr()


def test_out_argument_including_resize() -> None:
    a = torch.arange(4.0, device="neuron")
    out = torch.empty(4, device="neuron")
    result = torch.add(a, 1, out=out)
    assert result is out and out.cpu().tolist() == [1.0, 2.0, 3.0, 4.0]
    empty = torch.empty(0, device="neuron")
    torch.mul(a, 2, out=empty)
    assert empty.shape == (4,) and empty.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
    idx = torch.empty(0, dtype=torch.long, device="neuron")
    values = torch.empty(0, device="neuron")
    torch.max(a.reshape(2, 2), dim=1, out=(values, idx))
    assert values.cpu().tolist() == [1.0, 3.0] and idx.cpu().tolist() == [1, 1]


def test_ops_returning_tuples_and_scalars() -> None:
    x = torch.tensor([[3.0, 1.0], [2.0, 5.0]], device="neuron")
    values, indices = x.max(dim=1)
    assert values.device.type == "neuron" and indices.cpu().tolist() == [0, 1]
    q, r = torch.linalg.qr(x)
    assert torch.allclose((q @ r).cpu(), x.cpu(), atol=1e-5)
    assert x.sum().item() == 11.0
    assert x.tolist() == [[3.0, 1.0], [2.0, 5.0]]
    assert bool(x[0, 0] > 2) is True
    assert torch.equal(x, x.clone())
    assert x.argmax().item() == 3


def test_data_dependent_shapes() -> None:
    x = torch.tensor([0.0, 1.5, 0.0, 2.0], device="neuron")
    assert x.nonzero().cpu().flatten().tolist() == [1, 3]
    assert x[x > 0].cpu().tolist() == [1.5, 2.0]
    assert torch.unique(x).cpu().tolist() == [0.0, 1.5, 2.0]


def test_printing_shows_the_device() -> None:
    assert "device='neuron:1'" in repr(torch.ones(2, device="neuron:1"))
    assert "device='neuron:0'" in str(torch.zeros(2, 2, device="neuron", dtype=torch.bfloat16))


def test_indexing_with_host_indices_like_cuda() -> None:
    x = torch.arange(5.0, device="neuron")
    assert x[torch.tensor([0, 2])].cpu().tolist() == [0.0, 2.0]
    x[torch.tensor([1])] = 9.0
    assert x[1].item() == 9.0


def test_mixing_devices_raises_the_usual_error() -> None:
    a = torch.ones(3, device="neuron")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + torch.ones(3)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device.*neuron:0.*cpu"):
        torch.mm(torch.ones(2, 2, device="neuron"), torch.ones(2, 2))
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.mm(torch.ones(2, 2, device="neuron:0"), torch.ones(2, 2, device="neuron:1"))
    assert (a + torch.tensor(2.0)).cpu().tolist() == [3.0] * 3  # CPU scalars mix, as in CUDA


def test_sparse_is_refused_with_a_hint() -> None:
    with pytest.raises(NotImplementedError, match=r"aten::_to_sparse.*\.cpu\(\)"):
        torch.ones(2, 2, device="neuron").to_sparse()
    with pytest.raises(NotImplementedError, match="strided"):
        torch.sparse_coo_tensor([[0]], [1.0], (2,), device="neuron", check_invariants=True)


def test_convolution_forward_and_backward_match_cpu() -> None:
    x = torch.randn(2, 3, 9, 9, requires_grad=True)
    conv = torch.nn.Conv2d(3, 4, 3, stride=2, padding=1)
    ref = conv(x)
    ref.sum().backward()
    xn = x.detach().neuron().requires_grad_()
    conv_n = torch.nn.Conv2d(3, 4, 3, stride=2, padding=1)
    conv_n.load_state_dict(conv.state_dict())
    conv_n.neuron()
    out = conv_n(xn)
    out.sum().backward()
    assert torch.equal(out.detach().cpu(), ref.detach())
    assert torch.equal(xn.grad.cpu(), x.grad)
    assert torch.equal(conv_n.weight.grad.cpu(), conv.weight.grad)
    assert torch.equal(conv_n.bias.grad.cpu(), conv.bias.grad)
    up = torch.nn.ConvTranspose2d(4, 2, 2, stride=2).neuron()
    assert up(out.detach()).shape == (2, 2, 10, 10)


def test_resize_and_set() -> None:
    x = torch.arange(4.0, device="neuron")
    x.resize_(2, 3)
    assert x.shape == (2, 3) and x.flatten()[:4].cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    y = torch.empty(0, device="neuron")
    y.set_(x.untyped_storage(), 0, (2, 2), (2, 1))
    assert y.data_ptr() == x.data_ptr() and y.cpu().tolist() == [[0.0, 1.0], [2.0, 3.0]]
    z = torch.empty(3, device="neuron")
    z.set_(x[1])  # a view of x's memory, not a copy
    assert z.data_ptr() == x[1].data_ptr() and z.shape == (3,) and z.stride() == (1,)
    z.fill_(7.0)
    assert x[1].cpu().tolist() == [7.0, 7.0, 7.0]
    with pytest.raises(RuntimeError, match="set_\\(\\) needs a tensor on neuron:0, got one on cpu"):
        z.set_(torch.zeros(2))
    with pytest.raises(RuntimeError, match="Could not set tensor of type"):
        z.set_(torch.zeros(2, dtype=torch.int64, device="neuron"))
    assert z.cpu().tolist() == [7.0, 7.0, 7.0]  # unchanged by the errors


def test_kernels_match_the_cpu_exactly_where_pytorch_would_decompose() -> None:
    # On PrivateUse1 these would take generic decompositions (or SDPA's math
    # path) that round differently; the device runs the CPU kernels instead.
    x = torch.tensor([[-8.4784], [3.25]])
    assert torch.equal(torch.nn.functional.layer_norm(x.neuron(), [1]).cpu(), torch.nn.functional.layer_norm(x, [1]))
    g = torch.randn(2, 6, 5)
    assert torch.equal(torch.nn.functional.group_norm(g.neuron(), 3).cpu(), torch.nn.functional.group_norm(g, 3))
    torch.manual_seed(9)
    q, k, v = (torch.rand(4, 4, 3, 8) * 18 - 9 for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for causal in (False, True):
        qn = q.neuron().requires_grad_()
        qc = q.clone().requires_grad_()
        out_n = sdpa(qn, k.neuron(), v.neuron(), is_causal=causal)
        out_c = sdpa(qc, k, v, is_causal=causal)
        assert torch.equal(out_n.detach().cpu(), out_c.detach())
        out_n.sum().backward()
        out_c.sum().backward()
        assert torch.equal(qn.grad.cpu(), qc.grad)


def test_attention_backend_choice_equals_the_cpus() -> None:
    """SDPA picks its backend with _fused_sdp_choice; the device answers with the CPU's
    choice for the same metadata (the fused CPU kernel then runs on device memory), which
    depends on dtypes, shapes, strides, dropout, the mask and requires_grad."""
    choice = torch.ops.aten._fused_sdp_choice
    g = torch.Generator().manual_seed(4)

    def qkv(batch=1, heads=4, length=6, dim=8, kv_heads=None, dtype=torch.float32):
        kv = kv_heads or heads
        return (torch.randn(batch, heads, length, dim, generator=g).to(dtype),
                torch.randn(batch, kv, length + 3, dim, generator=g).to(dtype),
                torch.randn(batch, kv, length + 3, dim, generator=g).to(dtype))

    q, k, v = qkv()
    cases = [
        ("plain", (q, k, v), {}),
        ("one query token", qkv(length=1), {}),
        ("causal", (q, k, v), {"is_causal": True}),
        ("dropout", (q, k, v), {"dropout_p": 0.1}),
        ("bool mask", (q, k, v), {"attn_mask": torch.rand(1, 1, 6, 9, generator=g) < 0.8}),
        ("float mask", (q, k, v), {"attn_mask": torch.randn(1, 4, 6, 9, generator=g)}),
        ("mask that needs a gradient", (q, k, v), {"attn_mask": torch.randn(1, 4, 6, 9, generator=g).requires_grad_()}),
        ("query that needs a gradient", (q.clone().requires_grad_(), k, v), {}),
        ("scale", (q, k, v), {"scale": 0.3}),
        ("grouped-query heads", qkv(kv_heads=2), {"enable_gqa": True}),
        ("transposed query", (q.transpose(1, 2).contiguous().transpose(1, 2), k, v), {}),
        ("last dim strided", (q[..., ::2], k[..., ::2], v[..., ::2]), {}),
        ("float64", qkv(dtype=torch.float64), {}),
        ("bfloat16", qkv(dtype=torch.bfloat16), {}),
        ("3-d", (q[0], k[0], v[0]), {}),
    ]

    def same_on_device(t):  # strides and requires_grad as on the CPU
        if not isinstance(t, torch.Tensor):
            return t
        d = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="neuron").copy_(t.detach())
        assert d.stride() == t.stride()
        return d.requires_grad_(t.requires_grad)

    for name, (cq, ck, cv), kwargs in cases:
        on_device = {key: same_on_device(value) for key, value in kwargs.items()}
        dq, dk, dv = (same_on_device(t) for t in (cq, ck, cv))
        assert choice(dq, dk, dv, **on_device) == choice(cq, ck, cv, **kwargs), name


@pytest.mark.parametrize("mode", ["adaptive", "eager", "blocking"])
def test_item_reads_each_dtype_as_the_cpu_and_raises_its_errors(mode) -> None:
    """item() (_local_scalar_dense) reads one element after the launches that write it, in
    every dtype, as the CPU does; a tensor of several elements raises the CPU's error and the
    runtime goes on."""
    values = [torch.tensor(True), torch.tensor(-7, dtype=torch.int8), torch.tensor(2**40 + 3),
              torch.tensor(1.0e-3, dtype=torch.float16), torch.tensor(3.140625, dtype=torch.bfloat16),
              torch.tensor(float("nan")), torch.tensor(-0.0, dtype=torch.float64), torch.tensor(1.5 - 2j)]
    with neuron_lab.mode(mode):
        for v in values:
            on_device = v.neuron()
            got = (on_device * 1).item() if v.dtype != torch.bool else (on_device & True).item()
            want = (v * 1).item() if v.dtype != torch.bool else (v & True).item()
            assert type(got) is type(want) and str(got) == str(want), (v.dtype, got, want)
        x = torch.arange(6.0, device="neuron")
        pending = (x * 2)[4:5]  # recorded in adaptive mode: item() launches it first
        assert pending.item() == 8.0
        with pytest.raises(RuntimeError, match="a Tensor with 6 elements cannot be converted to Scalar"):
            x.item()
        assert x.sum().item() == 15.0
