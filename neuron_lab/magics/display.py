"""Rich, frontend-neutral reports of the device state: memory, status, figures.

Every report here is a plain object with ``_repr_html_`` (JupyterLab, the classic
notebook, VS Code) and a readable ``__str__``/``__repr__`` (terminals, nbval, logs).
Nothing in this module imports IPython: these objects are the plain-Python twins of
``%neuron_memory`` and ``%neuron_status``.
"""

from __future__ import annotations

import html
import io
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

# The units of the per-cell line and of every neuron_lab report.
from neuron_lab.device.units import format_bytes

__all__ = [
    "format_bytes",
    "parse_device",
    "DeviceMemory",
    "MemoryReport",
    "StreamState",
    "read_streams",
    "StatusReport",
    "FigureDisplay",
    "CellExplanation",
    "memory_report",
    "status",
    "banner",
]

# Inline styles only: notebooks strip <style> blocks and external CSS in some frontends.
_TABLE = 'style="border-collapse:collapse;font-family:monospace;font-size:12px"'
_CELL = 'style="padding:2px 8px;text-align:right"'
_HEAD = 'style="padding:2px 8px;text-align:right;border-bottom:1px solid #888"'
_LEFT = 'style="padding:2px 8px;text-align:left"'


def parse_device(text: Optional[str]) -> Optional[int]:
    """``None``/``''`` -> ``None`` (all devices); ``'1'``, ``'neuron:1'``, ``'neuron'`` -> a core index.

    Raises ``ValueError`` naming the valid range for anything else.
    """
    from neuron_lab.device.core import device_index

    if text is None or not str(text).strip():
        return None
    text = str(text).strip()
    try:
        return device_index(int(text) if text.lstrip("-").isdigit() else text)
    except (ValueError, TypeError, RuntimeError) as e:
        count = torch.neuron.device_count()
        raise ValueError(
            f"not a neuron device: {text!r} ({e}); use an index 0..{count - 1}, 'neuron' or 'neuron:<index>'"
        ) from None


def _html_table(header: Sequence[str], rows: Sequence[Sequence[str]], left_columns: int = 1) -> str:
    """An HTML table; the first ``left_columns`` columns are left-aligned. Cells are escaped."""
    head = "".join(f"<th {_LEFT if i < left_columns else _HEAD}>{html.escape(h)}</th>" for i, h in enumerate(header))
    body = "".join(
        "<tr>" + "".join(f"<td {_LEFT if i < left_columns else _CELL}>{html.escape(str(c))}</td>"
                         for i, c in enumerate(row)) + "</tr>"
        for row in rows
    )
    return f"<table {_TABLE}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _text_table(header: Sequence[str], rows: Sequence[Sequence[str]], left_columns: int = 1) -> str:
    """A fixed-width text table (right-aligned numbers, left-aligned labels)."""
    columns = list(zip(*([list(header)] + [list(map(str, r)) for r in rows])))
    widths = [max(len(c) for c in col) for col in columns]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            (c.ljust(w) if i < left_columns else c.rjust(w)) for i, (c, w) in enumerate(zip(cells, widths))
        ).rstrip()

    return "\n".join([line(header)] + [line(list(map(str, r))) for r in rows])


def _bar(fraction: float, colour: str = "#4c8bf5", width_px: int = 120) -> str:
    """A small inline HTML bar for a fraction in [0, 1]."""
    fraction = min(max(fraction, 0.0), 1.0)
    return (
        f'<div style="display:inline-block;width:{width_px}px;height:8px;background:#ddd;vertical-align:middle">'
        f'<div style="width:{fraction * 100:.1f}%;height:8px;background:{colour}"></div></div>'
    )


# ---- memory ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceMemory:
    """Allocator state of one core, in bytes."""

    index: int
    allocated: int
    reserved: int
    peak: int
    capacity: int

    @classmethod
    def read(cls, index: int) -> "DeviceMemory":
        """Reads the current statistics of ``neuron:<index>``."""
        _, total = torch.neuron.mem_get_info(index)
        return cls(
            index=index,
            allocated=int(torch.neuron.memory_allocated(index)),
            reserved=int(torch.neuron.memory_reserved(index)),
            peak=int(torch.neuron.max_memory_allocated(index)),
            capacity=int(total),
        )

    @property
    def used_fraction(self) -> float:
        """Reserved bytes over capacity (what the core can no longer hand out)."""
        return self.reserved / self.capacity if self.capacity else 0.0

    def row(self) -> list[str]:
        return [
            f"neuron:{self.index}",
            format_bytes(self.allocated),
            format_bytes(self.reserved),
            format_bytes(self.peak),
            format_bytes(self.capacity),
            f"{self.used_fraction * 100:.1f}%",
        ]


