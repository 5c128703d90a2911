"""The metrics report: every counter and timing distribution of the runtime since
start (or ``reset()``), in the spirit of PyTorch/XLA's ``metrics_report()``.

    print(neuron_lab.metrics.report())   # or just `neuron_lab.metrics.report()` in a notebook
    neuron_lab.metrics.reset()
"""

from __future__ import annotations

import html
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

from neuron_lab.adaptive_eager import stats
from neuron_lab.device import trace
from neuron_lab.device.units import format_bytes
from neuron_lab.observability.explain import format_seconds
from neuron_lab.observability.records import events_since, now_ns, totals

__all__ = ["Distribution", "MetricsReport", "report", "reset", "snapshot"]

_reset_ns = 0  # events before this time belong to before the last reset()
_totals_at_reset: dict = {}


@dataclass(frozen=True)
class Distribution:
    """Count, total and percentiles of durations (seconds). ``total_s`` is exact when
    every sample is kept (the runtime keeps the last 8192 launch times per kind)."""

    name: str
    count: int
    total_s: float
    p50_s: float
    p90_s: float
    p99_s: float
    max_s: float

    @classmethod
    def of(cls, name: str, samples_ns: Sequence[int], count: int | None = None) -> "Distribution":
        s = sorted(samples_ns)
        n = len(s)
        if n == 0:
            return cls(name, count or 0, 0.0, 0.0, 0.0, 0.0, 0.0)
        pick = lambda q: s[min(n - 1, int(q * (n - 1) + 0.5))] / 1e9
        total = sum(s) / 1e9
        if count is not None and count > n:  # older samples were dropped: scale by the mean
            total = total / n * count
        return cls(name, count if count is not None else n, total, pick(0.5), pick(0.9), pick(0.99), s[-1] / 1e9)


def reset() -> None:
    """Sets every counter and distribution back to zero."""
    global _reset_ns, _totals_at_reset
    stats.reset_counters()
    trace.reset_launch_times()
    _reset_ns = now_ns()
    _totals_at_reset = totals()


def snapshot() -> dict:
    """Every number of the report as a plain dict (for programs and tests)."""
    c = stats.counters()
    t = totals()
    base = _totals_at_reset or {"device_busy_ns": [0] * len(t["device_busy_ns"]), "record_ns": 0, "wait_ns": 0}
    events = events_since(_reset_ns)
    syncs: dict[str, list[int]] = defaultdict(list)
    for e in events:
        if e.kind == "sync":
            syncs[e.what].append(e.duration_ns)
    launch_times = trace.launch_times()
    return {
        "counters": c,
        "transfers": trace.device_counters(),
        "device_busy_s": [(b - b0) / 1e9 for b, b0 in zip(t["device_busy_ns"], base["device_busy_ns"])],
        "host_tracing_s": (t["record_ns"] - base["record_ns"]) / 1e9,
        "host_wait_s": (t["wait_ns"] - base["wait_ns"]) / 1e9,
        "launch_times": {k: Distribution.of(f"{k} launches", v[1], v[0]) for k, v in launch_times.items()},
        "sync_times": {k: Distribution.of(f"syncs: {k}", v) for k, v in sorted(syncs.items())},
        "compile_times": Distribution.of("compiles", [e.duration_ns for e in events
                                                      if e.kind in ("compile", "compile_failed")]),
        "recompiles": sum(1 for e in events if e.kind == "recompile"),
    }


