"""The profile table: launches aggregated per graph (or kernel) and per op, with the emulated
device time (what this machine took) beside the modelled NeuronCore time (``cost_model``)."""

from __future__ import annotations

import html
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence

from neuron_lab.device.units import format_bytes
from neuron_lab.distributed.records import CollectiveRecord
from neuron_lab.observability.collectives import collectives_html, collectives_text
from neuron_lab.observability.cost_model import OpCost, modelled_utilisation
from neuron_lab.observability.explain import format_seconds
from neuron_lab.observability.records import Launch, format_source

__all__ = ["ProfileTable", "Row", "SORT_KEYS"]

SORT_KEYS = ("device_time", "modelled_time", "host_time", "count", "name")

Costs = Mapping[int, tuple[OpCost, list[OpCost]]]


@dataclass
class Row:
    """One aggregated line: a graph, a single-op launch, an inline kernel, or an op."""

    name: str
    kind: str
    count: int = 0
    host_ns: int = 0
    device_ns: int = 0  # -1: unknown (ops that only ran inside compiled graphs)
    ops: int = 0
    bytes_allocated: int = 0
    tier: str = ""
    source: str = "-"
    share: float = 0.0  # of all device time in the table
    modelled_ns: float = -1.0  # on the modelled core; -1: not modelled
    flops: float = 0.0
    peak_flops: float = 0.0  # of the engine the rows' ops ran on

    def sort_value(self, key: str):
        return {"device_time": -self.device_ns, "modelled_time": -self.modelled_ns, "host_time": -self.host_ns,
                "count": -self.count, "name": self.name}[key]

    def add_cost(self, cost: Optional[OpCost]) -> None:
        if cost is None:
            return
        self.modelled_ns = max(self.modelled_ns, 0.0) + cost.modelled_ns
        self.flops += cost.flops
        self.peak_flops = max(self.peak_flops, cost.peak_flops)

    @property
    def utilisation(self) -> float:
        """Modelled FLOPs over what the engine does in the modelled time."""
        return modelled_utilisation(self.flops, self.modelled_ns, self.peak_flops)


def _sorted(rows: Iterable[Row], sort_by: str, top: int) -> list[Row]:
    rows = sorted(rows, key=lambda r: (r.sort_value(sort_by), r.name))
    return rows[:top] if top and top > 0 else rows


def launch_rows(launches: Sequence[Launch], costs: Costs = {}) -> list[Row]:
    """Per graph / kernel: graphs by id, single ops and inline kernels by name."""
    rows: dict[tuple[str, str], Row] = {}
    for l in launches:
        if l.kind in ("event", "wait"):
            continue
        key = (l.kind, l.name)
        row = rows.get(key)
        if row is None:
            row = rows[key] = Row(name=l.label, kind=l.kind, source=format_source(l.source, short=True))
        row.count += 1
        row.host_ns += l.host_ns
        row.device_ns += l.device_ns
        row.ops += l.n_ops
        row.bytes_allocated += l.bytes_allocated
        row.add_cost(costs[l.id][0] if l.id in costs else None)
        if l.tier and l.tier not in row.tier.split("+"):
            row.tier = f"{row.tier}+{l.tier}" if row.tier else l.tier
    return list(rows.values())


def op_rows(launches: Sequence[Launch], costs: Costs = {}) -> list[Row]:
    """Per op name: how often it ran, its host recording time, and its device time
    where known (replayed graphs time each op; compiled graphs run ops fused)."""
    rows: dict[str, Row] = {}
    unknown: dict[str, bool] = defaultdict(bool)
    for l in launches:
        if l.kind in ("event", "wait"):
            continue
        calls = l.ops or ()
        if l.kind == "inline" or not calls:
            row = rows.setdefault(l.name, Row(name=l.name, kind="inline" if l.kind == "inline" else "op"))
            row.count += 1
            row.device_ns += l.device_ns
            row.add_cost(costs[l.id][0] if l.id in costs else None)
            continue
        op_costs = costs[l.id][1] if l.id in costs else []
        for i, op in enumerate(calls):
            row = rows.setdefault(op.name, Row(name=op.name, kind="op"))
            row.count += 1
            row.host_ns += op.host_ns
            row.add_cost(op_costs[i] if i < len(op_costs) else None)
            if len(calls) == 1 and l.kind == "op":
                row.device_ns += l.device_ns
            elif op.device_ns >= 0:
                row.device_ns += op.device_ns
            else:
                unknown[op.name] = True
    for name, row in rows.items():
        if unknown[name] and row.device_ns == 0:
            row.device_ns = -1
    return list(rows.values())


def _with_shares(rows: list[Row]) -> list[Row]:
    total = sum(r.device_ns for r in rows if r.device_ns > 0) or 1
    for r in rows:
        r.share = max(r.device_ns, 0) / total
    return rows


