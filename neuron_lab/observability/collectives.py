"""Collectives of a region (torch.distributed on neuron): per collective, how often it
ran, the bytes this rank moved, the time and the bus bandwidth it reached."""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Sequence

from neuron_lab.device.units import format_bytes
from neuron_lab.distributed.records import CollectiveRecord, collective_records

__all__ = ["CollectiveRow", "collective_rows", "collectives_between", "collectives_html", "collectives_text"]

COLUMNS = ("collective", "count", "bytes moved", "time", "waiting for the device", "bus bandwidth")


@dataclass
class CollectiveRow:
    name: str
    count: int = 0
    bytes_moved: int = 0
    bus_bytes: int = 0
    duration_ns: int = 0
    wait_ns: int = 0

    @property
    def bus_gbps(self) -> float:
        """Bus bytes per second, in GB/s (nccl-tests' "busbw")."""
        return self.bus_bytes / self.duration_ns if self.duration_ns else 0.0

    def cells(self) -> tuple[str, ...]:
        from neuron_lab.observability.explain import format_seconds

        return (self.name, str(self.count), format_bytes(self.bytes_moved), format_seconds(self.duration_ns / 1e9),
                format_seconds(self.wait_ns / 1e9), f"{self.bus_gbps:.2f} GB/s")


def collectives_between(start_ns: int, end_ns: int) -> list[CollectiveRecord]:
    """This process's collectives that ran within [start_ns, end_ns]."""
    return [r for r in collective_records(start_ns) if r.start_ns >= start_ns and r.end_ns <= end_ns]


def collective_rows(records: Sequence[CollectiveRecord]) -> list[CollectiveRow]:
    """One row per collective name, the most time first."""
    rows: dict[str, CollectiveRow] = {}
    for r in records:
        row = rows.setdefault(r.name, CollectiveRow(r.name))
        row.count += 1
        row.bytes_moved += r.bytes_moved
        row.bus_bytes += r.bus_bytes
        row.duration_ns += r.duration_ns
        row.wait_ns += r.wait_ns
    return sorted(rows.values(), key=lambda row: (-row.duration_ns, row.name))


def collectives_text(records: Sequence[CollectiveRecord]) -> str:
    rows = [COLUMNS] + [row.cells() for row in collective_rows(records)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r))
                     for r in rows)


def collectives_html(records: Sequence[CollectiveRecord]) -> str:
    esc = html.escape
    head = "".join(f"<th>{esc(h)}</th>" for h in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td style='text-align:{'left' if i == 0 else 'right'}'>{esc(c)}</td>"
                                    for i, c in enumerate(row.cells())) + "</tr>"
                   for row in collective_rows(records))
    return f"<table class='neuron-collectives'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
