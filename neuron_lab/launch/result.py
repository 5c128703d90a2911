"""What a cell run on N ranks gave (``RanksResult``), and how it failed (``RankError``,
``RankTimeoutError``): plain objects with an HTML form for notebooks and a text form for
terminals, logs and nbval.
"""

from __future__ import annotations

import html
import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from neuron_lab.device.units import format_bytes
from neuron_lab.launch.job import CellError, Outcome
from neuron_lab.observability.explain import format_seconds

__all__ = ["RankReport", "RanksResult", "RankError", "RankTimeoutError", "compare_timelines", "failure_message"]

_TABLE = 'style="border-collapse:collapse;font-family:monospace;font-size:12px"'
_CELL = 'style="padding:2px 8px;text-align:right"'
_HEAD = 'style="padding:2px 8px;text-align:right;border-bottom:1px solid #888"'
_LEFT = 'style="padding:2px 8px;text-align:left"'


@dataclass
class RankReport:
    """One rank's run of the cell: its device, host wall time, device busy time, time inside
    collectives (waiting for peers included), the collectives with the bytes this rank moved,
    its output lines, and its ``Profile`` when the run was profiled."""

    rank: int
    device: str
    wall_s: float
    device_s: float
    collective_s: float
    collectives: dict[str, dict[str, int]]   # name -> {"count", "bytes_moved"}
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    profile: Any = None                      # neuron_lab.profiler.Profile, with profile=True

    @property
    def bytes_moved(self) -> int:
        """Bytes this rank's collectives put on the wire and took off it (``CollectiveRecord``)."""
        return sum(c["bytes_moved"] for c in self.collectives.values())

    @property
    def compute_s(self) -> float:
        """Wall time outside collectives: the rank's own work, what its peers wait for."""
        return max(self.wall_s - self.collective_s, 0.0)

    def row(self) -> list[str]:
        count = sum(c["count"] for c in self.collectives.values())
        return [f"rank {self.rank}", self.device, format_seconds(self.wall_s), format_seconds(self.device_s),
                format_seconds(self.collective_s), str(count), format_bytes(self.bytes_moved)]


_HEADER = ["rank", "device", "wall", "device busy", "in collectives", "collectives", "bytes moved"]


