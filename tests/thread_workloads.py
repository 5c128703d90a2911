"""Workloads several threads run at once (tests/device/test_threads.py, tests/device/test_thread_stress.py)."""

from __future__ import annotations

import torch

__all__ = ["train_seeded_mlp"]


def train_seeded_mlp(seed: int, device: str, steps: int, optimizer: str = "sgd") -> list[float]:
    """A small MLP whose weights and batch come from a CPU generator seeded with ``seed``,
    trained ``steps`` steps on ``device``: its losses, for comparing devices and threads."""
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    model.to(device)
    opt = (torch.optim.SGD(model.parameters(), lr=0.01) if optimizer == "sgd"
           else torch.optim.AdamW(model.parameters(), lr=0.01))
    x = torch.randn(32, 8, generator=g).to(device)
    losses = []
    for _ in range(steps):
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses
