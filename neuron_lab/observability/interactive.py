"""The interactive timeline of a profile: zoom, pan and hover in the notebook.

``prof.timeline()`` returns a :class:`Timeline`: in JupyterLab, the classic notebook and a
notebook saved as HTML it is a canvas widget (``static/timeline.js``, shipped with the
package and inlined in the output: no network, no extension to install) with a lane for the
host, each stream of each core, collectives, the background compiler and each core's memory;
hovering a launch or an op shows its name, shapes, source line, and its emulated and
modelled time. Where HTML does not render it is a PNG (the static matplotlib figure,
``Timeline.figure()``) or one line of text.
"""

from __future__ import annotations

import html
import io
import json
import os
import uuid
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

from neuron_lab.device.units import format_bytes
from neuron_lab.files import replace_file
from neuron_lab.observability.records import format_source

if TYPE_CHECKING:
    from neuron_lab.observability.profiler import Profile

__all__ = ["Timeline", "COLOURS"]

COLOURS = {"replay": "#4c72b0", "compiled": "#55a868", "op": "#8172b2", "inline": "#dd8452", "wait": "#bbbbbb",
           "sync": "#c44e52", "own_sync": "#e8a5a7", "compile": "#937860", "collective": "#da8bc3",
           "memory": "#4c72b0", "graph": "#a9bcdc"}
_LEGEND = [("graph (replayed op by op)", COLOURS["graph"]), ("op of a graph", COLOURS["replay"]),
           ("graph (compiled)", COLOURS["compiled"]), ("op launched alone", COLOURS["op"]),
           ("inline kernel", COLOURS["inline"]), ("host wait", COLOURS["sync"]),
           ("profiler's own wait", COLOURS["own_sync"]), ("compile", COLOURS["compile"]),
           ("collective", COLOURS["collective"])]

PathLike = Union[str, "os.PathLike[str]"]


@lru_cache(maxsize=1)
def _script() -> str:
    return (Path(__file__).parent / "static" / "timeline.js").read_text(encoding="utf-8")


def _us(ns: float) -> str:
    us = ns / 1e3
    if us >= 1e3:
        return f"{us / 1e3:.3f} ms"
    return f"{us:.1f} µs"


