"""What the collectives of this process did: one typed record per collective, for the
profiler, explain() and the notebook's per-rank summary.

The records are owned here (a bounded ring, like the device's event log); the layers
above read them with ``collective_records(since_ns)`` and ``collective_totals()``.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

__all__ = ["CollectiveRecord", "collective_records", "collective_totals", "record_collective"]

_MAX_RECORDS = 8192


@dataclass(frozen=True)
class CollectiveRecord:
    """One collective as this rank saw it.

    ``bytes_moved`` is what this rank's tensors put on the wire and took off it (the
    algorithm's bytes: its input plus its output for gathers and scatters, the tensor once
    for reductions and broadcasts); ``bus_bytes`` is the conventional bus traffic of the
    collective for ``group_size`` ranks (nccl-tests' formulas), so that
    ``bus_bytes / seconds`` compares with a link's bandwidth."""

    name: str          # "all_reduce", "broadcast", "send", ...
    group: str         # the process group's name
    group_size: int
    rank: int          # this process's rank in the group
    device: int        # the neuron core of its tensors (-1 for CPU tensors)
    bytes_moved: int
    bus_bytes: int
    start_ns: int      # the runtime's clock (time.monotonic_ns())
    end_ns: int
    wait_ns: int       # of which: waiting for the device before the data could move

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


_lock = threading.Lock()
_records: deque[CollectiveRecord] = deque(maxlen=_MAX_RECORDS)
_totals: dict[str, list[int]] = {}  # name -> [count, bytes_moved, duration_ns]


def record_collective(record: CollectiveRecord) -> None:
    """Keeps a record (the backend calls this once per finished collective)."""
    with _lock:
        _records.append(record)
        total = _totals.setdefault(record.name, [0, 0, 0])
        total[0] += 1
        total[1] += record.bytes_moved
        total[2] += record.duration_ns


def collective_records(since_ns: int = 0) -> list[CollectiveRecord]:
    """The records of collectives that ended at or after ``since_ns`` (the last 8192 at most)."""
    with _lock:
        return [r for r in _records if r.end_ns >= since_ns]


def collective_totals() -> dict[str, dict[str, int]]:
    """Per collective since the process started: ``{"count", "bytes_moved", "duration_ns"}``
    (not bounded by the record ring)."""
    with _lock:
        return {name: {"count": c, "bytes_moved": b, "duration_ns": d} for name, (c, b, d) in _totals.items()}
