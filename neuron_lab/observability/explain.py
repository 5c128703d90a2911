"""Why was this slow? A diagnosis of a region of code on the neuron device.

``with neuron_lab.explain_scope() as e:`` measures a region; afterwards ``e``
says how its wall time split (recording ops, waiting for the device, other;
device busy and background compiles alongside: ``TIME_PARTS``), and lists every new graph and
recompile with its cause and line, every host wait (sync) with its trigger and
line, and every op that ran inline instead of being fused.
``neuron_lab.explain(fn)(*args)`` does the same for one call.
"""

from __future__ import annotations

import dataclasses
import functools
import html
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from neuron_lab.adaptive_eager import stats
from neuron_lab.device import trace
from neuron_lab.device.trace import Reason
from neuron_lab.device.core import device_count
from neuron_lab.device.units import format_bytes  # re-exported: the unit of the reports
from neuron_lab.distributed.records import CollectiveRecord
from neuron_lab.observability.collectives import collectives_between, collectives_html, collectives_text
from neuron_lab.observability.records import Event, events_since, format_source, now_ns

__all__ = ["Explanation", "explain", "explain_scope", "format_bytes", "format_seconds", "TIME_PARTS"]

# What each part of a region's time is (the per-cell line, %neuron_status, the dashboard's
# tooltips and the README say it with these words). The host parts are the region's own
# thread, each moment counted once: they and "other" add up to wall.
TIME_PARTS = {
    "wall": "time from the start to the end of the cell (of the region), its device work finished",
    "recording": "host time the runtime spent recording ops and building launches from them "
                 "(adaptive eager's 'tracing'); a part of wall",
    "waiting": "host time blocked waiting for the device: a value read (.item(), printing), a "
               "synchronize, or the end of the cell; queued launches the host ran itself meanwhile "
               "count here; a part of wall",
    "running ops": "host time running ops at once on the calling thread instead of recording them "
                   "(blocking mode, ops that cannot be recorded); a part of wall",
    "other": "the rest of wall: your Python code, PyTorch's Python layers, CPU work",
    "device busy": "wall time during which at least one launch ran on some core or stream; it "
                   "overlaps the host's parts (the device runs while the host records), so it is "
                   "not one of them, and never more than wall",
    "compile": "background compiles (the compiled tier, torch.compile) during the cell, on other "
               "threads; overlaps the rest, never more than wall",
}


def format_seconds(s: float) -> str:
    """``12.3 ms``, ``4.56 s``, ``870 µs``."""
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} µs"


# What triggered a host wait, in the user's words.
_SYNC_TRIGGERS = {
    Reason.COPY_TO_HOST: "a copy to the host (.cpu(), .numpy(), .tolist(), printing)",
    Reason.COPY_FROM_HOST: "a copy from host memory into a tensor still in use by the device",
    Reason.COPY_BETWEEN_CORES: "a copy between cores",
    Reason.SYNCHRONIZE: "torch.neuron.synchronize() (or torch.accelerator.synchronize())",
    Reason.EVENT_SYNCHRONIZE: "Event.synchronize()",
    Reason.MEMORY_STATISTICS: "reading memory statistics",
    Reason.MEMORY_SNAPSHOT: "a memory snapshot",
    Reason.OUT_OF_MEMORY: "memory ran out, so queued launches ran to give theirs back",
    Reason.RANDOM_STATE: "reading or seeding the random generator",
    Reason.MODE_CHANGE: "a change of execution mode",
}
# Waits that only read the runtime's bookkeeping: not, by themselves, use of the device.
_BOOKKEEPING_SYNCS = {Reason.MEMORY_STATISTICS, Reason.MEMORY_SNAPSHOT}
# The host reads device values: the waits a user's loop usually causes.
_HOST_READS = {Reason.HOST_READ, Reason.COPY_TO_HOST}
# Launches that are one inline launch on purpose.
_BY_DESIGN = {
    Reason.COMPILED_GRAPH: "a torch.compile graph: one launch by design",
    Reason.CUSTOM_KERNEL: "a custom kernel (neuron_lab.kernels): a fusion boundary by design",
    Reason.COLLECTIVE: "a torch.distributed collective: a fusion boundary by design",
}


def _trigger(reason: Reason, what: str) -> str:
    """A host wait's trigger, in words."""
    if reason == Reason.HOST_READ:
        return f"a value read on the host by {what} (.item(), float(), bool(), if/while on a tensor, printing)"
    if reason in _SYNC_TRIGGERS:
        return _SYNC_TRIGGERS[reason]
    if reason == Reason.METADATA_CHANGE:
        return f"{what}, which changes metadata that queued launches read"
    if reason in _BY_DESIGN:
        return f"{what}, {_BY_DESIGN[reason]}"
    return f"{what}, which runs on the host and needs its inputs now"


