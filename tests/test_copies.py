"""Copies between the host and the cores, and between cores."""

from __future__ import annotations

import pytest
import torch

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
