"""A live panel of the neuron device, built with ipywidgets.

What it shows: memory per core over the last minute, each core's busy share and its
streams' queues, launches and host waits per second, the graph cache, and the last cells
(wall and device time; failed cells in red, interrupted ones in orange), with the cell
running now and for how long.

How it stays live: a daemon thread reads the device's counters twice a second and sets
the widgets' values. Each change travels to the browser as a comm message sent from that
thread on ipykernel's IOPub channel, which does not wait for the kernel's main thread:
the panel moves while a cell runs. The thread's reads never wait for the device (the
allocator's last count of allocated bytes, running totals, queue depths; no memory
statistics, which would finish pending work), so the panel does not change what it
watches. After every cell (IPython's ``post_run_cell``, through the per-cell timer) it
also reads the full memory statistics (reserved, peak), on the kernel's thread.

To keep it in view in JupyterLab: right-click it, choose "Create New View for Cell
Output" and drag the new tab to the right edge: the same widget stays beside the notebook
while you scroll (JupyterLab's own feature; no extension to build).

``neuron_lab.Dashboard()`` is the plain-Python twin of ``%neuron_dashboard``.
"""

from __future__ import annotations

import collections
import html
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Deque, Optional

import torch

from neuron_lab.magics.autotime import CellRecord, CellTimer, timer_for
from neuron_lab.magics.display import (
    DeviceMemory,
    StreamState,
    _text_table,
    format_bytes,
    read_streams,
)
from neuron_lab.observability.explain import TIME_PARTS, format_seconds

__all__ = ["Dashboard", "LiveSample", "stop_dashboards"]

# Every dashboard still updating, so that %unload_ext can stop them.
_LIVE: "weakref.WeakSet[Dashboard]" = weakref.WeakSet()

_BOX_STYLE = "font-family:monospace;font-size:12px;white-space:nowrap"
_CORE_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf")
_HISTORY_S = 60.0  # the memory chart's window
_FAILED = ("#f4a6a6", "#d62728")
_INTERRUPTED = ("#fdd0a2", "#e6550d")
_SUCCEEDED = ("#a6c8f4", "#1f77b4")
_MAX_TICK_FAILURES = 3


@dataclass(frozen=True)
class Rates:
    """The activity panel's numbers, over the last second or so."""

    busy: list[float]  # share of the time each core was busy
    launches: float  # per second
    ops_at_once: float  # per second: where graphs do not pay, ops run at once instead of launches
    host_waits: float  # per second
    waiting: float  # share of the time the host waited


@dataclass(frozen=True)
class LiveSample:
    """What the live thread reads, without waiting for the device."""

    time: float  # time.monotonic()
    allocated: tuple[int, ...]  # per core, as the allocator last counted
    busy_ns: tuple[int, ...]  # per core, running total of launch execution time
    launches: int
    ops_at_once: int  # ops the runtime ran at once on the calling thread, not in a launch
    host_waits: int
    wait_ns: int  # running total of host time spent waiting
    queued: tuple[tuple[int, int, int], ...]  # (core, stream, launches queued)

    @classmethod
    def read(cls, cores: int) -> "LiveSample":
        import neuron_lab.adaptive_eager as ae
        from neuron_lab.device import trace
        from neuron_lab.device.streams import num_streams

        counters = ae.counters()
        totals = trace.totals()
        queued = tuple((d, s, ae.queue_depth(d, s)) for d in range(cores) for s in range(num_streams(d)))
        return cls(time=time.monotonic(), allocated=tuple(trace.allocated()[:cores]),
                   busy_ns=tuple(totals["device_busy_ns"][:cores]), launches=int(counters["launches"]),
                   ops_at_once=int(counters["ops_run_at_once"]),
                   host_waits=int(sum((counters.get("syncs") or {}).values())), wait_ns=int(totals["wait_ns"]),
                   queued=queued)