def _counters_snapshot() -> dict:
    c = stats.counters()
    phases = trace.thread_phases()  # this thread's: a region's parts then add up to its wall time
    return {
        "counters": c,
        "busy_ns": trace.busy_union_ns(),
        "record_ns": phases["recording_ns"],
        "wait_ns": phases["waiting_ns"],
        "running_ops_ns": phases["running_ops_ns"],
        # As of the allocator's last change: reading it does not wait for the device
        # (the scope's exit synchronizes first, so the end value is settled).
        "allocated": trace.allocated(),
    }


def _settled_allocated() -> list[int]:
    """Allocated bytes per core once pending tensors got their memory (waits for the device)."""
    return [torch.neuron.memory_allocated(d) for d in range(device_count())]


@dataclass
class Explanation:
    """A diagnosis of one region; see the module docstring. Filled when the region ends."""

    wall_s: float = 0.0
    device_s: float = 0.0  # "device busy" (TIME_PARTS)
    host_tracing_s: float = 0.0  # "recording"
    compile_s: float = 0.0
    sync_wait_s: float = 0.0  # "waiting"
    host_running_ops_s: float = 0.0  # "running ops"
    launches: int = 0
    graph_launches: int = 0
    graphs_built: int = 0
    cache_hits: int = 0
    compiles: int = 0
    syncs: int = 0
    inline_ops: int = 0
    ops_recorded: int = 0
    peak_bytes: int = 0
    memory_delta_bytes: int = 0
    events: list[Event] = field(default_factory=list)
    collectives: list[CollectiveRecord] = field(default_factory=list)  # torch.distributed on neuron
    label: str = "region"
    # A profile's modelled NeuronCore time of its launches (cost_model); None when the region
    # was not profiled (an explain scope records no launches).
    modelled_device_s: Optional[float] = None
    modelled_core: str = ""

    # ---- derived ------------------------------------------------------------------------------
    _start_allocated: int = 0

    @property
    def used_device(self) -> bool:
        """Whether the region launched, recorded, waited for or allocated anything on neuron."""
        own = [e for e in self.events
               if not (e.kind == "sync" and (e.reason in _BOOKKEEPING_SYNCS or e.by_profiler))]
        # A region that only freed memory (e.g. IPython dropping an old output) did not use it.
        return bool(self.launches or self.ops_recorded or self.inline_ops or own
                    or self.memory_delta_bytes > 0 or self.peak_bytes > self._start_allocated)

    def _of(self, *kinds: str) -> list[Event]:
        return [e for e in self.events if e.kind in kinds]

    @property
    def new_graphs(self) -> list[Event]:
        """New graphs and recompiles, with their cause (``detail``) and line."""
        return self._of("new_graph", "recompile")

    @property
    def recompiles(self) -> list[Event]:
        """Graphs built because a cached graph with the same ops got other inputs."""
        return self._of("recompile")

    @property
    def sync_events(self) -> list[Event]:
        """Every host wait of the user's code, with its trigger (``what``), line and duration
        (a profiler's or explain scope's own waits are not the user's: ``Event.by_profiler``)."""
        return [e for e in self._of("sync") if not e.by_profiler]

    @property
    def inline_events(self) -> list[Event]:
        """Ops that ran inline on the host thread (a fusion boundary), other than host reads.
        Custom kernels and torch.compile graphs are such launches by design; their
        ``detail`` says so."""
        out = []
        for e in self._of("inline_op"):
            if e.reason in _HOST_READS:
                continue
            if e.reason in _BY_DESIGN:
                e = dataclasses.replace(e, detail=_BY_DESIGN[e.reason])
            out.append(e)
        return out

    @property
    def device_text(self) -> str:
        """``device busy 12.3 ms`` (emulated), with the modelled time beside it when the region was profiled."""
        if self.modelled_device_s is None:
            return f"device busy {format_seconds(self.device_s)}"
        return (f"device busy {format_seconds(self.device_s)} emulated, "
                f"{format_seconds(self.modelled_device_s)} modelled")

    @property
    def other_s(self) -> float:
        """Wall time the host spent outside the runtime: the user's code, PyTorch's Python, CPU work."""
        return max(0.0, self.wall_s - self.host_tracing_s - self.sync_wait_s - self.host_running_ops_s)

    def time_parts(self) -> list[tuple[str, float]]:
        """The host's parts of wall time (``TIME_PARTS``): they add up to ``wall_s``."""
        parts = [("recording", self.host_tracing_s), ("waiting", self.sync_wait_s)]
        if self.host_running_ops_s:
            parts.append(("running ops", self.host_running_ops_s))
        return parts + [("other", self.other_s)]

    def _time_split(self) -> str:
        """``wall W = recording + waiting (+ running ops) + other``, the words of ``TIME_PARTS``."""
        split = " + ".join(f"{name} {format_seconds(seconds)}" for name, seconds in self.time_parts())
        return f"wall {format_seconds(self.wall_s)} = {split}"

    def _coloured_parts(self) -> list[tuple[str, float, str]]:
        colours = {"recording": "#4c72b0", "waiting": "#c44e52", "running ops": "#dd8452", "other": "#bbbbbb"}
        return [(name, seconds, colours[name]) for name, seconds in self.time_parts()]

    def summary_line(self) -> str:
        """One compact line: what the region cost and did on the device. Its time parts are
        defined in ``TIME_PARTS``: wall = recording + waiting (+ running ops) + other;
        device busy and compile overlap them and are never more than wall."""
        parts = [self._time_split(), self.device_text]
        if self.compile_s:
            parts.append(f"compile {format_seconds(self.compile_s)} (background)")
        parts.append(f"{self.launches} launches ({self.graph_launches} graphs, {self.cache_hits} cached)")
        parts.append(f"{self.syncs} syncs")
        parts.append(f"peak {format_bytes(self.peak_bytes)} ({'+' if self.memory_delta_bytes >= 0 else ''}"
                     f"{format_bytes(self.memory_delta_bytes)})")
        if self.collectives:
            parts.append(f"{len(self.collectives)} collectives ({format_bytes(self.collective_bytes)}, "
                         f"{format_seconds(self.collective_s)})")
        return "neuron: " + " | ".join(parts)

    @property
    def collective_bytes(self) -> int:
        """Bytes this rank's collectives moved in the region."""
        return sum(r.bytes_moved for r in self.collectives)

    @property
    def collective_s(self) -> float:
        """Seconds the region spent in collectives."""
        return sum(r.duration_ns for r in self.collectives) / 1e9

    # ---- findings -----------------------------------------------------------------------------
    def _grouped(self, events: list[Event]) -> list[tuple[Reason, str, str, int, float]]:
        """(reason, what, line, count, seconds) per distinct trigger and line, biggest first."""
        groups: dict[tuple[Reason, str, str], list[Event]] = defaultdict(list)
        for e in events:
            groups[(e.reason, e.what, format_source(e.source))].append(e)
        rows = [(reason, what, line, len(es), sum(x.duration_ns for x in es) / 1e9)
                for (reason, what, line), es in groups.items()]
        return sorted(rows, key=lambda r: (-r[4], -r[3]))

    def advice(self) -> list[str]:
        """What to change, from the findings."""
        out = []
        if self.recompiles:
            out.append("Input shapes, dtypes or integer arguments change between iterations, so graphs are "
                       "rebuilt: keep them fixed (pad or bucket batch sizes, pass changing integers as tensors).")
        reads = [e for e in self.sync_events if e.reason in _HOST_READS]
        if len(reads) > 1:
            out.append("The host reads device values repeatedly (e.g. loss.item() every step), and every read "
                       "waits for the queued work behind that value: accumulate on the device and read once at the end.")
        unplanned = [e for e in self.inline_events if e.reason not in _BY_DESIGN]
        if unplanned:
            ops = sorted({e.what for e in unplanned})
            out.append(f"{', '.join(ops[:4])} ran inline and cut the fused graphs in pieces; see why above.")
        if self.compile_s and self.compile_s > 0.5 * max(self.wall_s, 1e-9):
            out.append("Background compiles took a large share of this region; they pay off in later runs "
                       "(set neuron_lab.configure(compile=False) to turn them off).")
        if not out and self.launches and self.device_s < 0.2 * self.wall_s:
            out.append("The device was idle most of the time: the host side (Python, recording) dominates; "
                       "bigger tensors or fewer, larger ops help.")
        return out

    def __str__(self) -> str:
        lines = [f"neuron_lab.explain: {self.label} took {format_seconds(self.wall_s)}"]
        lines.append(
            f"  time: {self._time_split()} | {self.device_text}"
            f" | compile {format_seconds(self.compile_s)} (background)")
        if self.modelled_device_s is not None:
            lines.append(f"  (emulated: what this machine's CPU took; modelled: what a {self.modelled_core} would "
                         "take, from each op's FLOPs and bytes and a launch overhead)")
        lines.append(
            f"  launches: {self.launches} ({self.graph_launches} graphs: {self.graphs_built} new, "
            f"{self.cache_hits} cached; {self.inline_ops} inline ops; {self.ops_recorded} ops recorded)")
        lines.append(f"  memory: peak {format_bytes(self.peak_bytes)}, change {format_bytes(self.memory_delta_bytes)}")
        if self.new_graphs:
            lines.append(f"  new graphs and recompiles ({len(self.new_graphs)}):")
            for e in self.new_graphs:
                lines.append(f"    {e.kind.replace('_', ' ')} {e.what} at {format_source(e.source)}")
                lines.append(f"      cause: {e.detail}")
        if self.sync_events:
            lines.append(f"  host waits ({len(self.sync_events)}, {format_seconds(self.sync_wait_s)}):")
            for reason, what, line, count, seconds in self._grouped(self.sync_events)[:10]:
                lines.append(f"    {count} x {_trigger(reason, what)} at {line}: {format_seconds(seconds)}")
        if self.inline_events:
            lines.append(f"  ops run inline, not fused ({len(self.inline_events)}):")
            why = {e.what: e.detail for e in self.inline_events}
            for _, what, line, count, _ in self._grouped(self.inline_events)[:10]:
                lines.append(f"    {count} x {what} at {line}: {why[what]}")
        if self.collectives:
            lines.append(f"  collectives ({len(self.collectives)}: {format_bytes(self.collective_bytes)} moved, "
                         f"{format_seconds(self.collective_s)}):")
            lines.extend("    " + line for line in collectives_text(self.collectives).splitlines())
        compiles = self._of("compile", "compile_failed", "compiled_fallback")
        if compiles:
            lines.append(f"  compiles ({len(compiles)}):")
            for e in compiles:
                took = f" in {format_seconds(e.duration_ns / 1e9)}" if e.duration_ns else ""
                lines.append(f"    {e.kind.replace('_', ' ')} {e.what}{took}: {e.detail}")
        advice = self.advice()
        if advice:
            lines.append("  advice:")
            lines.extend(f"    - {a}" for a in advice)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.summary_line()

    def _repr_pretty_(self, p, cycle: bool) -> None:
        p.text(str(self))

    def _repr_html_(self) -> str:
        esc = html.escape

        def section(title: str, rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
            if not rows:
                return ""
            head = "".join(f"<th style='text-align:left'>{esc(h)}</th>" for h in header)
            body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{esc(str(c))}</td>" for c in r) + "</tr>"
                           for r in rows)
            return f"<h4>{esc(title)}</h4><table class='neuron-explain'><tr>{head}</tr>{body}</table>"

        total = max(self.wall_s, 1e-12)
        bars = "".join(
            f"<div title='{esc(n)} {format_seconds(v)}' style='display:inline-block;height:10px;"
            f"width:{max(0.0, min(1.0, v / total)) * 100:.1f}%;background:{c}'></div>"
            for n, v, c in self._coloured_parts()
        )
        out = [f"<div class='neuron-explain'><b>neuron_lab.explain</b>: {esc(self.label)} took "
               f"{format_seconds(self.wall_s)}",
               f"<div style='width:420px;background:#eee'>{bars}</div>",
               f"<div>{esc(self._time_split())} · {esc(self.device_text)} · "
               f"compile {format_seconds(self.compile_s)} (background)</div>",
               f"<div>{self.launches} launches ({self.graph_launches} graphs: {self.graphs_built} new, "
               f"{self.cache_hits} cached; {self.inline_ops} inline ops) · peak {format_bytes(self.peak_bytes)}, "
               f"change {format_bytes(self.memory_delta_bytes)}</div>"]
        out.append(section("New graphs and recompiles", [(e.kind.replace("_", " "), e.what, format_source(e.source),
                                                         e.detail) for e in self.new_graphs],
                           ("kind", "graph", "line", "cause")))
        out.append(section("Host waits", [(str(n), _trigger(r, w), line, format_seconds(s))
                                          for r, w, line, n, s in self._grouped(self.sync_events)],
                           ("count", "trigger", "line", "waited")))
        why = {e.what: e.detail for e in self.inline_events}
        out.append(section("Ops run inline (not fused)", [(str(n), w, line, why[w])
                                                         for _, w, line, n, _ in self._grouped(self.inline_events)],
                           ("count", "op", "line", "why")))
        if self.collectives:
            out.append("<h4>Collectives</h4>" + collectives_html(self.collectives))
        advice = self.advice()
        if advice:
            out.append("<h4>Advice</h4><ul>" + "".join(f"<li>{esc(a)}</li>" for a in advice) + "</ul>")
        out.append("</div>")
        return "".join(out)


