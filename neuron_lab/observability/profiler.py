"""The neuron profiler: every launch of a region, with its timing, graph, tier,
memory and the user's source line.

    with neuron_lab.profiler.profile() as prof:
        train_step()
    prof.table()               # per graph / kernel and per op
    prof.timeline()            # lanes per stream + host
    prof.export_chrome_trace("trace.json")

Cost while profiling: one record per launch (not per op in the host's hot path:
ops are described when their buffer is flushed) plus a clock read per replayed
op; nothing is recorded when no profiler runs.
"""

from __future__ import annotations

import os
import threading
from typing import Optional, Union

from neuron_lab.device import trace
from neuron_lab.observability import export
from neuron_lab.observability.explain import Explanation, explain_scope
from neuron_lab.observability.records import Event, Launch, MemorySample, events_since
from neuron_lab.observability.table import ProfileTable

__all__ = ["Profile", "profile", "start", "stop"]

PathLike = Union[str, "os.PathLike[str]"]


class Profile:
    """What a profiled region did: ``launches``, ``events`` (syncs, new graphs,
    inline ops, compiles), ``memory`` samples, and its ``explanation``."""

    def __init__(self, launches: list[Launch], events: list[Event], memory: list[MemorySample], start_ns: int,
                 end_ns: int, explanation: Explanation) -> None:
        self.launches = launches
        self.collectives = explanation.collectives  # torch.distributed collectives of this rank
        self.events = events
        self.memory = memory
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.explanation = explanation

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    def table(self, sort_by: str = "device_time", top: int = 20) -> ProfileTable:
        """Launches per graph / kernel and ops per name: count, host time, device time,
        share of the device time. ``sort_by``: device_time, host_time, count or name;
        ``top``: rows per section (0: all)."""
        return ProfileTable(self.launches, sort_by=sort_by, top=top, collectives=self.collectives)

    def timeline(self):
        """A matplotlib Figure: a lane per stream per core and the host lane."""
        from neuron_lab.observability import timeline  # matplotlib only when asked for

        return timeline.timeline_figure(self)

    def memory_timeline(self):
        """A matplotlib Figure: allocated and reserved bytes per core over time, peak marked."""
        from neuron_lab.observability import timeline

        return timeline.memory_figure(self)

    def export_chrome_trace(self, path: PathLike):
        """Writes a Chrome trace (open it in https://ui.perfetto.dev or chrome://tracing)."""
        return export.write_chrome_trace(self, path)

    def export_csv(self, path: PathLike):
        """Writes launches to ``path`` and ops to ``<path stem>_ops.csv``; returns both paths."""
        return export.write_csv(self, path)

    def export_parquet(self, path: PathLike):
        """Writes launches to ``path`` and ops to ``<path stem>_ops.parquet`` (needs pyarrow)."""
        return export.write_parquet(self, path)

    def launch_table(self) -> list[dict]:
        """The launches as rows (``pandas.DataFrame(prof.launch_table())``)."""
        return export.launch_table(self)

    def op_table(self) -> list[dict]:
        """The recorded ops as rows."""
        return export.op_table(self)

    def explain(self) -> Explanation:
        """Why the region took its time (see ``neuron_lab.explain_scope``)."""
        return self.explanation

    def __repr__(self) -> str:
        return (f"<neuron_lab Profile: {len(self.launches)} launches, {len(self.events)} events, "
                f"{self.duration_s * 1e3:.1f} ms>")

    def __str__(self) -> str:
        return f"{self.explanation.summary_line()}\n\n{self.table()}"

    def _repr_html_(self) -> str:
        return (f"<div><code>{self.explanation.summary_line()}</code></div>" + self.table()._repr_html_())


class profile:
    """Profiles a region: ``with neuron_lab.profiler.profile() as prof:``; ``prof``
    is filled when the block ends (after the region's device work finished).
    Profilers nest; each sees the launches made while it ran."""

    def __init__(self, label: str = "profiled region") -> None:
        self._label = label
        self._handle: Optional[int] = None
        self._scope: Optional[explain_scope] = None
        self.result: Optional[Profile] = None

    def __enter__(self) -> Profile:
        self.start()
        # The Profile object exists from the start so `as prof` can be used at once;
        # it is filled in place at exit.
        self.result = Profile([], [], [], 0, 0, self._scope.explanation)
        return self.result

    def start(self) -> None:
        if self._handle is not None:
            raise RuntimeError("this profiler is already running; call stop() first")
        self._scope = explain_scope(label=self._label)
        self._scope.__enter__()
        self._handle = trace.start_profile()

    def stop(self) -> Profile:
        if self._handle is None:
            raise RuntimeError("this profiler is not running; call start() first")
        error: Optional[BaseException] = None
        try:
            self._scope.__exit__(None, None, None)  # finishes the region's device work
        except Exception as e:
            error = e
        raw = trace.stop_profile(self._handle)
        self._handle = None
        launches = [Launch.from_native(d) for d in raw["launches"]]
        memory = [MemorySample(*s) for s in raw["memory"]]
        events = events_since(raw["start_ns"], raw["end_ns"])
        result = self.result if self.result is not None else Profile([], [], [], 0, 0, self._scope.explanation)
        result.launches, result.events, result.memory = launches, events, memory
        result.collectives = self._scope.explanation.collectives
        result.start_ns, result.end_ns = raw["start_ns"], raw["end_ns"]
        self.result = result
        if error is not None:
            error.profile = result  # the profile survives an asynchronous error of the region
            raise error
        return result

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.stop()
        except Exception:
            if exc_type is None:
                raise


_current: Optional[profile] = None
_lock = threading.Lock()


def start(label: str = "profiled region") -> None:
    """Starts the session-wide profiler (``stop()`` returns its :class:`Profile`)."""
    global _current
    with _lock:
        if _current is not None:
            raise RuntimeError("neuron_lab.profiler.start() was already called; call neuron_lab.profiler.stop() "
                               "first, or use `with neuron_lab.profiler.profile() as prof:` for nested regions")
        p = profile(label)
        p.start()
        _current = p


def stop() -> Profile:
    """Stops the profiler started by ``start()`` and returns its :class:`Profile`."""
    global _current
    with _lock:
        if _current is None:
            raise RuntimeError("neuron_lab.profiler.stop() without start(): call neuron_lab.profiler.start() first")
        p, _current = _current, None
    return p.stop()
