"""A live dashboard of the neuron device, built with ipywidgets.

Memory per core (allocated, reserved, peak, capacity), stream queue depths, the graph
cache (hits, misses, compiles) and a bar chart of the last cells' timings. It updates
after every cell from IPython's ``post_run_cell`` event (through the per-cell timer),
on the kernel's main thread: never from a thread, which ipykernel 7 does not allow
for output. A failed cell is shown in red and the numbers are read after its device
work finished, so the dashboard stays consistent when cells fail.

``neuron_lab.Dashboard()`` is the plain-Python twin of ``%neuron_dashboard``.
"""

from __future__ import annotations

import html
import weakref
from typing import Any, Optional

import torch

from neuron_lab.observability.explain import format_seconds
from neuron_lab.magics.autotime import CellRecord, CellTimer, timer_for
from neuron_lab.magics.display import (
    DeviceMemory,
    StreamState,
    _text_table,
    format_bytes,
    read_streams,
)

__all__ = ["Dashboard", "stop_dashboards"]

# Every dashboard still updating, so that %unload_ext can stop them.
_LIVE: "weakref.WeakSet[Dashboard]" = weakref.WeakSet()

_BOX_STYLE = "font-family:monospace;font-size:12px"


class Dashboard:
    """Live view of the neuron device for notebooks (ipywidgets); text in terminals.

    Args:
        cells: how many of the last cells that used the device the timing chart shows.
        shell: the IPython shell to follow (default: the running one). Without a shell
            the dashboard only changes when ``update()`` is called.

    The widget is ``.widget`` (a VBox with the CSS class ``neuron-dashboard``); the
    numbers last shown are in ``.memory``, ``.streams``, ``.counters``, ``.cached_graphs``
    and ``.chart_cells``.
    """

    def __init__(self, cells: int = 20, shell: Any = None) -> None:
        import ipywidgets as widgets

        if cells < 1:
            raise ValueError(f"cells must be at least 1, got {cells}")
        self.cells = cells
        self.shell = shell if shell is not None else _running_shell()
        self.timer: Optional[CellTimer] = None
        self.memory: list[DeviceMemory] = []
        self.streams: list[StreamState] = []
        self.counters: dict = {}
        self.cached_graphs = 0
        self.pending_compiles = 0
        self.mode = ""
        self.chart_cells: list[CellRecord] = []
        self.updates = 0
        self.following = False

        count = torch.neuron.device_count()
        self.header = widgets.HTML()
        self.memory_bars = [
            widgets.FloatProgress(min=0.0, max=1.0, value=0.0, description=f"neuron:{i}",
                                  layout=widgets.Layout(width="320px"))
            for i in range(count)
        ]
        self.memory_labels = [widgets.HTML() for _ in range(count)]
        self.streams_html = widgets.HTML()
        self.graph_cache_html = widgets.HTML()
        self.chart_html = widgets.HTML()
        self.refresh_button = widgets.Button(description="Refresh", tooltip="read the device state now",
                                             layout=widgets.Layout(width="90px"))
        self.refresh_button.on_click(lambda _button: self.update())
        memory_rows = [widgets.HBox([bar, label]) for bar, label in zip(self.memory_bars, self.memory_labels)]
        self.widget = widgets.VBox(
            [
                widgets.HBox([self.header, self.refresh_button]),
                widgets.HTML("<b>memory</b> (bar: allocated / capacity)"),
                *memory_rows,
                widgets.HBox([self.streams_html, self.graph_cache_html]),
                self.chart_html,
            ]
        )
        self.widget.add_class("neuron-dashboard")
        self._follow()
        self.update()

    # ---- following the shell -------------------------------------------------------------

    def _follow(self) -> None:
        if self.shell is None:
            return
        timer = timer_for(self.shell)
        if timer is None:  # no %load_ext: measure cells quietly for the chart
            timer = CellTimer(self.shell, printing=False).attach()
        self.timer = timer
        timer.add_listener(self._on_cell)
        self.following = True
        _LIVE.add(self)

    def _on_cell(self, record: CellRecord) -> None:
        self.update()

    def stop(self) -> None:
        """Stops following the cells (the widget keeps its last state)."""
        if self.timer is not None:
            self.timer.remove_listener(self._on_cell)
        self.following = False
        _LIVE.discard(self)
        self.header.value = self._header_html()

    def close(self) -> None:
        """Stops following the cells and closes the widgets."""
        self.stop()
        pending = [self.widget]
        while pending:  # close the whole tree of widgets, children first
            widget = pending.pop()
            pending.extend(getattr(widget, "children", ()))
            widget.close()

    # ---- reading and showing ---------------------------------------------------------------

    def update(self) -> None:
        """Reads the device state and the kept cell timings, then updates every widget."""
        import neuron_lab.adaptive_eager as ae

        memory = [DeviceMemory.read(i) for i in range(len(self.memory_bars))]
        streams = read_streams()
        counters = ae.counters()
        cached_graphs = len(ae.graphs())
        pending = ae.pending_compiles()
        records = list(self.timer.records) if self.timer is not None else []
        chart_cells = [r for r in records if r.used_device][-self.cells:]

        self.memory, self.streams, self.counters = memory, streams, counters
        self.cached_graphs, self.pending_compiles, self.mode = cached_graphs, pending, ae.get_mode()
        self.chart_cells = chart_cells
        self.updates += 1
        for bar, label, m in zip(self.memory_bars, self.memory_labels, memory):
            bar.max = float(max(m.capacity, 1))
            bar.value = float(m.allocated)
            bar.bar_style = "danger" if m.used_fraction > 0.9 else ("warning" if m.used_fraction > 0.7 else "")
            label.value = (f"<span style='{_BOX_STYLE}'>allocated {format_bytes(m.allocated)} · reserved "
                           f"{format_bytes(m.reserved)} · peak {format_bytes(m.peak)} · capacity "
                           f"{format_bytes(m.capacity)}</span>")
        self.header.value = self._header_html()
        self.streams_html.value = self._streams_html()
        self.graph_cache_html.value = self._graph_cache_html()
        self.chart_html.value = self._chart_html()

    def _last_label(self) -> str:
        last = self.timer.last if self.timer is not None else None
        return "" if last is None else f" · after {last.label}" + ("" if last.succeeded else " (failed)")

    def _header_html(self) -> str:
        state = "" if self.following or self.shell is None else " · <i>not updating</i>"
        return (f"<b>neuron dashboard</b> <span style='{_BOX_STYLE}'>· mode {html.escape(self.mode)} · "
                f"{len(self.memory_bars)} cores{html.escape(self._last_label())}{state}</span>")

    def _streams_html(self) -> str:
        rows = "".join(
            f"<tr><td>neuron:{s.device}</td><td style='text-align:right'>{s.stream_id}</td>"
            f"<td style='text-align:right'>{s.queue_depth}</td>"
            f"<td style='text-align:right'>{s.completed}</td></tr>"
            for s in self.streams
        )
        return (f"<table style='{_BOX_STYLE};margin-right:24px'><tr><th>device</th><th>stream</th>"
                f"<th>queued</th><th>launches done</th></tr>{rows}</table>")

    def _graph_cache_items(self) -> list[tuple[str, str]]:
        c = self.counters
        return [
            ("cached graphs", str(self.cached_graphs)),
            ("cache hits", str(c.get("cache_hits", 0))),
            ("cache misses", str(c.get("graphs_built", 0))),
            ("compiles ok / failed / pending",
             f"{c.get('compiles_succeeded', 0)} / {c.get('compiles_failed', 0)} / {self.pending_compiles}"),
            ("launches (graphs)", f"{c.get('launches', 0)} ({c.get('graph_launches', 0)})"),
        ]

    def _graph_cache_html(self) -> str:
        rows = "".join(f"<tr><td>{html.escape(k)}</td><td style='text-align:right'>{html.escape(v)}</td></tr>"
                       for k, v in self._graph_cache_items())
        return f"<table style='{_BOX_STYLE}'><tr><th colspan='2'>graph cache</th></tr>{rows}</table>"

    def _chart_html(self) -> str:
        """An SVG bar chart: wall time per cell, device time inside it; failed cells in red."""
        title = f"<b>last {self.cells} cells that used the device</b> (wall; dark: device time)"
        if not self.chart_cells:
            return f"<div style='{_BOX_STYLE}'>{title}: none yet</div>"
        bar_w, gap, height, label_h = 28, 8, 80, 14
        longest = max(float(getattr(r.explanation, "wall_s", 0.0)) for r in self.chart_cells) or 1.0
        parts = []
        for i, r in enumerate(self.chart_cells):
            e = r.explanation
            wall = float(getattr(e, "wall_s", 0.0))
            device = min(float(getattr(e, "device_s", 0.0)), wall) if wall else float(getattr(e, "device_s", 0.0))
            x = i * (bar_w + gap)
            h_wall = max(1.0, height * wall / longest)
            h_dev = height * device / longest
            light, dark = ("#f4a6a6", "#d62728") if not r.succeeded else ("#a6c8f4", "#1f77b4")
            tip = html.escape(r.label + ("" if r.succeeded else f" failed: {r.error}") + "\n" + e.summary_line())
            parts.append(
                f"<g><title>{tip}</title>"
                f"<rect x='{x}' y='{height - h_wall:.1f}' width='{bar_w}' height='{h_wall:.1f}' fill='{light}'/>"
                f"<rect x='{x}' y='{height - h_dev:.1f}' width='{bar_w}' height='{h_dev:.1f}' fill='{dark}'/>"
                f"<text x='{x + bar_w / 2}' y='{height + label_h - 2}' font-size='10' text-anchor='middle'>"
                f"{r.execution_count if r.execution_count is not None else '?'}</text></g>"
            )
        width = len(self.chart_cells) * (bar_w + gap)
        return (f"<div style='{_BOX_STYLE}'>{title}; longest {format_seconds(longest)}<br>"
                f"<svg width='{width}' height='{height + label_h}' role='img'>{''.join(parts)}</svg></div>")

    # ---- display ---------------------------------------------------------------------------

    def __repr__(self) -> str:
        lines = [f"neuron dashboard (mode {self.mode}, {len(self.memory_bars)} cores{self._last_label()})"]
        lines.append(_text_table(["device", "allocated", "reserved", "peak", "capacity"],
                                 [[f"neuron:{m.index}", format_bytes(m.allocated), format_bytes(m.reserved),
                                   format_bytes(m.peak), format_bytes(m.capacity)] for m in self.memory]))
        depths = ", ".join(f"neuron:{s.device}/{s.stream_id}: {s.queue_depth}" for s in self.streams)
        lines.append(f"queued launches: {depths}")
        lines.append("graph cache: " + ", ".join(f"{k} {v}" for k, v in self._graph_cache_items()))
        if self.chart_cells:
            lines.append("last cells: " + "; ".join(
                f"{r.label} {format_seconds(float(getattr(r.explanation, 'wall_s', 0.0)))}"
                + ("" if r.succeeded else " FAILED") for r in self.chart_cells))
        return "\n".join(lines)

    def _repr_mimebundle_(self, **kwargs: Any) -> dict:
        bundle = self.widget._repr_mimebundle_(**kwargs) if self.widget._repr_mimebundle_ else None
        bundle = dict(bundle or {})
        bundle["text/plain"] = repr(self)
        return bundle


def _running_shell() -> Any:
    """The running IPython shell, without importing IPython when none runs."""
    import sys

    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


def stop_dashboards(shell: Any) -> None:
    """Stops every dashboard following ``shell`` (``%unload_ext neuron_lab``)."""
    for dashboard in list(_LIVE):
        if dashboard.shell is shell:
            dashboard.stop()