class RanksResult:
    """A cell's run on N ranks (the twin of ``%%neuron_distributed``'s output).

    ``value``: rank 0's last expression, as a notebook cell's value (None when the cell ends
    in a statement); ``ranks``: a ``RankReport`` per rank; ``slowest_rank``: the rank with the
    most wall time outside collectives (the one the others waited for); ``elapsed_s``: the
    whole run, process start included; ``timeline()`` with ``profile=True``.
    """

    def __init__(self, outcomes: Sequence[Outcome], outputs: Sequence[tuple[list[str], list[str]]],
                 elapsed_s: float) -> None:
        self.ranks = [RankReport(o.rank, o.device, o.wall_s, o.device_s, o.collective_s, dict(o.collectives),
                                 list(out), list(err), o.profile) for o, (out, err) in zip(outcomes, outputs)]
        self.elapsed_s = elapsed_s
        first = outcomes[0]
        self.has_value = first.has_value
        self.value_repr = first.value_repr
        self._value: Any = None
        self._value_error = first.value_error
        if first.value is not None:
            try:
                self._value = pickle.loads(first.value)
            except Exception as e:  # noqa: BLE001 - e.g. a class defined in the cell, unknown here
                self._value_error = (f"{type(e).__name__}: {e} (a class or function defined in the cell exists "
                                     f"only in the ranks)")

    @property
    def nproc(self) -> int:
        return len(self.ranks)

    @property
    def value(self) -> Any:
        """Rank 0's value of the cell's last expression, unpickled here."""
        if self._value_error:
            raise ValueError(
                f"rank 0's value ({self.value_repr[:200]}) could not come back to the caller: {self._value_error}. "
                f"End the cell with picklable data made of torch, numpy and builtin types (a state_dict, a tensor, "
                f"`.tolist()`), not objects of classes defined in the cell; its repr is in .value_repr")
        return self._value

    @property
    def slowest_rank(self) -> int:
        """The rank with the most wall time outside collectives (ties: the lowest rank)."""
        return max(self.ranks, key=lambda r: (r.compute_s, -r.rank)).rank

    @property
    def bytes_moved(self) -> list[int]:
        """Bytes moved by collectives, per rank."""
        return [r.bytes_moved for r in self.ranks]

    @property
    def profiles(self) -> list[Any]:
        """Each rank's ``Profile`` (with ``profile=True``)."""
        missing = [r.rank for r in self.ranks if r.profile is None]
        if missing:
            raise ValueError("this run was not profiled: pass profile=True to run_on_ranks "
                             "(%%neuron_distributed --profile) to keep each rank's launches")
        return [r.profile for r in self.ranks]

    def timeline(self, width: float = 11.0) -> Any:
        """A matplotlib Figure: each rank's launch timeline, one above the other, on one time axis."""
        return compare_timelines({"": self}, width=width)

    # ---- display ------------------------------------------------------------------------

    def headline(self) -> str:
        slowest = self.ranks[self.slowest_rank]
        return (f"{self.nproc} rank{'s' if self.nproc != 1 else ''}: slowest rank {slowest.rank} "
                f"({format_seconds(slowest.compute_s)} outside collectives of {format_seconds(slowest.wall_s)}); "
                f"elapsed {format_seconds(self.elapsed_s)} with process start")

    def _value_line(self) -> str:
        if not self.has_value:
            return "rank 0's value: none (the cell ends in a statement)"
        if self._value_error:
            return f"rank 0's value: {self.value_repr} (stays in the ranks: {self._value_error})"
        return f"rank 0's value: {self.value_repr}"

    def _collective_rows(self) -> list[list[str]]:
        names = sorted({name for r in self.ranks for name in r.collectives})
        rows = []
        for name in names:
            cells = []
            for r in self.ranks:
                c = r.collectives.get(name)
                cells.append(f"{c['count']} x, {format_bytes(c['bytes_moved'])}" if c else "-")
            rows.append([name] + cells)
        return rows

    def __repr__(self) -> str:
        parts = [self.headline(), self._value_line(), _text_table(_HEADER, [r.row() for r in self.ranks], 2)]
        rows = self._collective_rows()
        if rows:
            parts.append(_text_table(["collective"] + [f"rank {r.rank}" for r in self.ranks], rows))
        return "\n".join(parts)

    def _repr_html_(self) -> str:
        rows = self._collective_rows()
        collectives = (_html_table(["collective"] + [f"rank {r.rank}" for r in self.ranks], rows) if rows
                       else "<div>no collectives</div>")
        return (f"<div><div><b>neuron_distributed</b>: {html.escape(self.headline())}</div>"
                f"<pre style='font-size:12px;margin:4px 0'>{html.escape(self._value_line())}</pre>"
                + _html_table(_HEADER, [r.row() for r in self.ranks], 2) + collectives + "</div>")


def compare_timelines(runs: Mapping[str, RanksResult], width: float = 11.0) -> Any:
    """The ranks' timelines of several profiled runs side by side (a column per run, titled
    with its key, a row per rank), drawn by ``neuron_lab.observability.timeline``."""
    from neuron_lab.observability import timeline

    if not runs:
        raise ValueError("compare_timelines needs at least one run: compare_timelines({'DDP': ddp, 'FSDP2': fsdp})")
    columns = {title: [(f"rank {r.rank} ({r.device})", p) for r, p in zip(run.ranks, run.profiles)]
               for title, run in runs.items()}
    return timeline.timeline_grid(columns, width=width)


# ---- errors -------------------------------------------------------------------------------


