"""Host kernels faster than ATen's CPU kernel (neuron_lab/device/csrc/host_kernels.cpp): every
result must equal the CPU's bit for bit, in every mode and on every path (the fallback,
replay of a recorded graph, out= twins), and inputs the fast kernel does not take still run
ATen's kernel."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F


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
        for dim in range(-m.dim(), m.dim()):  # the last dim takes the fast kernel, the others ATen's
            expected = torch.all(m, dim, keepdim=keepdim)
            got = torch.all(m.to("neuron"), dim, keepdim=keepdim).cpu()
            assert got.dtype == torch.bool and torch.equal(got, expected), (tuple(m.shape), dim, keepdim)


def test_all_out_equals_the_cpu_and_resizes_like_aten(mode):
    m = masks()[4]
    out = torch.empty(m.shape[:-1], dtype=torch.bool, device="neuron")
    returned = torch.all(m.to("neuron"), -1, out=out)
    assert returned.data_ptr() == out.data_ptr() and torch.equal(out.cpu(), m.all(-1))
    # An out= of the wrong shape is resized as ATen resizes it (the fast kernel declines it).
    wrong = torch.empty(3, dtype=torch.bool, device="neuron")
    torch.all(m.to("neuron"), -1, out=wrong)
    assert wrong.shape == m.shape[:-1] and torch.equal(wrong.cpu(), m.all(-1))


def test_inputs_the_fast_kernel_declines_still_equal_the_cpu(mode):
    m = masks()[3]
    strided = m.transpose(0, 1)  # not contiguous
    assert torch.equal(torch.all(strided.to("neuron"), -1).cpu(), strided.all(-1))
    as_bytes = m.to(torch.uint8)  # all() of uint8 returns uint8
    got = torch.all(as_bytes.to("neuron"), -1).cpu()
    assert got.dtype == torch.uint8 and torch.equal(got, as_bytes.all(-1))
    empty_rows = torch.ones(3, 0, dtype=torch.bool)
    assert torch.equal(torch.all(empty_rows.to("neuron"), -1).cpu(), empty_rows.all(-1))


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
    scores[1] = float("-inf")
    expected = torch.ops.aten._safe_softmax(scores, -1)
    assert torch.equal(torch.ops.aten._safe_softmax(scores.to("neuron"), -1).cpu(), expected)
