"""Fast host kernels for the ``neuron`` device: optional, and validated against ATen.

The device runs every op with ATen's CPU kernel over host memory. This package adds
kernels that give the same results bit for bit, faster, for the small inputs a decoding
loop or a training step runs most (``KERNELS.md`` lists each one, the ATen kernel it
mirrors and the torch versions it was validated on). They live in ``csrc/``, compiled
into the device's extension, and plug into the device's table of host kernels
(``neuron_lab/device/csrc/host_kernel_table.h``); the device knows none of them.

``NEURON_LAB_FASTPATH`` (read once, when neuron_lab loads) says how they run:

``on``        (default) a kernel runs where it takes the call; ATen's otherwise;
``off``       only ATen's kernels run (``device_counters()["host_kernel_ops"]`` stays 0);
``validate``  each kernel that takes a call runs, ATen's kernel runs on a copy of the same
              inputs, and the first differing bit raises, naming the kernel and the inputs.

A kernel copies the order of operations of one ATen kernel, which a torch release may
change: on a torch whose version :data:`VALIDATED_TORCH` does not list, ``on`` turns itself
off with one warning. ``validate`` runs there too: it is how a new version is validated.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator

import torch

from neuron_lab.fastpath._native import native as _native

__all__ = ["VALIDATED_TORCH", "MODES", "ENVIRONMENT_VARIABLE", "start", "get_mode", "set_mode", "mode",
           "kernels", "families", "set_family_enabled", "family_enabled", "families_enabled", "validated_on"]

VALIDATED_TORCH: tuple[str, ...] = ("2.13",)
"""The torch release series (major.minor) the kernels were validated on: tests pass with
``NEURON_LAB_FASTPATH=validate`` (KERNELS.md says which)."""

MODES = ("off", "on", "validate")
ENVIRONMENT_VARIABLE = "NEURON_LAB_FASTPATH"

def validated_on(torch_version: str) -> bool:
    """Whether ``torch_version`` (``"2.13.0+cpu"``) is of a release series the kernels were validated on."""
    release = torch_version.split("+", 1)[0].split(".")
    return ".".join(release[:2]) in VALIDATED_TORCH


def start(environ: dict[str, str] | None = None) -> str:
    """Sets the mode from ``NEURON_LAB_FASTPATH`` (when neuron_lab loads) and returns it; on an
    unvalidated torch, ``on`` becomes ``off`` with one warning. Raises ValueError on a bad value."""
    env = os.environ if environ is None else environ
    requested = env.get(ENVIRONMENT_VARIABLE, "on").strip().lower()
    if requested not in MODES:
        raise ValueError(f"{ENVIRONMENT_VARIABLE}={env.get(ENVIRONMENT_VARIABLE)!r} is not one of "
                         f"{', '.join(MODES)}; unset it for the default, on")
    chosen = requested
    if requested == "on" and not validated_on(torch.__version__):
        chosen = "off"
        warnings.warn(
            f"neuron_lab's fast host kernels were validated on torch {', '.join(VALIDATED_TORCH)}, not "
            f"{torch.__version__}: they are off, and ATen's kernels run (the same results, slower on small "
            f"tensors). {ENVIRONMENT_VARIABLE}=validate runs both and raises where they differ.",
            RuntimeWarning, stacklevel=2)
    _native.set_mode(chosen)
    return chosen


def get_mode() -> str:
    """``"off"``, ``"on"`` or ``"validate"``."""
    return _native.mode()


def set_mode(new_mode: str) -> None:
    """Sets the mode for the whole process (see the module's docstring)."""
    if new_mode not in MODES:
        raise ValueError(f"the fast path's mode is one of {', '.join(MODES)}, not {new_mode!r}")
    torch.neuron.synchronize()  # launches already queued keep the mode they were made in
    _native.set_mode(new_mode)


@contextlib.contextmanager
def mode(new_mode: str) -> Iterator[None]:
    """``with fastpath.mode("validate"):`` the mode inside the block, restored after it."""
    previous = get_mode()
    set_mode(new_mode)
    try:
        yield
    finally:
        set_mode(previous)


def kernels() -> list[dict[str, str]]:
    """Every registered kernel: ``{op, path, kernel, family, mirrors}`` (path: ``boxed``,
    ``at_once`` or ``empty_result``, the device's paths that read the table)."""
    return list(_native.kernels())


def families() -> list[str]:
    """The kernels' families, sorted: each is switched on and off, and measured, as one."""
    return sorted({k["family"] for k in kernels()})


def set_family_enabled(family: str, enabled: bool) -> None:
    """Switches one family on or off (off: ATen's kernels run for its ops)."""
    torch.neuron.synchronize()
    _native.set_family_enabled(family, bool(enabled))


def family_enabled(family: str) -> bool:
    """Whether a family's kernels may run (the mode permitting)."""
    return bool(_native.family_enabled(family))


@contextlib.contextmanager
def families_enabled(enabled: set[str] | frozenset[str]) -> Iterator[None]:
    """Only these families run inside the block (benchmarks measure one family at a time)."""
    unknown = set(enabled) - set(families())
    if unknown:
        raise ValueError(f"no fast-path families named {sorted(unknown)}; they are {families()}")
    previous = {f: family_enabled(f) for f in families()}
    try:
        for f in previous:
            set_family_enabled(f, f in enabled)
        yield
    finally:
        for f, was in previous.items():
            set_family_enabled(f, was)