_MEMORY_HEADER = ["device", "allocated", "reserved", "peak allocated", "capacity", "reserved/capacity"]


class MemoryReport:
    """Memory of every core (or of one, with its full allocator summary).

    The plain-Python twin of ``%neuron_memory [DEVICE]``: ``neuron_lab.magics.memory_report(device)``.
    Shows as an HTML table in notebooks and as text elsewhere; ``devices`` holds the numbers.
    """

    def __init__(self, device: Optional[int] = None) -> None:
        self.device = device
        indices = range(torch.neuron.device_count()) if device is None else [device]
        self.devices: list[DeviceMemory] = [DeviceMemory.read(i) for i in indices]
        self.summary: Optional[str] = None if device is None else torch.neuron.memory_summary(device)

    def __str__(self) -> str:
        text = _text_table(_MEMORY_HEADER, [d.row() for d in self.devices])
        return text if self.summary is None else f"{text}\n\n{self.summary}"

    __repr__ = __str__

    def _repr_html_(self) -> str:
        rows = []
        for d in self.devices:
            cells = d.row()
            rows.append(
                "<tr>" + f"<td {_LEFT}>{html.escape(cells[0])}</td>"
                + "".join(f"<td {_CELL}>{html.escape(c)}</td>" for c in cells[1:])
                + f"<td {_LEFT}>{_bar(d.used_fraction)}</td></tr>"
            )
        head = "".join(f"<th {_LEFT if i == 0 else _HEAD}>{html.escape(h)}</th>" for i, h in enumerate(_MEMORY_HEADER))
        out = (f"<table {_TABLE}><thead><tr>{head}<th></th></tr></thead>"
               f"<tbody>{''.join(rows)}</tbody></table>")
        if self.summary is not None:
            out += f"<pre style='font-size:12px'>{html.escape(self.summary)}</pre>"
        return out


def memory_report(device: Any = None) -> MemoryReport:
    """Memory of every neuron core, or of ``device`` (index, ``'neuron:1'``) with its allocator
    summary. The plain-Python twin of ``%neuron_memory``."""
    return MemoryReport(None if device is None else parse_device(str(device)))


# ---- status ------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamState:
    """One stream of one core: launches enqueued, completed, and still queued."""

    device: int
    stream_id: int
    enqueued: int
    completed: int
    queue_depth: int


def read_streams() -> list[StreamState]:
    """Every stream of every core, with its queue depth."""
    from neuron_lab.adaptive_eager import queue_depth
    from neuron_lab.device.streams import num_streams, stream_launches

    states = []
    for device in range(torch.neuron.device_count()):
        for stream_id in range(num_streams(device)):
            enqueued, completed = stream_launches(device, stream_id)
            states.append(StreamState(device, stream_id, enqueued, completed, queue_depth(device, stream_id)))
    return states


# counters() keys shown by %neuron_status, in order, with their labels
_COUNTER_LABELS = [
    ("ops_recorded", "ops recorded"),
    ("launches", "launches"),
    ("graph_launches", "graph launches"),
    ("graphs_built", "graphs built (cache misses)"),
    ("cache_hits", "graph cache hits"),
    ("compiles_requested", "compiles requested"),
    ("compiles_succeeded", "compiles succeeded"),
    ("compiles_failed", "compiles failed"),
    ("compile_seconds", "compile seconds (background)"),
    ("compiled_launches", "compiled launches"),
    ("inline_ops", "inline ops"),
]


