"""The device's observations, for the layers above it (``neuron_lab.observability``,
``neuron_lab.compile``): its clock, launch records, event log, memory watermarks,
running totals and transfer counters.

A thin, typed face of the native ``_C.trace`` submodule and the device's counters:
one function per native call, with the same behaviour. The layers above use these
functions, never ``neuron_lab.device._C`` itself. Times are nanoseconds on the
runtime's clock (``time.monotonic_ns()``).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Optional

from neuron_lab.device import _C

__all__ = [
    "EventKind",
    "LaunchKind",
    "Reason",
    "allocated",
    "async_failures",
    "busy_union_ns",
    "close_watermark",
    "device_counters",
    "events_since",
    "last_torch_profile",
    "launch_times",
    "log_event",
    "now_ns",
    "open_watermark",
    "profiler_waits",
    "reset_launch_times",
    "set_profile_annotator",
    "set_source_name",
    "start_profile",
    "stop_profile",
    "thread_phases",
    "totals",
]

_native = _C.trace

Reason = _native.Reason
"""Why the host waited for the device or the runtime launched its buffer (``Reason.COPY_TO_HOST``,
``Reason.OP_LIMIT``, ...); ``reason.words`` is how counters and explanations name it."""

LaunchKind = _native.LaunchKind
"""What a launch record is (its ``kind``): ``GRAPH``, ``OP``, ``INLINE``, ``EVENT``, ``WAIT``. A
``StrEnum`` made from the native kinds, so each member equals its word (``LaunchKind.GRAPH == "graph"``)."""

EventKind = _native.EventKind
"""What an event of the log is (its ``kind``): ``SYNC``, ``NEW_GRAPH``, ``RECOMPILE``, ``INLINE_OP``,
``COMPILE``, ``COMPILE_FAILED``, ``COMPILED_FALLBACK``, ``POLICY``; a ``StrEnum`` like ``LaunchKind``."""


def now_ns() -> int:
    """The runtime's clock (the same as ``time.monotonic_ns()``)."""
    return int(_native.now_ns())


def allocated() -> list[int]:
    """Allocated bytes per core as of the allocator's last change (does not wait for the device)."""
    return list(_native.allocated())


def open_watermark() -> int:
    """Starts tracking the peak allocated bytes of every core; returns a handle for ``close_watermark``."""
    return int(_native.open_watermark())


def close_watermark(handle: int) -> list[int]:
    """Peak allocated bytes per core since ``open_watermark()`` returned ``handle``; ends that tracking."""
    return list(_native.close_watermark(int(handle)))


def start_profile() -> int:
    """Starts collecting launch records and memory samples; returns a handle for ``stop_profile``."""
    return int(_native.start_profile())


def stop_profile(handle: int) -> dict[str, Any]:
    """Stops a profile: ``{"launches": [dict], "memory": [(time_ns, device, allocated, reserved)],
    "start_ns": int, "end_ns": int}``."""
    return dict(_native.stop_profile(int(handle)))


def last_torch_profile() -> dict[str, Any]:
    """The launches and memory samples that torch.profiler's latest trace with
    ``ProfilerActivity.PrivateUse1`` turned into its device lanes (``stop_profile``'s shape)."""
    return dict(_native.last_torch_profile())


def set_profile_annotator(annotator: Optional[Callable[[dict[str, Any]], dict[str, Any]]]) -> None:
    """Registers what names source files and models op costs for torch.profiler's device lanes:
    ``annotator(profile) -> {"files": {path: name}, "launches": {launch_id: (cost, [op cost, ...])}}``
    with each cost ``(flops, bytes, modelled_ns)`` (-1: not modelled). None unregisters it."""
    _native.set_profile_annotator(annotator)


@contextlib.contextmanager
def profiler_waits() -> Iterator[None]:
    """Host waits on this thread inside the block are a profiler's own (finishing a region's
    device work, reading its memory): logged with ``by_profiler`` set and kept out of the
    ``wait_ns`` total, so that no explanation lists them as the user's."""
    _native.enter_profiler_waits()
    try:
        yield
    finally:
        _native.exit_profiler_waits()


def events_since(since_ns: int) -> list[dict[str, Any]]:
    """The event log (syncs, new graphs, recompiles, inline ops, compiles) since a time, as
    native dicts (``neuron_lab.observability.records.events_since`` turns them into ``Event``s)."""
    return list(_native.events_since(int(since_ns)))


