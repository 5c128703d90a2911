"""The neuron profiler: every launch of a region, with its timing, graph, tier,
memory and the user's source line.

    with neuron_lab.profiler.profile() as prof:
        train_step()
    prof.table()               # per graph / kernel and per op: emulated and modelled time
    prof.timeline()            # interactive: lanes for the host, each stream, collectives, memory
    prof.export_parquet("run.parquet")

    with neuron_lab.profiler.profile(torch_profiler=True) as prof:   # torch.profiler runs too
        train_step()
    prof.torch.key_averages()  # CPU ops with their device time
    prof.export_chrome_trace("trace.json")  # torch.profiler's trace, with the device's lanes

The launch records are the device's one recorder (``neuron_lab.device.trace``): the same
records make torch.profiler's device lanes (``ProfilerActivity.PrivateUse1``), so a profile
and a torch.profiler trace of one region show the same launches.

Cost while profiling: one record per launch (not per op in the host's hot path:
ops are described when their buffer is flushed) plus a clock read per replayed
op; nothing is recorded when no profiler runs. ``torch_profiler=True`` adds torch.profiler's
own cost (a record per CPU op, and its processing when the profile stops).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, Optional, Union

from neuron_lab.device import trace
from neuron_lab.files import refuse_link, replace_file
from neuron_lab.observability import cost_model, export
from neuron_lab.observability.explain import Explanation, explain_scope
from neuron_lab.observability.records import Event, Launch, MemorySample, events_since
from neuron_lab.observability.table import ProfileTable

__all__ = ["Profile", "profile", "start", "stop", "from_torch_profiler"]

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
        self.torch: Any = None  # the torch.profiler.profile that ran with it (profile(torch_profiler=True))
        self._costs: Optional[dict] = None
        self._spec: Optional[cost_model.CoreSpec] = None

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    def costs(self) -> dict[int, tuple[cost_model.OpCost, list[cost_model.OpCost]]]:
        """The modelled cost of each launch and of its ops, by launch id (``cost_model``; on the
        core ``cost_model.core()`` describes)."""
        spec = cost_model.core()
        if self._costs is None or self._spec is not spec:
            out = {}
            for l in self.launches:
                if l.kind in ("event", "wait"):
                    continue
                ops = [cost_model.cached_op_cost(o.name, o.overload, o.args, o.results, spec) for o in l.ops]
                out[l.id] = (cost_model.launch_cost(ops, spec), ops)
            self._costs, self._spec = out, spec
        return self._costs

    @property
    def core_name(self) -> str:
        """The core the modelled times are for."""
        return cost_model.core().name

    @property
    def modelled_device_s(self) -> float:
        """What the launches would take on the modelled core, one after the other (seconds)."""
        return sum(cost.modelled_ns for cost, _ in self.costs().values()) / 1e9

    def table(self, sort_by: str = "device_time", top: int = 20) -> ProfileTable:
        """Launches per graph / kernel and ops per name: count, host time, emulated device time,
        modelled NeuronCore time and utilisation, share of the device time. ``sort_by``:
        device_time, modelled_time, host_time, count or name; ``top``: rows per section (0: all)."""
        return ProfileTable(self.launches, sort_by=sort_by, top=top, collectives=self.collectives,
                            costs=self.costs(), core=self.core_name)

    def timeline(self):
        """The interactive timeline (zoom, pan, hover): lanes for the host, each stream of each
        core, collectives, the compiler and memory; ``.figure()`` is the static matplotlib one."""
        from neuron_lab.observability.interactive import Timeline

        return Timeline(self)

    def memory_timeline(self):
        """A matplotlib Figure: allocated and reserved bytes per core over time, peak marked."""
        from neuron_lab.observability import timeline

        return timeline.memory_figure(self)

    def export_chrome_trace(self, path: PathLike) -> Path:
        """Writes a Chrome trace (https://ui.perfetto.dev, chrome://tracing). A profile that ran
        with ``torch_profiler=True`` writes torch.profiler's trace: CPU ops, the device's lanes
        with flows to the ops that recorded them, memory; TensorBoard and Holistic Trace Analysis
        read it. Otherwise it writes the device's own lanes (launches, waits, compiles, collectives)."""
        if self.torch is None:
            return export.write_chrome_trace(self, path)
        path = Path(path)
        refuse_link(path, "Chrome trace")
        path.parent.mkdir(parents=True, exist_ok=True)
        folder = tempfile.mkdtemp(prefix="neuron_trace_")
        try:
            written = os.path.join(folder, "trace.json")
            self.torch.export_chrome_trace(written)
            with open(written, "rb") as source, replace_file(path, "Chrome trace", binary=True) as target:
                shutil.copyfileobj(source, target)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return path

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
        """Why the region took its time (see ``neuron_lab.explain_scope``), with the modelled
        NeuronCore time beside the emulated one."""
        self.explanation.modelled_device_s = self.modelled_device_s
        self.explanation.modelled_core = self.core_name
        return self.explanation

    def __repr__(self) -> str:
        return (f"<neuron_lab Profile: {len(self.launches)} launches, {len(self.events)} events, "
                f"{self.duration_s * 1e3:.1f} ms>")

    def __str__(self) -> str:
        return f"{self.explain().summary_line()}\n\n{self.table()}"

    def _repr_html_(self) -> str:
        return (f"<div><code>{self.explain().summary_line()}</code></div>" + self.table()._repr_html_())


class profile:
    """Profiles a region: ``with neuron_lab.profiler.profile() as prof:``; ``prof``
    is filled when the block ends (after the region's device work finished).
    Profilers nest; each sees the launches made while it ran."""

    def __init__(self, label: str = "profiled region", torch_profiler: bool = False,
                 profile_memory: bool = True, record_shapes: bool = True) -> None:
        self._label = label
        self._handle: Optional[int] = None
        self._scope: Optional[explain_scope] = None
        self._torch_profiler = torch_profiler
        self._torch_options = {"profile_memory": profile_memory, "record_shapes": record_shapes}
        self._torch: Any = None
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
        if self._torch_profiler:
            import torch

            if torch.autograd.profiler._is_profiler_enabled:
                raise RuntimeError("torch.profiler is already running, and it runs one trace at a time: profile with "
                                   "neuron_lab.profiler.profile() (torch_profiler=False) inside it, or stop it first")
            activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.PrivateUse1]
            self._torch = torch.profiler.profile(activities=activities, **self._torch_options)
        self._scope = explain_scope(label=self._label)
        self._scope.__enter__()
        if self._torch is not None:
            self._torch.__enter__()
        self._handle = trace.start_profile()

    def stop(self) -> Profile:
        if self._handle is None:
            raise RuntimeError("this profiler is not running; call start() first")
        error: Optional[BaseException] = None
        try:
            self._scope.__exit__(None, None, None)  # finishes the region's device work
        except Exception as e:
            error = e
        if self._torch is not None:
            with trace.profiler_waits():
                self._torch.__exit__(None, None, None)
        raw = trace.stop_profile(self._handle)
        self._handle = None
        launches = [Launch.from_native(d) for d in raw["launches"]]
        memory = [MemorySample(*s) for s in raw["memory"]]
        events = events_since(raw["start_ns"], raw["end_ns"])
        result = self.result if self.result is not None else Profile([], [], [], 0, 0, self._scope.explanation)
        result.launches, result.events, result.memory = launches, events, memory
        result.collectives = self._scope.explanation.collectives
        result.start_ns, result.end_ns = raw["start_ns"], raw["end_ns"]
        result.torch, self._torch = self._torch, None
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


