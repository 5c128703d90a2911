"""Copies between the host and the cores, and between cores."""

from __future__ import annotations

import pytest
import torch

import neuron_lab
from neuron_lab.device import _C

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32,
          torch.int8, torch.uint8, torch.bool, torch.complex64]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_roundtrip_every_dtype(dtype: torch.dtype) -> None:
    cpu = (torch.randn(4, 5) * 10).to(dtype)
    dev = cpu.to("neuron")
    assert dev.dtype == dtype and dev.device.type == "neuron"
    assert torch.equal(dev.cpu(), cpu)
    assert torch.equal((dev | dev).cpu(), cpu | cpu) if dtype == torch.bool else torch.equal((dev + dev).cpu(), cpu + cpu)


@pytest.mark.parametrize("non_blocking", [False, True])
def test_between_cores(non_blocking: bool) -> None:
    a = torch.arange(12.0, device="neuron:0").reshape(3, 4)
    b = a.to("neuron:1", non_blocking=non_blocking)
    assert b.device == torch.device("neuron", 1)
    torch.neuron.synchronize(1)
    assert torch.equal(b.cpu(), a.cpu())
    b.add_(1)
    assert a[0, 0].item() == 0.0  # a real copy, not an alias


def test_copy_into_non_contiguous_and_with_dtype_change() -> None:
    dst = torch.zeros(4, 4, device="neuron")
    dst.t()[1].copy_(torch.arange(4))
    assert dst[:, 1].cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    half = torch.ones(3, device="neuron").to(torch.float16)
    assert half.dtype == torch.float16 and half.cpu().tolist() == [1.0, 1.0, 1.0]
    back = torch.empty(3, dtype=torch.float64)
    back.copy_(half)
    assert back.tolist() == [1.0, 1.0, 1.0]


def test_conjugate_and_negative_views_copy_correctly() -> None:
    z = torch.tensor([1 + 2j, 3 - 1j], device="neuron")
    assert z.conj().cpu().tolist() == [1 - 2j, 3 + 1j]
    assert z.conj().clone().cpu().tolist() == [1 - 2j, 3 + 1j]
    assert torch.view_as_real(z).cpu().tolist() == [[1.0, 2.0], [3.0, -1.0]]


def test_transfer_counters() -> None:
    before = _C.counters()
    x = torch.ones(256).to("neuron")  # 1 KiB host -> device
    x.cpu()
    after = _C.counters()
    assert after["host_to_device_bytes"] - before["host_to_device_bytes"] == 1024
    assert after["device_to_host_bytes"] - before["device_to_host_bytes"] == 1024


def test_numpy_refuses_like_cuda() -> None:
    with pytest.raises(TypeError, match=r"can't convert neuron:0 device type tensor to numpy.*\.cpu\(\)"):
        torch.ones(2, device="neuron").numpy()
    assert torch.ones(2, device="neuron").cpu().numpy().tolist() == [1.0, 1.0]


def _layouts() -> list[torch.Tensor]:
    """Tensors of every layout a copy meets: dense ones in many stride orders (copied as
    bytes) and ones with gaps, overlaps, broadcasts or bits to resolve (copied by ATen)."""
    g = torch.Generator().manual_seed(4)
    base = torch.randn(3, 4, 5, 6, generator=g)
    return [
        base,
        base.transpose(1, 3),  # dense, not contiguous
        base.permute(3, 0, 2, 1),
        base.contiguous(memory_format=torch.channels_last),
        torch.randn(1, 7, 1, generator=g),
        torch.tensor(2.5),  # 0-dim
        torch.empty(0, 3),
        base[:, 1:3],  # gaps
        base[..., ::2],
        torch.randn(5, 1, generator=g).expand(5, 4),  # broadcast: overlapping
        torch.arange(24).view(4, 6).t(),
        torch.complex(base, -base).conj(),  # a conjugate bit
    ]


def test_copies_of_every_layout_keep_values_and_strides_as_the_cpu(mode: str) -> None:
    for i, cpu in enumerate(_layouts()):
        on_device = cpu.to("neuron")
        for name, got, want in [
            ("to", on_device, cpu),
            ("clone", on_device.clone(), cpu.clone()),
            ("cpu", on_device.cpu(), cpu),
            ("clone().cpu()", on_device.clone().cpu(), cpu.clone()),
            ("contiguous", on_device.contiguous(), cpu.contiguous()),  # other strides: ATen's copy
            ("cpu contiguous", on_device.to("cpu", memory_format=torch.contiguous_format), cpu.contiguous()),
        ]:
            assert got.shape == want.shape and got.dtype == want.dtype, (i, name)
            if name in ("clone", "contiguous"):
                assert got.stride() == want.stride(), (i, name)
            assert torch.equal(got.cpu().resolve_conj(), want.resolve_conj()), (i, name)
        into = torch.empty_like(on_device)
        assert into.copy_(on_device) is into and torch.equal(into.cpu().resolve_conj(), cpu.resolve_conj()), i


def test_copies_within_one_storage_are_left_to_aten() -> None:
    """Overlapping source and destination: ATen's result (or its error), never a raw copy."""
    x = torch.arange(10.0)
    on_device = x.to("neuron")
    on_device[2:].copy_(on_device[:-2].clone())
    expected = x.clone()
    expected[2:].copy_(x[:-2].clone())
    assert torch.equal(on_device.cpu(), expected)
    y = torch.arange(6.0).to("neuron")
    with neuron_lab.mode("blocking"):  # run at once: the error comes from this very call
        with pytest.raises(RuntimeError, match="single memory location"):
            y[1:].copy_(y[:-1])
    assert torch.equal(y.cpu(), torch.arange(6.0))  # the failed copy changed nothing
