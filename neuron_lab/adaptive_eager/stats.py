"""Counters and the graph cache of adaptive eager, for programs and the profiler, and the
buffered work: ``flush`` (launch it) and ``synchronize_all`` (launch it and wait for it)."""

from __future__ import annotations

from neuron_lab.adaptive_eager._native import native as _native
from neuron_lab.device.trace import Reason

__all__ = ["counters", "reset_counters", "graphs", "clear_graph_cache", "flush", "synchronize_all", "queue_depth", "forget_repeats"]


def counters() -> dict:
    """Every decision the runtime took since start (or ``reset_counters()``).

    ops_recorded, launches (all launches, one per graph or per op in eager mode),
    graph_launches, graphs_built (cache misses), cache_hits, compiles_requested /
    _succeeded / _failed, compile_seconds (in the background), compiled_launches,
    replay_launches, compiled_fallbacks (compiled code failed, replayed instead),
    compiled_rejected (compiled code was slower than replay), compiled_stale (compiled
    code dropped because the graph's floating-point scalars changed), inline_ops (ops run
    on the calling thread: host reads, data-dependent shapes, ...; by op in
    ``inline_by_op``), dead_intermediate_bytes (results that never took device
    memory), scratch_cached_bytes (host memory kept for replayed graphs' dead intermediates,
    outside the memory statistics; ``torch.neuron.empty_cache()`` frees it),
    live_result_bytes, graphs_evicted (least recently used graphs dropped from
    the bounded cache), graph_joins (a cached graph's buffer held on to take in the graph
    that always follows it), flushes (by reason) and syncs (host waits, by reason).
    """
    return dict(_native.counters())


def reset_counters() -> None:
    """Sets every counter back to zero."""
    _native.reset_counters()


def graphs() -> list[dict]:
    """The graph cache: one dict per cached graph (ops, hits, tier, timings, source line,
    ``scalar_changes``: how often its floating-point scalar arguments changed)."""
    return list(_native.graphs())


def clear_graph_cache() -> None:
    """Forgets every cached graph (compiled code included)."""
    _native.clear_graph_cache()


def flush(device: int = -1, reason: Reason = Reason.EXPLICIT_FLUSH) -> None:
    """Launches every buffered op now (of one core, or of all with -1); does not wait.
    ``reason`` is what the flush counters (``counters()["flushes"]``) count it under."""
    _native.flush(int(device), reason)


def synchronize_all(reason: Reason = Reason.SYNCHRONIZE) -> None:
    """Launches what every stream of every core has buffered and waits for all of it, as one
    host wait logged under ``reason`` (the explain/metrics sync trigger). The first
    asynchronous error of that work is raised once every core is idle.

    Unlike ``torch.neuron.synchronize(device)``, which waits for one core, this covers
    every core."""
    _native.synchronize_all(reason)


def forget_repeats() -> None:
    """Forgets whether recent graphs repeated, so ops are recorded again at once (after a
    phase of shapes that change every step, e.g. ``generate()``, the runtime otherwise runs
    ops at once until a recorded probe repeats a cached graph; see ``configure``)."""
    _native.forget_repeats()


def queue_depth(device: int = 0, stream_id: int = 0) -> int:
    """Launches enqueued on a stream and not yet executed."""
    return int(_native.queue_depth(int(device), int(stream_id)))