def start(label: str = "profiled region", torch_profiler: bool = False) -> None:
    """Starts the session-wide profiler (``stop()`` returns its :class:`Profile`)."""
    global _current
    with _lock:
        if _current is not None:
            raise RuntimeError("neuron_lab.profiler.start() was already called; call neuron_lab.profiler.stop() "
                               "first, or use `with neuron_lab.profiler.profile() as prof:` for nested regions")
        p = profile(label, torch_profiler=torch_profiler)
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


def from_torch_profiler(torch_profile: Any = None) -> Profile:
    """The device's side of torch.profiler's latest trace with ``ProfilerActivity.PrivateUse1``,
    as a :class:`Profile` (tables, the interactive timeline, Parquet): the very records its
    device lanes were made of. ``torch_profile`` (optional) is kept as ``Profile.torch``."""
    raw = trace.last_torch_profile()
    if not raw["end_ns"]:
        raise RuntimeError("torch.profiler has not traced the device yet: trace with "
                           "activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]")
    explanation = Explanation(label="torch.profiler trace")
    explanation.wall_s = (raw["end_ns"] - raw["start_ns"]) / 1e9
    result = Profile([Launch.from_native(d) for d in raw["launches"]], events_since(raw["start_ns"], raw["end_ns"]),
                     [MemorySample(*m) for m in raw["memory"]], raw["start_ns"], raw["end_ns"], explanation)
    result.torch = torch_profile
    return result
