"""Random number generation for ``torch.neuron`` (the ``torch.cuda`` RNG API).

Each core has its own default generator. A neuron generator carries the state of
a CPU (mt19937) generator, so ``torch.manual_seed(s)`` makes a neuron program draw
exactly the numbers the same program draws on the CPU.
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
    """The state of a core's generator, as a CPU ``ByteTensor``."""
    return default_generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = "neuron") -> None:
    """Restores a core's generator from a state returned by ``get_rng_state``."""
    if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8:
        raise TypeError("set_rng_state expects the torch.uint8 CPU tensor that get_rng_state returned")
    default_generator(device).set_state(new_state.cpu())


def get_rng_state_all() -> list[torch.Tensor]:
    """The states of all cores' generators."""
    return [gen.get_state() for gen in _all()]


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    """Restores all cores' generators."""
    for index, state in enumerate(new_states):
        set_rng_state(state, index)
