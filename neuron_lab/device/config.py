"""Configuration of the emulated NeuronCores, read from the environment once, at import.

``NEURON_LAB_NUM_CORES``   number of cores, ``neuron:0`` .. ``neuron:N-1`` (default 2)
``NEURON_LAB_CORE_MEMORY`` memory capacity of each core, e.g. ``16GiB``, ``512MiB``,
                           ``2GB`` or a number of bytes (default 16GiB)

Both must be set before ``import torch`` (which loads the device) and are fixed afterwards.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from fractions import Fraction

__all__ = ["DeviceConfig", "parse_size", "from_environment"]

DEFAULT_NUM_CORES = 2
DEFAULT_CORE_MEMORY = 16 * 2**30
# The largest capacity a core may have: 1 EiB. The allocator adds sizes to it in signed
# 64-bit arithmetic, which must not overflow.
MAX_CORE_MEMORY = 2**60

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3, "kb": 10**3, "kib": 2**10,
    "m": 10**6, "mb": 10**6, "mib": 2**20,
    "g": 10**9, "gb": 10**9, "gib": 2**30,
    "t": 10**12, "tb": 10**12, "tib": 2**40,
}


@dataclass(frozen=True)
class DeviceConfig:
    """How many cores the device has and how much memory each one holds."""

    num_cores: int = DEFAULT_NUM_CORES
    core_memory: int = DEFAULT_CORE_MEMORY


def parse_size(text: str, *, variable: str = "size", maximum: int = MAX_CORE_MEMORY) -> int:
    """Parses ``"16GiB"``, ``"512 MiB"``, ``"1.5GB"`` or ``"1048576"`` into bytes, exactly
    (decimal fractions as fractions, never through a float), between 1 and ``maximum``."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text, flags=re.ASCII)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"{variable}={text!r} is not a memory size; use a number of bytes or a number "
            "with a unit such as 512MiB, 16GiB or 2GB"
        )
    size = Fraction(match.group(1)) * _UNITS[unit]
    if size.denominator != 1:
        raise ValueError(f"{variable}={text!r} is not a whole number of bytes ({float(size):.2f}); "
                         "use a whole number of bytes or a larger unit")
    if size <= 0:
        raise ValueError(f"{variable}={text!r} must be a positive memory size")
    if size > maximum:
        raise ValueError(f"{variable}={text!r} is {int(size):,} bytes, more than the largest supported "
                         f"size, {maximum:,} bytes (1 EiB); use a smaller size such as 64GiB")
    return int(size)


def from_environment(environ: os._Environ | dict | None = None) -> DeviceConfig:
    """Reads ``NEURON_LAB_NUM_CORES`` and ``NEURON_LAB_CORE_MEMORY``; raises ValueError on bad values."""
    env = os.environ if environ is None else environ
    cores_text = env.get("NEURON_LAB_NUM_CORES", str(DEFAULT_NUM_CORES))
    try:
        if not re.fullmatch(r"\s*[0-9]+\s*", cores_text, flags=re.ASCII):
            raise ValueError
        num_cores = int(cores_text)
    except ValueError:
        raise ValueError(
            f"NEURON_LAB_NUM_CORES={cores_text!r} is not a whole number; set it to the number "
            "of emulated NeuronCores, e.g. NEURON_LAB_NUM_CORES=2"
        ) from None
    if not 1 <= num_cores <= 64:
        raise ValueError(f"NEURON_LAB_NUM_CORES={num_cores} must be between 1 and 64")
    memory_text = env.get("NEURON_LAB_CORE_MEMORY")
    core_memory = (
        DEFAULT_CORE_MEMORY
        if memory_text is None
        else parse_size(memory_text, variable="NEURON_LAB_CORE_MEMORY")
    )
    return DeviceConfig(num_cores=num_cores, core_memory=core_memory)
