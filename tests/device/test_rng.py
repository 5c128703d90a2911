"""Random number generators: per core, seedable, reproducible, CPU-identical."""

from __future__ import annotations

import pytest
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


def _draws_around_state_changes(device: str, generator: torch.Generator) -> list[torch.Tensor]:
    """Draws queued before each change of the generator's state draw from the state they
    were queued under, as in eager mode; the states read back are the CPU's."""
    generator.manual_seed(3)
    a = torch.rand(100_000, generator=generator, device=device)  # large: still queued below
    generator.manual_seed(4)
    b = torch.randn(1000, generator=generator, device=device)
    state = generator.get_state()
    c = torch.rand(50_000, generator=generator, device=device)
    generator.set_state(state)
    d = torch.rand(50_000, generator=generator, device=device)
    generator.seed()
    e = torch.rand(10, generator=generator, device=device)
    generator.manual_seed(5)
    f = torch.rand(10, generator=generator, device=device)
    return [t.cpu() for t in (a, b, c, d, f)] + [state, generator.get_state()]


def test_state_changes_while_draws_are_queued_keep_eager_order(mode: str) -> None:
    on_neuron = _draws_around_state_changes("neuron", torch.Generator("neuron"))
    on_cpu = _draws_around_state_changes("cpu", torch.Generator())
    for got, expected in zip(on_neuron, on_cpu):
        assert torch.equal(got, expected)


def test_the_default_generator_read_after_queued_draws_is_the_cpus(mode: str) -> None:
    def run(device: str) -> list[torch.Tensor]:
        torch.manual_seed(11)
        x = torch.nn.functional.dropout(torch.ones(64, 64, device=device), 0.5)
        state = torch.neuron.get_rng_state() if device == "neuron" else torch.get_rng_state()
        torch.manual_seed(12)
        y = torch.rand(100, device=device)
        return [x.cpu(), state, y.cpu()]

    for got, expected in zip(run("neuron"), run("cpu")):
        assert torch.equal(got, expected)


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


# ---- the offset form (what DTensor's RNG tracker needs) --------------------------------------


@pytest.fixture
def cpu_form_after():
    """The default generators go back to the CPU form (manual_seed keeps a form)."""
    yield
    for index in range(torch.neuron.device_count()):
        torch.neuron.set_rng_state(torch.Generator().get_state(), index)


def offset_state() -> list[int]:
    return torch.neuron.get_rng_state().view(torch.int64).tolist()


def test_offset_state_is_seed_and_offset_and_draws_depend_on_it_alone(cpu_form_after) -> None:
    torch.neuron.set_rng_state(torch.neuron.offset_rng_state(5, 8))
    assert torch.neuron.get_rng_state().numel() == 16 and offset_state() == [5, 8]
    first = torch.rand(10, device="neuron").cpu()
    second = torch.randn(3, device="neuron").cpu()
    assert offset_state() == [5, 8 + 12 + 4]  # each op moves the offset past its numbers (rounded up to 4)
    assert torch.neuron.initial_seed() == 5 and torch.neuron.default_generators[0].get_offset() == 24
    torch.neuron.set_rng_state(torch.neuron.offset_rng_state(5, 8))
    assert torch.equal(torch.rand(10, device="neuron").cpu(), first)
    # Any generator at (5, 20) draws what the default one drew there; (5, 24) draws other numbers.
    g = torch.Generator("neuron:1")
    g.set_state(torch.neuron.offset_rng_state(5, 20))
    assert torch.equal(torch.randn(3, device="neuron:1", generator=g).cpu(), second)
    assert torch.equal(torch.randn(3, device="neuron").cpu(), second)
    assert not torch.equal(torch.randn(3, device="neuron").cpu(), second)


