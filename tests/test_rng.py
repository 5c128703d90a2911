"""Random number generators: per core, seedable, reproducible, CPU-identical."""

from __future__ import annotations

import torch


def test_seeded_draws_match_the_cpu() -> None:
    torch.manual_seed(123)
    on_neuron = torch.randn(1000, device="neuron").cpu()
    torch.manual_seed(123)
    on_cpu = torch.randn(1000)
    assert torch.equal(on_neuron, on_cpu)


def test_reproducible_per_device_and_independent() -> None:
    torch.neuron.manual_seed_all(7)
    a0 = torch.rand(5, device="neuron:0").cpu()
    a1 = torch.rand(5, device="neuron:1").cpu()
    assert torch.equal(a0, a1)  # same seed, independent generators
    torch.neuron.manual_seed_all(7)
    torch.rand(5, device="neuron:0")  # advances core 0 only
    assert torch.equal(torch.rand(5, device="neuron:1").cpu(), a1)


def test_explicit_generator() -> None:
    g = torch.Generator(device="neuron")
    assert g.device == torch.device("neuron", 0)
    g.manual_seed(42)
    x = torch.randn(8, device="neuron", generator=g).cpu()
    g.manual_seed(42)
    y = torch.randn(8, device="neuron", generator=g).cpu()
    assert torch.equal(x, y)
    assert torch.Generator(device="neuron:1").device.index == 1


def test_rng_state_roundtrip() -> None:
    state = torch.neuron.get_rng_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    x = torch.rand(10, device="neuron").cpu()
    torch.neuron.set_rng_state(state)
    assert torch.equal(torch.rand(10, device="neuron").cpu(), x)
    states = torch.neuron.get_rng_state_all()
    assert len(states) == 2
    torch.neuron.set_rng_state_all(states)


def test_seed_functions() -> None:
    torch.neuron.manual_seed(5)
    assert torch.neuron.initial_seed() == 5
    seeds = set()
    for _ in range(3):
        torch.neuron.seed()
        seeds.add(torch.neuron.initial_seed())
    assert len(seeds) == 3  # fresh non-deterministic seeds


def test_random_ops_use_the_device_generator() -> None:
    torch.manual_seed(0)
    ref = [
        torch.rand(4),
        torch.empty(4).normal_(),
        torch.empty(4).uniform_(-1, 1),
        torch.bernoulli(torch.full((4,), 0.5)),
        torch.randint(0, 10, (4,)),
        torch.randperm(6),
        # Accelerators (CUDA, neuron) take the fused dropout kernel.
        torch.native_dropout(torch.ones(8), 0.5, True)[0],
        torch.multinomial(torch.ones(5), 3),
    ]
    torch.manual_seed(0)
    dev = [
        torch.rand(4, device="neuron"),
        torch.empty(4, device="neuron").normal_(),
        torch.empty(4, device="neuron").uniform_(-1, 1),
        torch.bernoulli(torch.full((4,), 0.5, device="neuron")),
        torch.randint(0, 10, (4,), device="neuron"),
        torch.randperm(6, device="neuron"),
        torch.nn.functional.dropout(torch.ones(8, device="neuron"), 0.5),
        torch.multinomial(torch.ones(5, device="neuron"), 3),
    ]
    for r, d in zip(ref, dev):
        assert d.device.type == "neuron"
        assert torch.equal(r, d.cpu())


def test_fork_rng_supports_neuron() -> None:
    torch.manual_seed(1)
    with torch.random.fork_rng(devices=[0, 1], device_type="neuron"):
        torch.rand(3, device="neuron")
    after = torch.rand(3, device="neuron").cpu()
    torch.manual_seed(1)
    assert torch.equal(torch.rand(3, device="neuron").cpu(), after)