class RankError(RuntimeError):
    """The cell failed on one or more ranks. ``failures``: rank -> ``CellError`` (type, message,
    the cell's line, traceback); ``stopped``: ranks that were stopped or died without an error
    of their own; ``outputs``: each rank's (stdout, stderr) lines."""

    def __init__(self, message: str, failures: Mapping[int, CellError], stopped: Sequence[int],
                 outputs: Sequence[tuple[list[str], list[str]]]) -> None:
        super().__init__(message)
        self.failures = dict(failures)
        self.stopped = list(stopped)
        self.outputs = list(outputs)


class RankTimeoutError(TimeoutError):
    """The cell did not finish in time; its rank processes were killed (``killed``: their ids)."""

    def __init__(self, message: str, killed: Sequence[int], outputs: Sequence[tuple[list[str], list[str]]]) -> None:
        super().__init__(message)
        self.killed = list(killed)
        self.outputs = list(outputs)


def failure_message(nproc: int, failures: Mapping[int, CellError], stopped: Sequence[int],
                    launcher_tail: str = "") -> str:
    """The text of a ``RankError``: the ranks that caused the failure first (their error with
    the cell's line and traceback, or that their process died), then the ranks that failed
    or were stopped because of them (a collective whose peer went away)."""
    own = {r: e for r, e in failures.items() if not e.transport}
    if not own and not stopped:
        own = dict(failures)  # only transport errors and nobody else to blame: show them in full
    follow = {r: e for r, e in failures.items() if r not in own}
    died = [] if own else list(stopped)  # no rank raised: the ranks that vanished are the cause
    culprits = sorted(own) or died
    ranks = ", ".join(map(str, culprits))
    plural = "s" if len(culprits) > 1 else ""
    if own:
        parts = [f"the cell failed on rank{plural} {ranks} (of {nproc} ranks)"]
        parts += [_describe_failure(rank, own[rank]) for rank in sorted(own)]
    else:
        parts = [f"rank{plural} {ranks} (of {nproc} ranks) exited without a report: the process died (a crash, "
                 f"os._exit, a signal or the memory limit); its last output is above"]
    cause = ", ".join(f"rank {r}" for r in culprits)
    for rank in sorted(follow):
        e = follow[rank]
        where = f" at line {e.line}" if e.line is not None else ""
        parts.append(f"rank {rank}: its collective{where} failed when {cause} failed ({e.type_name})")
    parts += [f"rank {rank}: stopped when {cause} failed" for rank in sorted(stopped) if rank not in died]
    if launcher_tail and not own:
        parts.append("torchrun said:\n" + _indent(launcher_tail))
    return "\n".join(parts)


def _describe_failure(rank: int, e: CellError) -> str:
    if e.during == "setup":
        where = "while setting up the rank (before the cell ran)"
    elif e.line is not None:
        where = f"at line {e.line} of the cell: {e.code}" if e.code else f"at line {e.line} of the cell"
    else:
        where = "outside the cell's code"
    text = f"rank {rank} {where}\n{e.type_name}: {e.message}"
    if e.type_name == "NameError":
        name = e.name or "the name"
        text += (f"\n  The ranks are fresh processes: the notebook's variables are not defined in them. If {name} "
                 f"is a notebook variable, pass it in with push={{'{name}': {name}}} (%%neuron_distributed --push "
                 f"{name}), or define it in the cell.")
    if e.traceback:
        text += f"\n  traceback on rank {rank}:\n" + _indent(e.traceback, "    ")
    return text


def _indent(text: str, prefix: str = "  ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


# ---- tables -------------------------------------------------------------------------------


def _text_table(header: Sequence[str], rows: Sequence[Sequence[str]], left_columns: int = 1) -> str:
    columns = list(zip(*([list(header)] + [list(r) for r in rows])))
    widths = [max(len(c) for c in col) for col in columns]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i < left_columns else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(header)] + [line(r) for r in rows])


def _html_table(header: Sequence[str], rows: Sequence[Sequence[str]], left_columns: int = 1) -> str:
    head = "".join(f"<th {_LEFT if i < left_columns else _HEAD}>{html.escape(h)}</th>" for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(f"<td {_LEFT if i < left_columns else _CELL}>{html.escape(c)}</td>"
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table {_TABLE}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
