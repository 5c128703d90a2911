"""Profile exports: the device's own Chrome trace (Perfetto, chrome://tracing) of a profile
that ran without torch.profiler, and tidy tables (CSV, Parquet) of launches and ops for pandas
or automated analysis, with the emulated and the modelled time side by side. (A profile with
``torch_profiler=True`` exports torch.profiler's trace instead: ``Profile.export_chrome_trace``.)

Every file is written through ``neuron_lab.files.replace_file``: beside the target, then
renamed over it, so a symbolic link planted at the path is refused, never written through."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Union

from neuron_lab.files import refuse_link, replace_file
from neuron_lab.observability.records import format_source

if TYPE_CHECKING:
    from neuron_lab.observability.profiler import Profile
    from neuron_lab.observability.records import Launch

__all__ = ["chrome_trace", "write_chrome_trace", "launch_table", "op_table", "write_csv", "write_parquet",
           "LAUNCH_COLUMNS", "OP_COLUMNS"]

PathLike = Union[str, "os.PathLike[str]"]

HOST_PID = 0
HOST_TID, COMPILER_TID, COLLECTIVES_TID = 0, 1, 2


def _device_pid(device: int) -> int:
    return 1 + device


# An inline kernel runs on the host thread that asked for it, beside what its stream still runs
# (a finished value read while a later graph runs): a lane of its own per stream, so that a
# stream's lane holds only launches that ran one after another (as torch.profiler's trace does).
_INLINE_LANE_BASE = 1 << 30


def _lane(launch: "Launch") -> int:
    return _INLINE_LANE_BASE + launch.stream if launch.kind == "inline" else launch.stream


def _lane_name(lane: int) -> str:
    if lane >= _INLINE_LANE_BASE:
        return f"stream {lane - _INLINE_LANE_BASE} inline (host thread)"
    return f"stream {lane}"


def chrome_trace(profile: "Profile") -> dict:
    """The profile in Chrome's trace event format: a process per core with a track
    per stream, the host with its waits and enqueues, the background compiler,
    flow arrows from each enqueue to its execution, and counter tracks."""
    t0 = profile.start_ns
    us = lambda ns: (ns - t0) / 1000.0
    events: list[dict] = []
    meta = lambda pid, tid, kind, name: events.append(
        {"ph": "M", "pid": pid, "tid": tid, "name": kind, "args": {"name": name}})
    meta(HOST_PID, HOST_TID, "process_name", "host")
    meta(HOST_PID, HOST_TID, "thread_name", "host (user's thread)")
    meta(HOST_PID, COMPILER_TID, "thread_name", "background compiler")
    if profile.collectives:
        meta(HOST_PID, COLLECTIVES_TID, "thread_name", "collectives (torch.distributed)")
    for c in profile.collectives:
        events.append({"ph": "X", "pid": HOST_PID, "tid": COLLECTIVES_TID, "name": c.name, "cat": "collective",
                       "ts": us(c.start_ns), "dur": max(c.duration_ns / 1000.0, 0.001),
                       "args": {"bytes_moved": c.bytes_moved, "bus_bytes": c.bus_bytes, "group": c.group,
                                "group_size": c.group_size, "rank": c.rank, "device": c.device,
                                "waiting_for_device_us": c.wait_ns / 1000.0}})
    devices = sorted({l.device for l in profile.launches} | {s.device for s in profile.memory})
    lanes = sorted({(l.device, _lane(l)) for l in profile.launches})
    for d in devices:
        meta(_device_pid(d), 0, "process_name", f"neuron:{d}")
    for d, lane in lanes:
        meta(_device_pid(d), lane, "thread_name", _lane_name(lane))

    for l in profile.launches:
        args = {"kind": l.kind, "ops": l.n_ops, "graph_id": l.graph_id, "tier": l.tier, "status": l.status,
                "bytes_allocated": l.bytes_allocated, "source": format_source(l.source),
                "queued_us": l.queued_ns / 1000.0}
        if l.ops:
            args["op_names"] = [o.name for o in l.ops[:64]]
        if l.start_ns:
            events.append({"ph": "X", "pid": _device_pid(l.device), "tid": _lane(l), "name": l.label,
                           "cat": l.kind, "ts": us(l.start_ns), "dur": max(l.device_ns / 1000.0, 0.001),
                           "args": args})
        if l.kind == "inline":
            continue  # ran on the host's own thread: no flow to draw
        # The enqueue on the host, and an arrow to where the device ran it.
        events.append({"ph": "X", "pid": HOST_PID, "tid": HOST_TID, "name": f"enqueue {l.name}", "cat": "enqueue",
                       "ts": us(l.enqueue_ns), "dur": 1.0, "args": {"launch": l.id}})
        if l.start_ns:
            events.append({"ph": "s", "id": l.id, "pid": HOST_PID, "tid": HOST_TID, "name": "launch",
                           "cat": "launch", "ts": us(l.enqueue_ns) + 0.5})
            events.append({"ph": "f", "bp": "e", "id": l.id, "pid": _device_pid(l.device), "tid": l.stream,
                           "name": "launch", "cat": "launch", "ts": us(l.start_ns)})

    for e in profile.events:
        if e.kind == "sync":
            events.append({"ph": "X", "pid": HOST_PID, "tid": HOST_TID, "name": f"wait: {e.what}", "cat": "sync",
                           "ts": us(e.time_ns), "dur": max(e.duration_ns / 1000.0, 0.001),
                           "args": {"source": format_source(e.source)}})
        elif e.kind in ("compile", "compile_failed"):
            events.append({"ph": "X", "pid": HOST_PID, "tid": COMPILER_TID, "name": f"{e.kind} {e.what}",
                           "cat": "compile", "ts": us(e.time_ns), "dur": max(e.duration_ns / 1000.0, 0.001),
                           "args": {"detail": e.detail}})
        else:
            events.append({"ph": "i", "s": "t", "pid": HOST_PID, "tid": HOST_TID, "name": f"{e.kind}: {e.what}",
                           "cat": e.kind, "ts": us(e.time_ns),
                           "args": {"detail": e.detail, "source": format_source(e.source)}})

    # Counter tracks: memory per core, launches in flight, graphs built so far.
    for s in profile.memory:
        events.append({"ph": "C", "pid": _device_pid(s.device), "name": "memory", "ts": us(s.time_ns),
                       "args": {"allocated": s.allocated, "reserved": s.reserved}})
    changes = []
    for l in profile.launches:
        if l.kind in ("graph", "op") and l.start_ns:
            changes += [(l.enqueue_ns, 1, l.device), (l.end_ns, -1, l.device)]
    depth: dict[int, int] = {}
    for t, delta, d in sorted(changes):
        depth[d] = depth.get(d, 0) + delta
        events.append({"ph": "C", "pid": _device_pid(d), "name": "launches in flight", "ts": us(t),
                       "args": {"launches": depth[d]}})
    built = 0
    for e in profile.events:
        if e.kind in ("new_graph", "recompile"):
            built += 1
            events.append({"ph": "C", "pid": HOST_PID, "name": "graphs built", "ts": us(e.time_ns),
                           "args": {"graphs": built}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"producer": "neuron_lab", "launches": len(profile.launches)}}


def write_chrome_trace(profile: "Profile", path: PathLike) -> Path:
    """Writes ``chrome_trace(profile)`` as JSON to ``path`` (folders created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with replace_file(path, "Chrome trace") as f:
        json.dump(chrome_trace(profile), f)
    return path


LAUNCH_COLUMNS = ("launch_id", "kind", "name", "device", "stream", "enqueue_us", "start_us", "end_us",
                  "device_us", "modelled_us", "flops", "bytes_moved", "modelled_utilisation", "queued_us", "host_us",
                  "n_ops", "graph_id", "tier", "status", "bytes_allocated", "source", "source_file", "source_line")
OP_COLUMNS = ("launch_id", "index", "op", "inputs", "host_us", "device_us", "modelled_us", "flops", "bytes_moved",
              "modelled_utilisation", "device", "stream", "graph_id", "tier", "source", "source_file", "source_line")


def _cost_columns(cost) -> dict:
    if cost is None:
        return {"modelled_us": None, "flops": None, "bytes_moved": None, "modelled_utilisation": None}
    return {"modelled_us": cost.modelled_ns / 1e3, "flops": cost.flops, "bytes_moved": cost.bytes,
            "modelled_utilisation": cost.utilisation}


def launch_table(profile: "Profile") -> list[dict]:
    """One row per launch; times in µs since the profile started; ``device_us`` is emulated,
    ``modelled_us`` the modelled NeuronCore time (``cost_model``)."""
    t0 = profile.start_ns
    costs = profile.costs()
    rows = []
    for l in profile.launches:
        rows.append({
            "launch_id": l.id, "kind": l.kind, "name": l.name, "device": l.device, "stream": l.stream,
            "enqueue_us": (l.enqueue_ns - t0) / 1e3, "start_us": (l.start_ns - t0) / 1e3 if l.start_ns else None,
            "end_us": (l.end_ns - t0) / 1e3 if l.end_ns else None, "device_us": l.device_ns / 1e3,
            **_cost_columns(costs[l.id][0] if l.id in costs else None),
            "queued_us": l.queued_ns / 1e3, "host_us": l.host_ns / 1e3, "n_ops": l.n_ops, "graph_id": l.graph_id,
            "tier": l.tier, "status": l.status, "bytes_allocated": l.bytes_allocated,
            "source": format_source(l.source) if l.source else None,
            "source_file": l.source.file if l.source else None, "source_line": l.source.line if l.source else None,
        })
    return rows


def op_table(profile: "Profile") -> list[dict]:
    """One row per recorded op of every launch (inline kernels count as one op)."""
    costs = profile.costs()
    rows = []
    for l in profile.launches:
        if l.kind in ("event", "wait"):
            continue
        calls = l.ops
        launch_cost, op_costs = costs.get(l.id, (None, []))
        if not calls:
            rows.append({"launch_id": l.id, "index": 0, "op": l.name, "inputs": "", "host_us": 0.0,
                         "device_us": l.device_ns / 1e3, **_cost_columns(launch_cost), "device": l.device,
                         "stream": l.stream, "graph_id": l.graph_id, "tier": l.tier,
                         "source": format_source(l.source) if l.source else None,
                         "source_file": l.source.file if l.source else None,
                         "source_line": l.source.line if l.source else None})
            continue
        for i, op in enumerate(calls):
            device_us = op.device_ns / 1e3 if op.device_ns >= 0 else (l.device_ns / 1e3 if len(calls) == 1 else None)
            rows.append({"launch_id": l.id, "index": i, "op": op.name, "inputs": op.inputs,
                         "host_us": op.host_ns / 1e3, "device_us": device_us,
                         **_cost_columns(op_costs[i] if i < len(op_costs) else None), "device": l.device,
                         "stream": l.stream, "graph_id": l.graph_id, "tier": l.tier,
                         "source": format_source(op.source) if op.source else None,
                         "source_file": op.source.file if op.source else None,
                         "source_line": op.source.line if op.source else None})
    return rows


def _paths(path: PathLike, suffix: str) -> tuple[Path, Path]:
    """``run.csv`` -> (``run.csv``, ``run_ops.csv``): launches and ops side by side."""
    path = Path(path)
    if path.suffix != suffix:
        path = path.with_suffix(path.suffix + suffix) if path.suffix else path.with_suffix(suffix)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path, path.with_name(path.stem + "_ops" + suffix)


def write_csv(profile: "Profile", path: PathLike) -> tuple[Path, Path]:
    """Writes the launch table to ``path`` and the op table next to it (``*_ops.csv``)."""
    launches_path, ops_path = _paths(path, ".csv")
    for p in (launches_path, ops_path):  # both checked before either is written
        refuse_link(p, "CSV table")
    for p, columns, rows in ((launches_path, LAUNCH_COLUMNS, launch_table(profile)),
                             (ops_path, OP_COLUMNS, op_table(profile))):
        with replace_file(p, "CSV table") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)
    return launches_path, ops_path


def write_parquet(profile: "Profile", path: PathLike) -> tuple[Path, Path]:
    """Writes the launch table to ``path`` and the op table next to it (``*_ops.parquet``)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ImportError(
            "Profile.export_parquet() needs pyarrow, which is not installed. Install it with "
            "`pip install 'neuron_lab[parquet]'` (or `pip install pyarrow`), or use export_csv() instead."
        ) from e
    launches_path, ops_path = _paths(path, ".parquet")
    for p in (launches_path, ops_path):
        refuse_link(p, "Parquet table")
    for p, columns, rows in ((launches_path, LAUNCH_COLUMNS, launch_table(profile)),
                             (ops_path, OP_COLUMNS, op_table(profile))):
        table = pa.Table.from_pylist(rows) if rows else pa.table({c: [] for c in columns})
        with replace_file(p, "Parquet table", binary=True) as f:
            pq.write_table(table, f)
    return launches_path, ops_path