class ProfileTable:
    """Launches per graph and ops per name, sorted; text via ``str()``, HTML in notebooks."""

    def __init__(self, launches: Sequence[Launch], sort_by: str = "device_time", top: int = 20,
                 collectives: Sequence[CollectiveRecord] = (), costs: Costs = {}, core: str = "") -> None:
        if sort_by not in SORT_KEYS:
            raise ValueError(f"sort_by={sort_by!r} is not a column to sort by; use one of {', '.join(SORT_KEYS)}")
        if not isinstance(top, int) or top < 0:
            raise ValueError(f"top={top!r} must be a whole number >= 0 (0 shows every row)")
        self.sort_by, self.top = sort_by, top
        self.core = core
        all_launches = _with_shares(launch_rows(launches, costs))
        all_ops = _with_shares(op_rows(launches, costs))
        self.total_launch_rows, self.total_op_rows = len(all_launches), len(all_ops)
        self.launch_rows = _sorted(all_launches, sort_by, top)
        self.op_rows = _sorted(all_ops, sort_by, top)
        self.collectives = list(collectives)

    # ---- text -------------------------------------------------------------------------------
    _LAUNCH_COLUMNS = ("graph / kernel", "kind", "count", "ops", "host", "emulated", "modelled", "util.", "share",
                       "tier", "memory", "line")
    _OP_COLUMNS = ("op", "count", "host", "emulated", "modelled", "util.", "share")

    @staticmethod
    def _time(ns: int) -> str:
        return "?" if ns < 0 else format_seconds(ns / 1e9)

    @staticmethod
    def _modelled(r: Row) -> tuple[str, str]:
        if r.modelled_ns < 0:
            return "-", "-"
        return format_seconds(r.modelled_ns / 1e9), f"{r.utilisation:.0%}" if r.peak_flops else "-"

    def _launch_cells(self, r: Row) -> tuple[str, ...]:
        return (r.name, r.kind, str(r.count), str(r.ops), self._time(r.host_ns), self._time(r.device_ns),
                *self._modelled(r), f"{r.share:.1%}", r.tier or "-", format_bytes(r.bytes_allocated), r.source)

    def _op_cells(self, r: Row) -> tuple[str, ...]:
        return (r.name, str(r.count), self._time(r.host_ns), self._time(r.device_ns), *self._modelled(r),
                "?" if r.device_ns < 0 else f"{r.share:.1%}")

    def _legend(self) -> str:
        core = f" on a {self.core}" if self.core else ""
        return (f"emulated: device time on this machine; modelled: a NeuronCore's time{core} from each op's FLOPs "
                "and bytes (roofline) plus a launch overhead; util.: modelled FLOPs over the engine's peak")

    @staticmethod
    def _text_table(header: Sequence[str], rows: list[tuple[str, ...]]) -> str:
        widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
        widths[0] = min(widths[0], 60)
        fmt = lambda cells: "  ".join(c[: widths[i]].ljust(widths[i]) if i == 0 else c.rjust(widths[i])
                                      for i, c in enumerate(cells))
        return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])

    def _footer(self, shown: int, total: int) -> str:
        return f"({shown} of {total} rows, sorted by {self.sort_by})"

    def __str__(self) -> str:
        parts = [self._legend(), "", "Launches per graph / kernel",
                 self._text_table(self._LAUNCH_COLUMNS, [self._launch_cells(r) for r in self.launch_rows]),
                 self._footer(len(self.launch_rows), self.total_launch_rows), "",
                 "Ops", self._text_table(self._OP_COLUMNS, [self._op_cells(r) for r in self.op_rows]),
                 self._footer(len(self.op_rows), self.total_op_rows)]
        if self.collectives:
            parts += ["", "Collectives", collectives_text(self.collectives)]
        return "\n".join(parts)

    def __repr__(self) -> str:
        return str(self)

    def _repr_pretty_(self, p, cycle: bool) -> None:
        p.text(str(self))

    # ---- HTML -------------------------------------------------------------------------------
    @staticmethod
    def _html_table(header: Sequence[str], rows: list[tuple[str, ...]], shares: list[float]) -> str:
        esc = html.escape
        head = "".join(f"<th>{esc(h)}</th>" for h in header)
        body = []
        for cells, share in zip(rows, shares):
            tds = []
            for i, c in enumerate(cells):
                align = "left" if i == 0 or header[i] in ("kind", "tier", "line") else "right"
                style = f"text-align:{align}"
                if header[i] == "share":
                    style += (f";background:linear-gradient(90deg,#fdd49e {share * 100:.1f}%,"
                              f"transparent {share * 100:.1f}%)")
                tds.append(f"<td style='{style}'>{esc(c)}</td>")
            body.append("<tr>" + "".join(tds) + "</tr>")
        return f"<table class='neuron-profile-table'><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"

    def _repr_html_(self) -> str:
        return ("<div class='neuron-profile'>"
                f"<small>{html.escape(self._legend())}</small><br>"
                "<b>Launches per graph / kernel</b>"
                + self._html_table(self._LAUNCH_COLUMNS, [self._launch_cells(r) for r in self.launch_rows],
                                   [r.share for r in self.launch_rows])
                + f"<small>{html.escape(self._footer(len(self.launch_rows), self.total_launch_rows))}</small><br>"
                + "<b>Ops</b>"
                + self._html_table(self._OP_COLUMNS, [self._op_cells(r) for r in self.op_rows],
                                   [r.share for r in self.op_rows])
                + f"<small>{html.escape(self._footer(len(self.op_rows), self.total_op_rows))}</small>"
                + (f"<br><b>Collectives</b>{collectives_html(self.collectives)}" if self.collectives else "")
                + "</div>")