class MetricsReport:
    """The report: ``str()`` gives text, notebooks show HTML."""

    def __init__(self, data: dict) -> None:
        self.data = data

    def _sections(self) -> list[tuple[str, list[tuple[str, str]]]]:
        d, c, x = self.data, self.data["counters"], self.data["transfers"]
        hits, misses = c["cache_hits"], c["graphs_built"]
        out = [
            ("Time", [("host tracing (recording ops)", format_seconds(d["host_tracing_s"])),
                      ("host waits (syncs)", format_seconds(d["host_wait_s"]))]
             + [(f"device busy, neuron:{i}", format_seconds(s)) for i, s in enumerate(d["device_busy_s"])]),
            ("Launches", [("ops recorded", str(c["ops_recorded"])), ("launches", str(c["launches"])),
                          ("graph launches", str(c["graph_launches"])),
                          ("replay / compiled launches", f"{c['replay_launches']} / {c['compiled_launches']}"),
                          ("inline ops", str(c["inline_ops"]))]),
            ("Graph cache", [("hits", str(hits)), ("misses (graphs built)", str(misses)),
                             ("hit rate", f"{hits / (hits + misses):.1%}" if hits + misses else "-"),
                             ("recompiles (same ops, other inputs)", str(d["recompiles"]))]),
            ("Compiles", [("requested / succeeded / failed",
                           f"{c['compiles_requested']} / {c['compiles_succeeded']} / {c['compiles_failed']}"),
                          ("compile time (background)", format_seconds(c["compile_seconds"])),
                          ("fallbacks to replay (compiled code failed)", str(c["compiled_fallbacks"])),
                          ("compiled graphs rejected (slower than replay)", str(c["compiled_rejected"]))]),
            ("Memory in fused graphs", [("dead intermediates (never allocated)",
                                         format_bytes(c["dead_intermediate_bytes"])),
                                        ("live results", format_bytes(c["live_result_bytes"]))]),
            ("Transfers", [("host -> device", format_bytes(x["host_to_device_bytes"])),
                           ("device -> host", format_bytes(x["device_to_host_bytes"])),
                           ("device -> device", format_bytes(x["device_to_device_bytes"]))]),
            ("Syncs by reason", [(k, str(v)) for k, v in sorted(c["syncs"].items(), key=lambda kv: -kv[1])]),
            ("Flushes by reason", [(k, str(v)) for k, v in sorted(c["flushes"].items(), key=lambda kv: -kv[1])]),
            ("Inline ops by op", [(k, str(v)) for k, v in sorted(c["inline_by_op"].items(),
                                                                key=lambda kv: -kv[1])[:15]]),
        ]
        return [(title, rows) for title, rows in out if rows]

    def distributions(self) -> list[Distribution]:
        d = self.data
        out = [dist for dist in d["launch_times"].values() if dist.count]
        out += [dist for dist in d["sync_times"].values() if dist.count]
        if d["compile_times"].count:
            out.append(d["compile_times"])
        return out

    def __str__(self) -> str:
        lines = ["neuron_lab metrics report"]
        for title, rows in self._sections():
            lines.append(f"{title}:")
            width = max(len(k) for k, _ in rows)
            lines += [f"  {k.ljust(width)}  {v}" for k, v in rows]
        dists = self.distributions()
        if dists:
            lines.append("Timing distributions (count, total, p50, p90, p99, max):")
            width = max(len(x.name) for x in dists)
            for x in dists:
                lines.append(f"  {x.name.ljust(width)}  {x.count:>7}  {format_seconds(x.total_s):>9}  "
                             f"{format_seconds(x.p50_s):>9}  {format_seconds(x.p90_s):>9}  "
                             f"{format_seconds(x.p99_s):>9}  {format_seconds(x.max_s):>9}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def _repr_pretty_(self, p, cycle: bool) -> None:
        p.text(str(self))

    def _repr_html_(self) -> str:
        esc = html.escape
        parts = ["<div class='neuron-metrics'><b>neuron_lab metrics report</b>"]
        for title, rows in self._sections():
            parts.append(f"<h4>{esc(title)}</h4><table>" + "".join(
                f"<tr><td style='text-align:left'>{esc(k)}</td><td style='text-align:right'>{esc(v)}</td></tr>"
                for k, v in rows) + "</table>")
        dists = self.distributions()
        if dists:
            head = "".join(f"<th>{h}</th>" for h in ("", "count", "total", "p50", "p90", "p99", "max"))
            body = "".join(
                f"<tr><td style='text-align:left'>{esc(x.name)}</td><td>{x.count}</td>"
                + "".join(f"<td>{format_seconds(v)}</td>" for v in (x.total_s, x.p50_s, x.p90_s, x.p99_s, x.max_s))
                + "</tr>" for x in dists)
            parts.append(f"<h4>Timing distributions</h4><table><tr>{head}</tr>{body}</table>")
        parts.append("</div>")
        return "".join(parts)


def report() -> MetricsReport:
    """Counters and timing distributions since start or the last ``reset()``."""
    return MetricsReport(snapshot())
