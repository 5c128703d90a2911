"""Memory statistics of the emulated NeuronCores (the ``torch.cuda`` memory API).

The native caching allocator keeps CUDA's statistics field for field, so these
functions read ``torch.accelerator.memory`` and add what CUDA users expect on top
(``memory_summary``, ``mem_get_info``, the ``*_cached`` aliases).

Accounting rules (CUDA's): a request is rounded up to 512 bytes; ``memory_allocated``
is the sum of rounded live requests; ``memory_reserved`` is the segments the allocator
holds (2 MiB for requests up to 1 MiB, 20 MiB up to 10 MiB, the request rounded up to
2 MiB above), which blocks are split from and merge back into; ``empty_cache()`` returns
the segments no tensor uses; a request that does not fit in the core's capacity
(``NEURON_LAB_CORE_MEMORY``) first releases those, then raises ``torch.OutOfMemoryError``.
"""

from __future__ import annotations

import pickle
import sys
from collections import OrderedDict
from typing import Any, Literal

import torch

from neuron_lab.device import _C
from neuron_lab.device.core import device_index
from neuron_lab.device.units import format_bytes

__all__ = [
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "memory_cached",
    "max_memory_cached",
    "reset_peak_memory_stats",
    "reset_max_memory_allocated",
    "reset_accumulated_memory_stats",
    "memory_stats",
    "memory_summary",
    "mem_get_info",
    "empty_cache",
    "rounded_size",
    "_record_memory_history",
    "_snapshot",
    "_dump_snapshot",
]

_acc = torch.accelerator.memory


def memory_stats(device: Any = None) -> OrderedDict[str, Any]:
    """All allocator statistics of a core, keyed as in ``torch.cuda.memory_stats``."""
    return _acc.memory_stats(device_index(device))


def memory_allocated(device: Any = None) -> int:
    """Bytes held by live tensors on a core (requests rounded up to 512 bytes)."""
    return _acc.memory_allocated(device_index(device))


def max_memory_allocated(device: Any = None) -> int:
    """Peak of ``memory_allocated`` since start or the last ``reset_peak_memory_stats``."""
    return _acc.max_memory_allocated(device_index(device))


def memory_reserved(device: Any = None) -> int:
    """Bytes the allocator holds on a core: live tensors plus its cache."""
    return _acc.memory_reserved(device_index(device))


def max_memory_reserved(device: Any = None) -> int:
    """Peak of ``memory_reserved``."""
    return _acc.max_memory_reserved(device_index(device))


memory_cached = memory_reserved
max_memory_cached = max_memory_reserved


def reset_peak_memory_stats(device: Any = None) -> None:
    """Sets every peak statistic of a core to its current value."""
    _acc.reset_peak_memory_stats(device_index(device))


reset_max_memory_allocated = reset_peak_memory_stats


def reset_accumulated_memory_stats(device: Any = None) -> None:
    """Zeroes the cumulative counters (allocations, frees, retries, OOMs) of a core."""
    _acc.reset_accumulated_memory_stats(device_index(device))


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes of a core; free excludes what the allocator has reserved."""
    return _acc.get_memory_info(device_index(device))


def empty_cache() -> None:
    """Returns every cached, unused block to the host."""
    _acc.empty_cache()


def rounded_size(nbytes: int) -> int:
    """Bytes a request of ``nbytes`` occupies on the device."""
    return _C.rounded_size(int(nbytes))


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A printable table of a core's allocator statistics, like ``torch.cuda.memory_summary``."""
    index = device_index(device)
    stats = memory_stats(index)
    free, total = mem_get_info(index)
    rows = [
        ("Allocated memory", "allocated_bytes.all", format_bytes),
        ("Reserved memory", "reserved_bytes.all", format_bytes),
        ("Requested memory", "requested_bytes.all", format_bytes),
        ("Allocations", "allocation.all", str),
        ("Segments", "segment.all", str),
    ]
    if not abbreviated:
        rows += [
            ("Small pool allocated", "allocated_bytes.small_pool", format_bytes),
            ("Large pool allocated", "allocated_bytes.large_pool", format_bytes),
        ]
    width = 24
    lines = [
        f"neuron:{index} memory summary ({format_bytes(total)} per core, {format_bytes(free)} free)",
        f"{'':{width}} {'current':>12} {'peak':>12} {'allocated':>12} {'freed':>12}",
    ]
    for label, key, fmt in rows:
        cells = [fmt(int(stats.get(f"{key}.{kind}", 0))) for kind in ("current", "peak", "allocated", "freed")]
        lines.append(f"{label:{width}} " + " ".join(f"{c:>12}" for c in cells))
    lines.append(
        f"{'Cache flushes / OOMs':{width}} {stats.get('num_alloc_retries', 0):>12} {stats.get('num_ooms', 0):>12}"
    )
    return "\n".join(lines)


def _record_memory_history(
    enabled: Literal["state", "all"] | None = "all",
    context: Literal["state", "alloc", "all"] | None = "all",
    stacks: Literal["python", "all"] = "all",
    max_entries: int = sys.maxsize,
    device: Any = None,
    clear_history: bool = False,
) -> None:
    """Starts (or with ``enabled=None`` stops) recording memory history, like
    ``torch.cuda.memory._record_memory_history``.

    ``enabled="state"`` keeps the Python stack that allocated each live block;
    ``"all"`` also logs every allocator action (alloc, free, segment alloc/free,
    OOM), at most ``max_entries`` per core. ``context=None`` records no stacks.
    Only Python frames exist here, so ``stacks="all"`` means Python stacks. The
    history covers every core; ``device`` is accepted for compatibility.
    """
    if enabled not in (None, "state", "all"):
        raise ValueError(f"enabled must be None, 'state' or 'all', got {enabled!r}")
    if context not in (None, "state", "alloc", "all"):
        raise ValueError(f"context must be None, 'state', 'alloc' or 'all', got {context!r}")
    if stacks not in ("python", "all"):
        raise ValueError(f"stacks must be 'python' or 'all', got {stacks!r}")
    if max_entries < 1:
        raise ValueError(f"max_entries must be positive, got {max_entries}")
    if device is not None:
        device_index(device)
    _C.record_memory_history(
        enabled is not None, enabled == "all", context is not None, min(max_entries, 2**62), clear_history
    )


def _snapshot(device: Any = None) -> dict[str, Any]:
    """Segments, blocks (with the stacks that allocated them) and the recorded
    history of every core, in the structure of ``torch.cuda.memory._snapshot()``,
    so that ``torch.cuda._memory_viz`` and pytorch.org/memory_viz render it."""
    return _C.memory_snapshot()


def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    """Pickles ``_snapshot()`` to ``filename`` for pytorch.org/memory_viz (never through a
    symbolic link at ``filename``: see ``neuron_lab.files.replace_file``)."""
    from neuron_lab.files import replace_file

    with replace_file(filename, "memory snapshot", binary=True) as f:
        pickle.dump(_snapshot(), f)