class explain_scope:
    """Measures a region: ``with neuron_lab.explain_scope() as e: ...``; ``e`` is an
    :class:`Explanation`, filled when the block ends.

    At exit the region's pending device work is finished (so its device time
    and any asynchronous error belong to it); such an error is raised from the
    exit, after the numbers are filled in. Scopes nest, also inside profilers.
    """

    def __init__(self, label: str = "region") -> None:
        self.explanation = Explanation(label=label)
        self._start: Optional[dict] = None

    def __enter__(self) -> Explanation:
        if self._start is not None:
            raise RuntimeError("neuron_lab.explain_scope() is already active; create a new one for each region")
        self._watermark = trace.open_watermark()
        self._t0 = time.perf_counter()  # before the snapshot, and the wall time ends after the last one:
        self._start_ns = now_ns()       # the parts it holds are measured inside the wall time
        self._start = _counters_snapshot()
        return self.explanation

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._start is None:
            raise RuntimeError("neuron_lab.explain_scope() exited without being entered")
        error: Optional[BaseException] = None
        self._end_ns = now_ns()  # the final wait below is the scope's, not one of the region's syncs
        # The scope's own waits (finishing the region's work, reading its memory) are not the
        # user's: an enclosing scope (the notebook cell's) must not list them.
        with trace.profiler_waits():
            try:
                stats.synchronize_all(Reason.SYNCHRONIZE)  # every core: the region may have used several
            except Exception as e:  # an asynchronous error of the region: reported after the numbers
                error = e
            finally:
                self._finish()
        if error is not None and exc_type is None:
            raise error

    def _finish(self) -> None:
        end_ns = self._end_ns
        peaks = trace.close_watermark(self._watermark)
        end = _counters_snapshot()
        wall = time.perf_counter() - self._t0
        end["allocated"] = _settled_allocated()
        start = self._start
        self._start = None
        c0, c1 = start["counters"], end["counters"]
        e = self.explanation
        e.wall_s = wall
        e.device_s = min(wall, (end["busy_ns"] - start["busy_ns"]) / 1e9)
        e.host_tracing_s = (end["record_ns"] - start["record_ns"]) / 1e9
        e.sync_wait_s = (end["wait_ns"] - start["wait_ns"]) / 1e9
        e.host_running_ops_s = (end["running_ops_ns"] - start["running_ops_ns"]) / 1e9
        e.events = events_since(self._start_ns, end_ns)
        e.collectives = collectives_between(self._start_ns, end_ns)
        # Compiles run in the background: count those that finished in the region, and the
        # time inside the region during which one ran (several at once count once).
        compiles = [x for x in e.events if x.kind in ("compile", "compile_failed")]
        e.compiles = len(compiles)
        e.compile_s = min(wall, _covered_ns([(x.time_ns, x.time_ns + x.duration_ns) for x in compiles],
                                            self._start_ns, now_ns()) / 1e9)
        for key in ("launches", "graph_launches", "graphs_built", "cache_hits", "inline_ops", "ops_recorded"):
            setattr(e, key, int(c1[key] - c0[key]))
        e.syncs = len(e.sync_events)
        e._start_allocated = sum(start["allocated"])
        # Pending results get their memory when the region settles: the peak includes that.
        e.peak_bytes = int(max(list(peaks) + end["allocated"]))
        e.memory_delta_bytes = int(sum(end["allocated"]) - sum(start["allocated"]))


def _covered_ns(intervals: list[tuple[int, int]], start: int, end: int) -> int:
    """Nanoseconds of [start, end] covered by at least one of the intervals."""
    covered, reach = 0, start
    for lo, hi in sorted((max(lo, start), min(hi, end)) for lo, hi in intervals):
        if hi <= reach:
            continue
        covered += hi - max(lo, reach)
        reach = hi
    return covered


def explain(fn: Callable[..., Any], *, label: Optional[str] = None) -> Callable[..., Explanation]:
    """``neuron_lab.explain(fn)(*args, **kwargs)`` runs ``fn`` once and returns the
    :class:`Explanation` of that call (its result is in ``.result``), in the style
    of ``torch._dynamo.explain``."""
    if not callable(fn):
        raise TypeError(f"neuron_lab.explain(fn) takes a function to run, got {type(fn).__name__}; "
                        "to explain a block of code use `with neuron_lab.explain_scope() as e:`")

    @functools.wraps(fn)
    def run(*args, **kwargs) -> Explanation:
        scope = explain_scope(label=label or f"{getattr(fn, '__qualname__', 'fn')}(...)")
        with scope as e:
            e.result = fn(*args, **kwargs)
        return e

    return run
