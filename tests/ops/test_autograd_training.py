"""Autograd, nn modules and optimizers: training on neuron matches the CPU bit for bit."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

# Bit-for-bit parity holds in the replay tier (conftest.replay_tier).
pytestmark = pytest.mark.usefixtures("replay_tier")


def make_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))


def make_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(4, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 2 * 2, 3),
    )


def train(model: nn.Module, device: str, optimizer: str, steps: int, inputs, targets, **opt_kwargs):
    model = model.to(device)
    params = list(model.parameters())
    opt = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[optimizer](
        params, lr=0.01, **opt_kwargs
    )
    losses = []
    for x, y in zip(inputs[:steps], targets[:steps]):
        x, y = x.to(device), y.to(device)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


OPTIMIZERS = [
    ("sgd", {"momentum": 0.9, "foreach": False}),
    ("sgd", {"momentum": 0.9, "foreach": True}),
    ("adam", {"foreach": False}),
    ("adam", {"foreach": True}),
    ("adam", {"fused": True}),
    ("adamw", {"foreach": True, "weight_decay": 0.1}),
    ("adamw", {"fused": True}),
]


@pytest.mark.parametrize(("optimizer", "kwargs"), OPTIMIZERS, ids=lambda v: str(v))
def test_mlp_training_matches_cpu_bit_for_bit(optimizer: str, kwargs: dict) -> None:
    torch.manual_seed(0)
    model = make_mlp()
    inputs = [torch.randn(8, 16) for _ in range(5)]
    targets = [torch.randint(0, 4, (8,)) for _ in range(5)]
    cpu_losses, cpu_params = train(copy.deepcopy(model), "cpu", optimizer, 5, inputs, targets, **kwargs)
    dev_losses, dev_params = train(copy.deepcopy(model), "neuron", optimizer, 5, inputs, targets, **kwargs)
    assert dev_losses == cpu_losses
    for a, b in zip(dev_params, cpu_params):
        assert torch.equal(a, b)


def test_cnn_training_matches_cpu_bit_for_bit() -> None:
    torch.manual_seed(0)
    model = make_cnn()
    inputs = [torch.randn(4, 1, 8, 8) for _ in range(4)]
    targets = [torch.randint(0, 3, (4,)) for _ in range(4)]
    cpu_losses, cpu_params = train(copy.deepcopy(model), "cpu", "adam", 4, inputs, targets, foreach=True)
    dev_losses, dev_params = train(copy.deepcopy(model), "neuron", "adam", 4, inputs, targets, foreach=True)
    assert dev_losses == cpu_losses
    for a, b in zip(dev_params, cpu_params):
        assert torch.equal(a, b)


def test_autograd_graph_on_device() -> None:
    x = torch.randn(5, device="neuron", requires_grad=True)
    y = (x.sin() * x).sum()
    (gx,) = torch.autograd.grad(y, x, create_graph=True)
    assert gx.device.type == "neuron"
    expected = (x.cos() * x + x.sin()).detach()
    assert torch.allclose(gx.detach().cpu(), expected.cpu())
    (ggx,) = torch.autograd.grad(gx.sum(), x)  # second order
    assert ggx.device.type == "neuron"


def test_zero_gradient_paths_have_real_memory() -> None:
    # Autograd uses memory-less zero tensors for unused outputs; on neuron they must be readable.
    x = torch.randn(4, device="neuron", requires_grad=True)
    a, b = x.split(2)
    a.sum().backward()
    assert x.grad.cpu().tolist() == [1.0, 1.0, 0.0, 0.0]


def test_module_neuron_and_back() -> None:
    model = nn.Linear(3, 3)
    model.neuron()
    assert model.weight.device.type == "neuron"
    model.cpu()
    assert model.weight.device.type == "cpu"
    model.to("neuron:1")
    assert model.weight.device.index == 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_forward_backward(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model = nn.Linear(8, 8).to(dtype)
    x = torch.randn(4, 8, dtype=dtype)
    ref = model(x).float().sum()
    ref.backward()
    dev_model = nn.Linear(8, 8).to(dtype)
    dev_model.load_state_dict(model.state_dict())
    dev_model.neuron()
    out = dev_model(x.neuron()).float().sum()
    out.backward()
    assert out.item() == ref.item()
    assert torch.equal(dev_model.weight.grad.cpu(), model.weight.grad)