def test_offset_form_draws_are_the_same_recorded_or_at_once(cpu_form_after) -> None:
    import neuron_lab

    def draws() -> list[torch.Tensor]:
        torch.neuron.set_rng_state(torch.neuron.offset_rng_state(11))
        x = torch.ones(64, device="neuron")
        return [t.cpu() for t in (torch.nn.functional.dropout(x, 0.5), x.normal_() * 2, torch.rand(5, device="neuron"))]

    with neuron_lab.mode("blocking"):
        expected = draws()
    for _ in range(3):  # adaptive: recorded once the graph repeats
        for a, e in zip(draws(), expected):
            assert torch.equal(a, e)


def test_manual_seed_keeps_the_form_and_a_cpu_state_restores_the_cpus_numbers(cpu_form_after) -> None:
    torch.neuron.set_rng_state(torch.neuron.offset_rng_state(5, 40))
    torch.manual_seed(3)
    assert offset_state() == [3, 0]
    torch.neuron.set_rng_state(torch.Generator().manual_seed(3).get_state())
    assert torch.neuron.get_rng_state().numel() == 5056
    assert torch.equal(torch.rand(6, device="neuron").cpu(), torch.rand(6, generator=torch.Generator().manual_seed(3)))


def test_a_state_of_another_size_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match=r"either its CPU \(mt19937\) generator's state \(5056 bytes.*offset state "
                                           r"of 16 bytes.*got 7 bytes"):
        torch.neuron.set_rng_state(torch.zeros(7, dtype=torch.uint8))
    with pytest.raises(ValueError, match="0 <= seed < 2\\*\\*64"):
        torch.neuron.offset_rng_state(-1)


@pytest.mark.parametrize("dtype", [torch.int32, torch.float32, torch.float64, torch.bool, torch.bfloat16])
def test_bernoulli_draws_the_cpus_elements_and_leaves_its_state(dtype: torch.dtype) -> None:
    """neuron's bernoulli_ draws ATen's elements a state twist at a time: the CPU's elements
    for a seed, across twists (624 words) and at the edges p = 0 and 1, and the generator
    left where the CPU's is (the draws after them match too). Contiguous tensors of the
    bulk dtypes are drawn in bulk where ATen itself does not use MKL's kernel; the rest by
    ATen's kernel."""
    from neuron_lab.device import trace

    def draws(device: str) -> list[torch.Tensor]:
        torch.manual_seed(31)
        out = []
        for n, p in [(1, 0.5), (311, 0.1), (5000, 0.73), (64, 0.0), (64, 1.0)]:
            out.append(torch.empty(n, dtype=dtype, device=device).bernoulli_(p))
        out.append(torch.empty(40, 30, dtype=dtype, device=device).t().bernoulli_(0.3))  # not contiguous
        out.append(torch.rand(7, device=device))  # the generator's state after them
        return [t.cpu() for t in out]

    before = trace.device_counters()["bulk_bernoulli_elements"]
    for actual, expected in zip(draws("neuron"), draws("cpu")):
        assert torch.equal(actual, expected)
    bulk = trace.device_counters()["bulk_bernoulli_elements"] - before
    # The bulk path runs where its first-use check found ATen's own elements (ATen's default
    # kernel, not MKL's, which it picks by the vendor its cpuinfo reads: a VM may hide it),
    # for every contiguous tensor of a bulk dtype, or nowhere: never for some tensors only.
    if dtype == torch.bfloat16:
        assert bulk == 0
    else:
        assert bulk in (0, 1 + 311 + 5000 + 64 + 64)


def test_bernoulli_with_a_neuron_generator_and_bad_p() -> None:
    g = torch.Generator(device="neuron").manual_seed(5)
    c = torch.Generator().manual_seed(5)
    x = torch.empty(1000, device="neuron").bernoulli_(0.25, generator=g)
    assert torch.equal(x.cpu(), torch.empty(1000).bernoulli_(0.25, generator=c))
    with pytest.raises(RuntimeError, match=r"expects p to be in \[0, 1\]"):
        x.bernoulli_(1.5)
    assert torch.equal(x.cpu(), torch.empty(1000).bernoulli_(0.25, generator=torch.Generator().manual_seed(5)))