class Timeline:
    """A profile's lanes for the notebook. ``max_bars`` caps what is drawn (the earliest
    first); ``data`` is what the widget gets (times in µs from the profile's start)."""

    def __init__(self, profile: "Profile", max_bars: int = 50_000) -> None:
        self.profile = profile
        self.max_bars = max_bars
        self._data: Optional[dict] = None

    # ---- the widget's data ----------------------------------------------------------------
    @property
    def data(self) -> dict:
        if self._data is None:
            self._data = self._build()
        return self._data

    def _build(self) -> dict:
        p = self.profile
        t0 = p.start_ns
        us = lambda ns: (ns - t0) / 1e3  # noqa: E731
        streams = sorted({(l.device, l.stream) for l in p.launches if l.kind != "inline"})
        lanes = [{"name": "host", "kind": "host"}]
        lanes += [{"name": f"neuron:{d} stream {s}", "kind": "stream"} for d, s in streams]
        row = {("stream", d, s): i + 1 for i, (d, s) in enumerate(streams)}
        if p.collectives:
            row["collectives"] = len(lanes)
            lanes.append({"name": "collectives", "kind": "collectives"})
        if any(e.kind in ("compile", "compile_failed") for e in p.events):
            row["compiler"] = len(lanes)
            lanes.append({"name": "compiler", "kind": "compiler"})
        for d in sorted({s.device for s in p.memory}):
            row[("memory", d)] = len(lanes)
            lanes.append({"name": f"memory neuron:{d}", "kind": "memory"})

        bars: list[list[Any]] = []
        costs = p.costs()
        core = p.core_name

        def add(lane: int, start_ns: int, dur_ns: int, colour: str, tip: str, nested: bool = False,
                label: str = "") -> None:
            if len(bars) < self.max_bars:
                bars.append([lane, round(us(start_ns), 3), round(max(dur_ns, 0) / 1e3, 3), colour, tip, nested, label])

        for l in p.launches:
            if not l.start_ns or l.kind == "event":
                continue
            launch_cost, op_costs = costs.get(l.id, (None, []))
            modelled = f"\nmodelled: {_us(launch_cost.modelled_ns)} on a {core} (overhead included)" if launch_cost else ""
            where = format_source(l.source)
            head = (f"{l.label}\n{l.kind}{' (' + l.tier + ')' if l.tier else ''} on neuron:{l.device} stream {l.stream}"
                    f"\nemulated: {_us(l.device_ns)}{modelled}\nqueued before it ran: {_us(l.queued_ns)}"
                    f"\nline: {where}")
            if l.kind == "inline":
                add(0, l.start_ns, l.device_ns, COLOURS["inline"], "inline kernel (runs on the host thread)\n" + head,
                    label=l.name)
                continue
            lane = row[("stream", l.device, l.stream)]
            per_op = l.ops and l.tier != "compiled" and all(o.device_ns >= 0 for o in l.ops)
            if l.kind == "graph":
                colour = COLOURS["graph"] if per_op else COLOURS["compiled"]
            else:
                colour = COLOURS.get(l.kind, COLOURS["op"])
            add(lane, l.start_ns, l.device_ns, colour, head, label=l.label)
            if per_op and l.kind == "graph":
                at = l.start_ns
                for i, op in enumerate(l.ops):
                    cost = op_costs[i] if i < len(op_costs) else None
                    text = (f"{op.name}{' (' + op.overload + ')' if op.overload else ''} in {l.name}"
                            f"\ninputs: {op.inputs}\nline: {format_source(op.source)}"
                            f"\nemulated: {_us(op.device_ns)}")
                    if cost is not None:
                        text += (f"\nmodelled: {_us(cost.modelled_ns)} ({cost.engine}; {cost.flops:,.0f} FLOPs, "
                                 f"{format_bytes(int(cost.bytes))}; utilisation {cost.utilisation:.0%})")
                    add(lane, at, op.device_ns, COLOURS["replay"], text, nested=True,
                        label=op.name.removeprefix("aten::"))
                    at += op.device_ns
        for e in p.events:
            if e.kind == "sync":
                own = e.by_profiler
                add(0, e.time_ns, e.duration_ns, COLOURS["own_sync" if own else "sync"],
                    f"{'the profiler waits' if own else 'host waits'} ({e.reason.words}) for the device"
                    f"{': ' + e.what if e.what and e.what != e.reason.words else ''}\n{_us(e.duration_ns)}"
                    f"\nline: {format_source(e.source)}")
            elif e.kind in ("compile", "compile_failed") and "compiler" in row:
                add(row["compiler"], e.time_ns, e.duration_ns, COLOURS["compile"],
                    f"{e.kind.replace('_', ' ')} {e.what}\n{_us(e.duration_ns)}\n{e.detail}")
        for c in p.collectives:
            add(row["collectives"], c.start_ns, c.duration_ns, COLOURS["collective"],
                f"{c.name} ({format_bytes(c.bytes_moved)})\n{_us(c.duration_ns)}, waiting for the device "
                f"{_us(c.wait_ns)}\nrank {c.rank} of {c.group_size}", label=c.name)
        series = []
        for key, lane in row.items():
            if isinstance(key, tuple) and key[0] == "memory":
                points = [[round(us(s.time_ns), 3), s.allocated] for s in p.memory if s.device == key[1]]
                series.append({"lane": lane, "points": points, "colour": COLOURS["memory"]})
        return {"title": f"neuron timeline: {len(p.launches)} launches, {p.duration_s * 1e3:.1f} ms "
                         f"(emulated times; hover for the modelled {core} times)",
                "end": round((p.end_ns - t0) / 1e3, 3), "lanes": lanes, "bars": bars, "series": series,
                "legend": _LEGEND, "truncated": len(bars) >= self.max_bars}

    # ---- outputs ---------------------------------------------------------------------------
    def html(self) -> str:
        """A self-contained HTML fragment: the widget's script and data inlined."""
        element = f"neuron-timeline-{uuid.uuid4().hex}"
        data = json.dumps(self.data, separators=(",", ":")).replace("</", "<\\/")
        return (f"<div id='{element}' class='neuron-timeline' style='width:100%'>"
                f"<pre>{html.escape(repr(self))} (the interactive timeline needs JavaScript)</pre></div>"
                f"<script>{_script()}\n;window.neuronTimeline(document.getElementById('{element}'), {data});</script>")

    def _repr_html_(self) -> str:
        return self.html()

    def figure(self):
        """The static matplotlib figure of the same lanes."""
        from neuron_lab.observability.timeline import timeline_figure

        return timeline_figure(self.profile)

    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        self.figure().savefig(buffer, format="png", bbox_inches="tight", dpi=80)
        return buffer.getvalue()

    def save_html(self, path: PathLike) -> Path:
        """Writes a standalone page with the widget (open it in any browser, offline)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        page = (f"<!doctype html><html><head><meta charset='utf-8'><title>neuron timeline</title></head>"
                f"<body style='margin:12px'>{self.html()}</body></html>")
        with replace_file(path, "timeline page") as f:
            f.write(page)
        return path

    def __repr__(self) -> str:
        lanes = len(self.data["lanes"])
        return (f"<neuron timeline: {len(self.profile.launches)} launches on {lanes} lanes over "
                f"{self.profile.duration_s * 1e3:.1f} ms: display it in a notebook, or .save_html(path)>")
