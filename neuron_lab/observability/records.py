"""The runtime's raw observations as Python objects: launches, ops, events, memory samples.

Times are nanoseconds on the runtime's clock (``time.monotonic_ns()``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from neuron_lab.device import trace as _trace
from neuron_lab.device.late_errors import cell_name
from neuron_lab.device.trace import Reason

__all__ = ["SourceLine", "OpCall", "Launch", "Event", "MemorySample", "now_ns", "format_source", "cell_name"]


def now_ns() -> int:
    """The runtime's clock (the same as ``time.monotonic_ns()``)."""
    return _trace.now_ns()


@dataclass(frozen=True)
class SourceLine:
    """The user's line that issued an op, a launch, a sync."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        cell = cell_name(self.file)
        if cell is not None:  # as IPython's tracebacks name it
            where = f"{cell}, line {self.line}"
            return where if self.function == "<module>" else f"{where} in {self.function}"
        return f"{self.file}:{self.line} in {self.function}"

    @property
    def short(self) -> str:
        """``file.py:12`` (the file's last path component), or ``In[3], line 12`` for a cell."""
        cell = cell_name(self.file)
        if cell is not None:
            return f"{cell.removeprefix('Cell ')}, line {self.line}"
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line}"


def _source(value) -> Optional[SourceLine]:
    return None if value is None else SourceLine(*value)


def format_source(source: Optional[SourceLine], short: bool = False) -> str:
    """A source line as text; ``-`` when unknown (e.g. ops from autograd's backward pass)."""
    if source is None:
        return "-"
    return source.short if short else str(source)


@dataclass(frozen=True)
class OpCall:
    """One recorded op inside a launch.

    ``args`` and ``results`` are what a cost model reads: a tensor is ``("tensor", dtype,
    shape)``, a list of tensors ``("tensors", count)``; numbers, lists of ints and None are
    themselves."""

    name: str
    inputs: str
    source: Optional[SourceLine]
    host_ns: int  # time spent recording it on the host
    device_ns: int  # its execution time when replayed op by op; -1 when unknown (compiled)
    overload: str = ""
    args: tuple = ()
    results: tuple = ()
    record_start_ns: int = 0  # when the host began recording it
    correlation: int = 0  # the torch.profiler CPU op that recorded it (0: none)

    @property
    def qualified_name(self) -> str:
        """``aten::add.Tensor``: the name and overload torch's op registry uses."""
        return f"{self.name}.{self.overload}" if self.overload else self.name


@dataclass(frozen=True)
class Launch:
    """One unit of device work: a fused graph, a single op (eager mode), an inline
    kernel run on the caller's thread, an event marker or a cross-stream wait."""

    id: int
    kind: str  # graph, op, inline, event, wait
    name: str
    device: int
    stream: int
    enqueue_ns: int
    start_ns: int
    end_ns: int
    n_ops: int
    graph_id: int
    tier: str  # replay, compiled or "" (not a graph)
    status: str  # done, failed, skipped, queued
    bytes_allocated: int
    source: Optional[SourceLine]
    ops: tuple[OpCall, ...] = field(default_factory=tuple)
    correlation: int = 0  # the torch.profiler CPU op running when it was enqueued (0: none)

    @property
    def device_ns(self) -> int:
        """Execution time on the device (0 if it never ran)."""
        return max(0, self.end_ns - self.start_ns) if self.start_ns else 0

    @property
    def queued_ns(self) -> int:
        """Time between the host's enqueue and the start on the device."""
        return max(0, self.start_ns - self.enqueue_ns) if self.start_ns else 0

    @property
    def host_ns(self) -> int:
        """Host time spent recording its ops."""
        return sum(op.host_ns for op in self.ops)

    @property
    def label(self) -> str:
        """A readable name: ``graph 3 (12 ops: aten::mm, aten::add, ...)`` or the op."""
        if self.kind != "graph":
            return self.name
        names = []
        for op in self.ops:
            short = op.name.removeprefix("aten::")
            if short not in names:
                names.append(short)
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        return f"{self.name} ({self.n_ops} op{'' if self.n_ops == 1 else 's'}: {shown})"

    @classmethod
    def from_native(cls, d: dict) -> "Launch":
        ops = tuple(
            OpCall(o["name"], o["inputs"], _source(o["source"]), o["host_ns"], o["device_ns"], o["overload"],
                   tuple(o["args"]), tuple(o["results"]), o["record_start_ns"], o["correlation"])
            for o in d["ops"]
        )
        return cls(
            id=d["id"], kind=d["kind"], name=d["name"], device=d["device"], stream=d["stream"],
            enqueue_ns=d["enqueue_ns"], start_ns=d["start_ns"], end_ns=d["end_ns"], n_ops=d["n_ops"],
            graph_id=d["graph_id"], tier=d["tier"], status=d["status"], bytes_allocated=d["bytes_allocated"],
            source=_source(d["source"]), ops=ops, correlation=d["correlation"],
        )


@dataclass(frozen=True)
class Event:
    """Something the runtime decided or waited for, from its always-on event log.

    kind: ``sync`` (the host waited; ``what`` is the trigger), ``new_graph`` and
    ``recompile`` (``detail`` is the cause), ``inline_op`` (an op ran on the
    calling thread; ``detail`` says why), ``compile`` / ``compile_failed``,
    ``compiled_fallback``.
    """

    time_ns: int
    duration_ns: int
    kind: str
    what: str
    detail: str
    source: Optional[SourceLine]
    device: int
    graph_id: int
    reason: Reason = Reason.NONE  # sync and inline_op: why the host waited
    by_profiler: bool = False  # a wait a profiler or explain scope made itself, not the user's code

    @classmethod
    def from_native(cls, d: dict) -> "Event":
        return cls(d["time_ns"], d["duration_ns"], d["kind"], d["what"], d["detail"], _source(d["source"]),
                   d["device"], d["graph_id"], d["reason"], d["by_profiler"])


@dataclass(frozen=True)
class MemorySample:
    """Allocated and reserved bytes of one core after an allocator change."""

    time_ns: int
    device: int
    allocated: int
    reserved: int


def events_since(since_ns: int, until_ns: Optional[int] = None) -> list[Event]:
    """Logged events in ``[since_ns, until_ns]``, oldest first."""
    events = [Event.from_native(e) for e in _trace.events_since(since_ns)]
    if until_ns is not None:
        events = [e for e in events if e.time_ns <= until_ns]
    return sorted(events, key=lambda e: e.time_ns)


def totals() -> dict:
    """Running totals: device busy time per core, host recording time, host wait time (ns)."""
    return _trace.totals()