class Dashboard:
    """Live view of the neuron device for notebooks (ipywidgets); text in terminals.

    Args:
        cells: how many of the last cells the timing chart shows.
        shell: the IPython shell to follow (default: the running one). Without a shell
            the dashboard changes with the live thread and when ``update()`` is called.
        interval: seconds between live updates (0: none, only after cells).

    The widget is ``.widget`` (a VBox with the CSS class ``neuron-dashboard``); the
    numbers last shown are in ``.memory``, ``.streams``, ``.counters``, ``.cached_graphs``,
    ``.chart_cells`` and, live, ``.samples``. ``.updates`` counts full updates (after
    cells, Refresh), ``.ticks`` live ones.
    """

    def __init__(self, cells: int = 20, shell: Any = None, interval: float = 0.5) -> None:
        import ipywidgets as widgets

        if cells < 1:
            raise ValueError(f"cells must be at least 1, got {cells}")
        if interval < 0:
            raise ValueError(f"interval must be >= 0 seconds (0: no live updates), got {interval}")
        self.cells = cells
        self.interval = interval
        self.shell = shell if shell is not None else _running_shell()
        self.timer: Optional[CellTimer] = None
        self.memory: list[DeviceMemory] = []
        self.streams: list[StreamState] = []
        self.counters: dict = {}
        self.cached_graphs = 0
        self.pending_compiles = 0
        self.mode = ""
        self.chart_cells: list[CellRecord] = []
        self.samples: Deque[LiveSample] = collections.deque(maxlen=int(4 * _HISTORY_S / max(interval, 0.25)) + 8)
        self.updates = 0
        self.ticks = 0
        self.following = False
        self.live_error: Optional[str] = None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._cached_base = (0, 0)  # (graphs in the cache, built less evicted) at the last full update
        self._tick_failures = 0

        count = torch.neuron.device_count()
        self.capacity = [int(torch.neuron.mem_get_info(i)[1]) for i in range(count)]
        self.header = widgets.HTML()
        self.memory_bars = [
            widgets.FloatProgress(min=0.0, max=float(max(self.capacity[i], 1)), value=0.0, description=f"neuron:{i}",
                                  layout=widgets.Layout(width="320px"))
            for i in range(count)
        ]
        self.memory_labels = [widgets.HTML() for _ in range(count)]
        self.memory_chart_html = widgets.HTML()
        self.activity_html = widgets.HTML()
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
                widgets.HTML("<b>memory</b> (bar: allocated / capacity; chart: allocated over the last minute)"),
                *memory_rows,
                self.memory_chart_html,
                # Wraps in a narrow view (the panel docked beside a notebook) instead of squeezing.
                widgets.HBox([self.activity_html, self.streams_html, self.graph_cache_html],
                             layout=widgets.Layout(flex_flow="row wrap")),
                self.chart_html,
            ]
        )
        self.widget.add_class("neuron-dashboard")
        self._follow()
        self.update()
        if interval > 0:
            self._start_live()

    # ---- following the shell and the device -------------------------------------------------

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

    def _start_live(self) -> None:
        """Starts the thread that updates the panel while cells run."""
        this = weakref.ref(self)
        stop, interval = self._stop, self.interval

        def run() -> None:
            while not stop.wait(interval):
                dashboard = this()
                if dashboard is None or not dashboard._tick_safely():
                    return
                del dashboard

        self._thread = threading.Thread(target=run, name="neuron-dashboard", daemon=True)
        self._thread.start()
        _LIVE.add(self)

    @property
    def live(self) -> bool:
        """Whether the live thread is updating the panel."""
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def stop(self) -> None:
        """Stops following the cells and the live updates (the widget keeps its last state)."""
        if self.timer is not None:
            self.timer.remove_listener(self._on_cell)
        self.following = False
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        _LIVE.discard(self)
        with self._lock:
            self.header.value = self._header_html()

    def close(self) -> None:
        """Stops following the cells and closes the widgets."""
        self.stop()
        pending = [self.widget]
        while pending:  # close the whole tree of widgets, children first
            widget = pending.pop()
            pending.extend(getattr(widget, "children", ()))
            widget.close()

    # ---- reading and showing -------------------------------------------------------------------

    def update(self) -> None:
        """Reads the device state (memory statistics included) and the kept cell timings,
        then updates every widget. Runs on the kernel's thread, after cells."""
        import neuron_lab.adaptive_eager as ae

        memory = [DeviceMemory.read(i) for i in range(len(self.memory_bars))]
        streams = read_streams()
        counters = ae.counters()
        pending = ae.pending_compiles()
        cached_graphs = len(ae.graphs())
        records = list(self.timer.records) if self.timer is not None else []
        chart_cells = [r for r in records if r.used_device or not r.succeeded][-self.cells:]
        sample = LiveSample.read(len(self.memory_bars))
        with self._lock:
            self.memory, self.streams, self.counters = memory, streams, counters
            self.cached_graphs = cached_graphs
            self._cached_base = (cached_graphs, _built_less_evicted(counters))
            self.pending_compiles, self.mode = pending, ae.get_mode()
            self.chart_cells = chart_cells
            self.samples.append(sample)
            self.updates += 1
            for bar, label, m in zip(self.memory_bars, self.memory_labels, memory):
                bar.max = float(max(m.capacity, 1))
                bar.value = float(m.allocated)
                bar.bar_style = _bar_style(m.used_fraction)
                label.value = _memory_label_html(m.allocated, m, live=False)
            self._show_live()
            self.chart_html.value = self._chart_html()

    def _tick_safely(self) -> bool:
        """One live update; False once it failed repeatedly (the thread then ends, saying why)."""
        try:
            self.tick()
        except Exception as e:  # noqa: BLE001 - a broken panel must never break the kernel
            self._tick_failures += 1
            if self._tick_failures >= _MAX_TICK_FAILURES:
                self.live_error = f"{type(e).__name__}: {e}"
                self._stop.set()
                try:
                    with self._lock:
                        self.header.value = self._header_html()
                except Exception:  # noqa: BLE001
                    pass
                return False
            return True
        self._tick_failures = 0
        return True

    def tick(self) -> None:
        """A live update from what the device shows without waiting: memory, busy cores,
        queues, launches and waits per second, the graph cache, the running cell."""
        import neuron_lab.adaptive_eager as ae

        sample = LiveSample.read(len(self.memory_bars))
        counters = ae.counters()
        with self._lock:
            self.samples.append(sample)
            self.counters = counters
            # Graphs built since the last full update, less those evicted (no walk over the cache).
            base, built = self._cached_base
            self.cached_graphs = base + _built_less_evicted(counters) - built
            self.ticks += 1
            for core, (bar, allocated) in enumerate(zip(self.memory_bars, sample.allocated)):
                bar.value = float(allocated)
                bar.bar_style = _bar_style(allocated / max(self.capacity[core], 1))
                if core < len(self.memory):  # the label follows the bar (reserved, peak: at the last cell)
                    self.memory_labels[core].value = _memory_label_html(allocated, self.memory[core], live=True)
            self._show_live()

    def _show_live(self) -> None:
        self.header.value = self._header_html()
        self.memory_chart_html.value = self._memory_chart_html()
        self.activity_html.value = self._activity_html()
        self.streams_html.value = self._streams_html()
        self.graph_cache_html.value = self._graph_cache_html()

    # ---- pieces --------------------------------------------------------------------------------

    def _last_label(self) -> str:
        timer = self.timer
        running = timer.running if timer is not None else None
        if running is not None:
            label, started = running
            return f" · running {label} for {time.monotonic() - started:.1f} s"
        last = timer.last if timer is not None else None
        if last is None:
            return ""
        state = "" if last.succeeded else (" (interrupted)" if last.interrupted else " (failed)")
        return f" · after {last.label}{state}"

    def _header_html(self) -> str:
        if self.live_error is not None:
            state = f" · <i>live updates stopped: {html.escape(self.live_error)}</i>"
        elif not self.following and not self.live:
            state = " · <i>not updating</i>"
        else:
            state = ""
        return (f"<b>neuron dashboard</b> <span style='{_BOX_STYLE}'>· mode {html.escape(self.mode)} · "
                f"{len(self.memory_bars)} cores{html.escape(self._last_label())}{state}</span>")

    def _window(self) -> list[LiveSample]:
        if not self.samples:
            return []
        newest = self.samples[-1].time
        return [s for s in self.samples if newest - s.time <= _HISTORY_S]

    def _rates(self) -> Optional[Rates]:
        """Over the last second or so, from the live samples (None before two)."""
        window = self._window()
        if len(window) < 2:
            return None
        newest = window[-1]
        older = next((s for s in reversed(window[:-1]) if newest.time - s.time >= 0.9), window[0])
        seconds = max(newest.time - older.time, 1e-9)
        busy = [min(1.0, (b1 - b0) / 1e9 / seconds) for b0, b1 in zip(older.busy_ns, newest.busy_ns)]
        return Rates(busy=busy, launches=(newest.launches - older.launches) / seconds,
                     ops_at_once=(newest.ops_at_once - older.ops_at_once) / seconds,
                     host_waits=(newest.host_waits - older.host_waits) / seconds,
                     waiting=min(1.0, (newest.wait_ns - older.wait_ns) / 1e9 / seconds))

    def _memory_chart_html(self) -> str:
        """Allocated bytes per core over the last minute: one line per core."""
        window = self._window()
        width, height = 360, 56
        if not window:
            return f"<div style='{_BOX_STYLE}'>memory over time: no samples yet</div>"
        newest = window[-1].time
        top = max(max(s.allocated) for s in window) or 1
        lines, legend = [], []
        for core in range(len(self.memory_bars)):
            colour = _CORE_COLOURS[core % len(_CORE_COLOURS)]
            points = " ".join(f"{width * (1 - (newest - s.time) / _HISTORY_S):.1f},"
                              f"{height - height * s.allocated[core] / top:.1f}" for s in window)
            lines.append(f"<polyline fill='none' stroke='{colour}' stroke-width='1.5' points='{points}'/>")
            legend.append(f"<span style='color:{colour}'>neuron:{core} {format_bytes(window[-1].allocated[core])}"
                          "</span>")
        return (f"<div style='{_BOX_STYLE}'>{' · '.join(legend)} (top of the chart: {format_bytes(top)})<br>"
                f"<svg class='neuron-memory-chart' width='{width}' height='{height}' role='img' "
                f"style='background:#f6f6f6'><title>allocated bytes per core over the last "
                f"{_HISTORY_S:.0f} s</title>{''.join(lines)}</svg></div>")

    def _activity_html(self) -> str:
        rates = self._rates()
        if rates is None:
            body = "<tr><td colspan='2'>measuring…</td></tr>"
        else:
            rows = [(f"neuron:{i} busy", f"{share * 100:.0f}%") for i, share in enumerate(rates.busy)]
            rows += [("launches / s", f"{rates.launches:.0f}"), ("ops run at once / s", f"{rates.ops_at_once:.0f}"),
                     ("host waits / s", f"{rates.host_waits:.0f}"),
                     ("host waiting", f"{rates.waiting * 100:.0f}% of the time")]
            body = "".join(f"<tr><td>{html.escape(k)}</td><td style='text-align:right'>{html.escape(v)}</td></tr>"
                           for k, v in rows)
        tip = html.escape("over the last second: " + TIME_PARTS["device busy"] + "; host waiting: "
                          + TIME_PARTS["waiting"], quote=True)
        return (f"<table class='neuron-activity' style='{_BOX_STYLE};margin-right:24px' title='{tip}'>"
                f"<tr><th colspan='2'>last second</th></tr>{body}</table>")

    def _streams_html(self) -> str:
        samples = self.samples
        queued = samples[-1].queued if samples else tuple((s.device, s.stream_id, s.queue_depth) for s in self.streams)
        done = {(s.device, s.stream_id): s.completed for s in self.streams}
        rows = "".join(
            f"<tr><td>neuron:{device}</td><td style='text-align:right'>{stream}</td>"
            f"<td style='text-align:right'>{depth}</td>"
            f"<td style='text-align:right'>{done.get((device, stream), '')}</td></tr>"
            for device, stream, depth in queued
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
        """An SVG bar chart: wall time per cell, device busy time inside it; failed cells in
        red, interrupted ones in orange. Hovering a bar shows its per-cell line."""
        definitions = html.escape("\n".join(f"{k}: {v}" for k, v in TIME_PARTS.items()), quote=True)
        title = (f"<b title='{definitions}'>last {self.cells} cells</b> that used the device or failed "
                 f"(<span title='{definitions}'>wall; dark: device busy</span>; red: failed, orange: interrupted)")
        if not self.chart_cells:
            return f"<div style='{_BOX_STYLE}'>{title}: none yet</div>"
        bar_w, gap, height, label_h = 28, 8, 80, 14
        longest = max(float(getattr(r.explanation, "wall_s", 0.0)) for r in self.chart_cells) or 1.0
        parts = []
        for i, r in enumerate(self.chart_cells):
            e = r.explanation
            wall = float(getattr(e, "wall_s", 0.0))
            device = min(float(getattr(e, "device_s", 0.0)), wall)
            x = i * (bar_w + gap)
            h_wall = max(1.0, height * wall / longest)
            h_dev = height * device / longest
            light, dark = _INTERRUPTED if r.interrupted else _FAILED if not r.succeeded else _SUCCEEDED
            state = "" if r.succeeded else (" interrupted" if r.interrupted else f" failed: {r.error}")
            tip = html.escape(r.label + state + "\n" + e.summary_line())
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

    # ---- display -------------------------------------------------------------------------------

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
                + ("" if r.succeeded else " INTERRUPTED" if r.interrupted else " FAILED") for r in self.chart_cells))
        return "\n".join(lines)

    def _repr_mimebundle_(self, **kwargs: Any) -> dict:
        bundle = self.widget._repr_mimebundle_(**kwargs) if self.widget._repr_mimebundle_ else None
        bundle = dict(bundle or {})
        bundle["text/plain"] = repr(self)
        return bundle


def _memory_label_html(allocated: int, last: DeviceMemory, live: bool) -> str:
    """The text beside a core's memory bar. Live, only the allocated bytes are read now (no
    statistics that would wait for the device); reserved and peak are as the last cell left them."""
    when = " (after the last cell)" if live else ""
    return (f"<span style='{_BOX_STYLE}'>allocated {format_bytes(allocated)} · reserved {format_bytes(last.reserved)}"
            f" · peak {format_bytes(last.peak)}{when} · capacity {format_bytes(last.capacity)}</span>")


def _bar_style(fraction: float) -> str:
    return "danger" if fraction > 0.9 else ("warning" if fraction > 0.7 else "")


def _built_less_evicted(counters: dict) -> int:
    return int(counters.get("graphs_built", 0)) - int(counters.get("graphs_evicted", 0))


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