class StatusReport:
    """Devices, execution mode, streams with their queue depths, graph cache and counters.

    The plain-Python twin of ``%neuron_status``: ``neuron_lab.magics.status()``.
    Fields: ``mode``, ``memory`` (list of ``DeviceMemory``), ``streams`` (list of
    ``StreamState``), ``counters`` (``neuron_lab.adaptive_eager.counters()``),
    ``cached_graphs``, ``pending_compiles``.
    """

    def __init__(self) -> None:
        import neuron_lab.adaptive_eager as ae

        self.mode: str = ae.get_mode()
        self.memory: list[DeviceMemory] = [DeviceMemory.read(i) for i in range(torch.neuron.device_count())]
        self.streams: list[StreamState] = read_streams()
        self.counters: dict = ae.counters()
        self.cached_graphs: int = len(ae.graphs())
        self.pending_compiles: int = int(ae.pending_compiles())

    def _counter_rows(self) -> list[list[str]]:
        rows = [["cached graphs", str(self.cached_graphs)], ["compiles pending", str(self.pending_compiles)]]
        for key, label in _COUNTER_LABELS:
            if key in self.counters:
                value = self.counters[key]
                rows.append([label, f"{value:.3f}" if isinstance(value, float) else str(value)])
        for group in ("syncs", "flushes"):
            reasons = self.counters.get(group) or {}
            if reasons:
                detail = ", ".join(f"{k}: {v}" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1]))
                rows.append([group, detail])
        return rows

    def _stream_rows(self) -> list[list[str]]:
        return [[f"neuron:{s.device}", str(s.stream_id), str(s.enqueued), str(s.completed), str(s.queue_depth)]
                for s in self.streams]

    def headline(self) -> str:
        count = len(self.memory)
        return f"{count} NeuronCore{'s' if count != 1 else ''}, mode {self.mode}"

    def __str__(self) -> str:
        return "\n\n".join([
            "neuron status: " + self.headline(),
            _text_table(_MEMORY_HEADER, [d.row() for d in self.memory]),
            _text_table(["device", "stream", "enqueued", "completed", "queued"], self._stream_rows()),
            _text_table(["graph cache and counters", "value"], self._counter_rows(), left_columns=2),
            _PER_CELL_TITLE + "\n" + "\n".join(f"  {name}: {meaning}" for name, meaning in _time_parts().items()),
        ])

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return (
            f"<div><b>neuron status</b>: {html.escape(self.headline())}"
            + _html_table(_MEMORY_HEADER, [d.row() for d in self.memory])
            + _html_table(["device", "stream", "enqueued", "completed", "queued"], self._stream_rows())
            + _html_table(["graph cache and counters", "value"], self._counter_rows())
            + f"<div style='margin-top:6px'>{html.escape(_PER_CELL_TITLE)}</div>"
            + _html_table(["part", "what it is"], [[k, v] for k, v in _time_parts().items()], left_columns=2)
            + "</div>"
        )


_PER_CELL_TITLE = ("The per-cell line ('neuron: ' then wall W = recording + waiting [+ running ops] + other | "
                   "device busy | compile | launches | syncs | peak memory):")


def _time_parts() -> dict[str, str]:
    from neuron_lab.observability.explain import TIME_PARTS

    return TIME_PARTS


def status() -> StatusReport:
    """The device's state now: the plain-Python twin of ``%neuron_status``."""
    return StatusReport()


def banner(autotime: bool = True) -> str:
    """The one line ``%load_ext neuron_lab`` prints: devices, mode, memory per core."""
    import neuron_lab
    import neuron_lab.adaptive_eager as ae

    count = torch.neuron.device_count()
    _, capacity = torch.neuron.mem_get_info(0)
    devices = "neuron:0" if count == 1 else f"neuron:0..{count - 1}"
    timing = "per-cell timing on (%neuron_autotime off)" if autotime else "per-cell timing off"
    return (f"neuron_lab {neuron_lab.__version__}: {count} NeuronCore{'s' if count != 1 else ''} "
            f"({devices}), {format_bytes(capacity)} per core, mode {ae.get_mode()}; {timing}")


# ---- explanations -------------------------------------------------------------------------


class CellExplanation:
    """The explanation of one notebook cell, headed by its ``In [n]`` label (``%neuron_explain``).

    ``record`` is a ``neuron_lab.magics.autotime.CellRecord``; ``explanation`` its Explanation.
    """

    def __init__(self, record: Any) -> None:
        self.record = record
        self.explanation = record.explanation

    def header(self) -> str:
        status = "" if self.record.succeeded else f" (failed: {self.record.error})"
        return f"{self.record.label}{status}"

    def __str__(self) -> str:
        return f"{self.header()}\n{self.explanation}"

    __repr__ = __str__

    def _repr_html_(self) -> str:
        body = getattr(self.explanation, "_repr_html_", None)
        detail = body() if body is not None else f"<pre>{html.escape(str(self.explanation))}</pre>"
        return f"<div><div><b>{html.escape(self.header())}</b></div>{detail}</div>"


# ---- figures ------------------------------------------------------------------------------


@dataclass
class FigureDisplay:
    """A matplotlib figure shown as PNG where the frontend can, and as one line of text elsewhere.

    Rendering it ourselves keeps the output the same whatever matplotlib backend is active,
    and figures built without pyplot never show twice.
    """

    figure: Any
    description: str = "figure"
    _png: Optional[bytes] = field(default=None, repr=False)

    def _repr_png_(self) -> bytes:
        if self._png is None:
            buffer = io.BytesIO()
            self.figure.savefig(buffer, format="png", bbox_inches="tight")
            self._png = buffer.getvalue()
        return self._png

    def __repr__(self) -> str:
        return f"<{self.description}: open in a notebook to see it, or save it with .figure.savefig(path)>"
