"""Random number generation for ``torch.neuron`` (the ``torch.cuda`` RNG API).

Each core has its own default generator. A neuron generator carries the state of
a CPU (mt19937) generator, so ``torch.manual_seed(s)`` makes a neuron program draw
exactly the numbers the same program draws on the CPU.

A generator can instead be put in the offset form, ``set_rng_state(offset_rng_state(seed))``:
its state is then 16 bytes, seed and offset (uint64 each, the layout of CUDA's philox
state), and the numbers of each random op depend only on the (seed, offset) it starts
from. That is what DTensor's RNG tracker needs for random ops on DTensors
(``torch.nn.init`` of sharded parameters, dropout): it moves the offset so that each
shard draws its own numbers and the ranks stay in step. The tracker puts a generator
into this form itself (``neuron_lab/integrations/dtensor_random.py``). The offset form's
numbers are not the CPU's; ``manual_seed`` keeps the form a generator is in.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from neuron_lab.device import _C
from neuron_lab.device.core import device_index

__all__ = [
    "default_generators",
    "manual_seed",
    "manual_seed_all",
    "seed",
    "seed_all",
    "initial_seed",
    "get_rng_state",
    "set_rng_state",
    "get_rng_state_all",
    "set_rng_state_all",
    "offset_rng_state",
]


def default_generator(device: Any = None) -> torch.Generator:
    """The default generator of a core."""
    return _C.default_generator(device_index(device))


def _all() -> list[torch.Generator]:
    return [_C.default_generator(i) for i in range(_C.device_count())]


def __getattr__(name: str) -> Any:
    if name == "default_generators":
        return tuple(_all())
    raise AttributeError(name)


def manual_seed(seed: int) -> None:
    """Seeds the current core's generator."""
    default_generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    """Seeds the generators of all cores."""
    for gen in _all():
        gen.manual_seed(int(seed))


def seed() -> None:
    """Seeds the current core's generator with a non-deterministic random number."""
    default_generator().seed()


def seed_all() -> None:
    """Seeds every core's generator with one non-deterministic random number."""
    value = default_generator().seed()
    manual_seed_all(value)


def initial_seed() -> int:
    """The seed of the current core's generator."""
    return default_generator().initial_seed()


def get_rng_state(device: Any = "neuron") -> torch.Tensor:
    """The state of a core's generator, as a CPU ``ByteTensor``: 5056 bytes (its CPU
    generator's) in the CPU form, 16 (seed, offset) in the offset form."""
    return default_generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = "neuron") -> None:
    """Restores a core's generator from a state returned by ``get_rng_state``, or puts
    it in the offset form with a state made by ``offset_rng_state``."""
    if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8:
        raise TypeError("set_rng_state expects the torch.uint8 CPU tensor that get_rng_state returned "
                        "(or one that offset_rng_state made)")
    default_generator(device).set_state(new_state.cpu())


def offset_rng_state(seed: int, offset: int = 0) -> torch.Tensor:
    """A 16-byte offset state (seed, offset: uint64 each) for ``set_rng_state`` or
    ``Generator.set_state``: the generator draws from then on in the offset form, as
    DTensor's random ops need (see the module's docstring)."""
    if not 0 <= int(seed) < 2**64 or not 0 <= int(offset) < 2**63:
        raise ValueError(f"offset_rng_state needs 0 <= seed < 2**64 and 0 <= offset < 2**63, got {seed}, {offset}")
    words = torch.tensor([int(seed) - 2**64 if int(seed) >= 2**63 else int(seed), int(offset)], dtype=torch.int64)
    return words.view(torch.uint8).clone()


def get_rng_state_all() -> list[torch.Tensor]:
    """The states of all cores' generators."""
    return [gen.get_state() for gen in _all()]


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    """Restores all cores' generators."""
    for index, state in enumerate(new_states):
        set_rng_state(state, index)