def log_event(kind: EventKind | str, what: str, detail: str, duration_ns: int = 0, graph_id: int = -1,
              device: int = -1) -> None:
    """Logs an event (e.g. a torch.compile graph build) at the caller's user line; it began
    ``duration_ns`` ago. ``kind`` is an ``EventKind`` or its word; any other raises ValueError."""
    _native.log_event(kind, what, detail, int(duration_ns), int(graph_id), int(device))


def totals() -> dict[str, Any]:
    """Running totals since start: ``device_busy_ns`` (a list, per core), ``record_ns`` (host time
    spent recording ops), ``wait_ns`` (host time spent waiting for the device, the profilers' own
    waits apart), ``profiler_wait_ns`` (those)."""
    return dict(_native.totals())


def thread_phases() -> dict[str, int]:
    """The calling thread's host time so far, each moment counted once (the innermost
    activity wins): ``recording_ns`` (recording ops and building launches), ``waiting_ns``
    (blocked on the device, running the launches it waits for included) and
    ``running_ops_ns`` (ops run at once on this thread, and launches it ran as it made them:
    ``neuron_lab.device.launches``). The rest of a region's wall time
    on this thread is the user's own code."""
    return dict(_native.thread_phases())


def busy_union_ns() -> int:
    """Wall time so far during which at least one launch ran on any core or stream: over a
    region, its change is at most the region's wall time."""
    return int(_native.busy_union_ns())


def set_source_name(file: str, name: str, lines: list[str]) -> None:
    """Names ``file`` to the user in the runtime's messages (IPython's ``Cell In[7]`` for
    the file a cell compiled to) and gives its text, which no file on disk holds."""
    _native.set_source_name(str(file), str(name), [str(line) for line in lines])


def async_failures() -> list[dict[str, Any]]:
    """The last few ops that failed inside a launch (raised later, at a wait): ``context``
    (text the error's message carries), ``op``, ``recorded`` (file, line, function) and
    ``not_run`` (the ops recorded after it in its launch: (op, (file, line, function)))."""
    return list(_native.async_failures())


def launch_times() -> dict[LaunchKind, tuple[int, list[int]]]:
    """Per launch kind that runs work (``LaunchKind.GRAPH``, ``OP``, ``INLINE``): (launches so
    far, the last <= 8192 execution times in ns)."""
    return {kind: (int(count), list(times)) for kind, (count, times) in _native.launch_times().items()}


def reset_launch_times() -> None:
    """Sets the launch counts and times of ``launch_times()`` back to zero."""
    _native.reset_launch_times()


def device_counters() -> dict[str, int]:
    """The device's own counters since start: ``host_to_device_bytes``, ``device_to_host_bytes``,
    ``device_to_device_bytes`` (copies), ``fallback_ops`` (ops run by the CPU fallback),
    ``unboxed_ops`` (of those, the hot ops that skipped boxing their arguments), ``output_copies``,
    ``bulk_bernoulli_elements`` (``bernoulli_`` elements drawn a state twist at a time: ATen's
    draws, faster), ``host_kernel_ops`` (ops run by a host kernel faster than ATen's, with
    its bits: ``_safe_softmax``'s ``isneginf``, ``all`` and ``where``, and a decoding loop's
    small arithmetic, unary and bitwise ops, ``where``, ``fill_``, ``arange``, ``argmax``, ``eq``,
    ``any``, ``max``, ``isin``, ``cat``, ``index_select``, ``clone``, matmuls and layer norms run
    at once), ``aliases_reused`` (host aliases of the fallback's CPU kernels handed out
    again from the thread's cache, as an optimizer's foreach ops pass the same tensors every
    step), ``aliases_recycled`` (cached host aliases re-pointed at a new tensor instead of
    made anew), ``launches_run_by_waiting_host`` (launches a host thread ran
    itself while it waited for them, instead of handing them to the stream's device thread),
    ``device_thread_wakeups`` (wake-up calls to device threads for queued work) and
    ``launches_dropped_by_host`` (launches a device thread ran and left to a host thread to drop,
    with the tensors they held: dropping those may take the GIL)."""
    return dict(_C.counters())
