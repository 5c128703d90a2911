"""Execution modes of the neuron device, and the knobs of adaptive eager.

=========  ================================================================
mode       what an op on a neuron tensor does
=========  ================================================================
adaptive   (default) is recorded into its stream's buffer; runs of ops are
           launched as fused graphs, cached and, when hot, compiled
eager      becomes one asynchronous launch on the current stream
blocking   runs at once on the calling thread (errors raise at the op),
           for debugging, like ``CUDA_LAUNCH_BLOCKING=1``
=========  ================================================================

The mode is process-wide. ``NEURON_LAB_MODE`` sets it at start-up;
``torch.use_deterministic_algorithms(True)`` turns fusion off (adaptive then
launches op by op, as eager), as in TorchNeuron.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, Optional

from neuron_lab.adaptive_eager._native import native as _native

__all__ = ["MODES", "set_mode", "get_mode", "mode", "configure", "configured", "policy"]

MODES = ("blocking", "eager", "adaptive")


def _check_mode(name: str) -> int:
    if name not in MODES:
        raise ValueError(
            f"unknown neuron execution mode {name!r}; choose one of {', '.join(MODES)} "
            "(e.g. neuron_lab.set_mode('adaptive'))"
        )
    return MODES.index(name)


def set_mode(name: str) -> None:
    """Sets the execution mode. Pending device work finishes first."""
    _native.set_mode(_check_mode(name))


def get_mode() -> str:
    """The current execution mode: ``'adaptive'``, ``'eager'`` or ``'blocking'``."""
    return MODES[_native.get_mode()]


@contextlib.contextmanager
def mode(name: str) -> Iterator[None]:
    """Runs a block in another execution mode and restores the previous one.

    >>> with neuron_lab.mode("blocking"):   # errors raise at the failing op
    ...     y = model(x)
    """
    previous = get_mode()
    set_mode(name)
    try:
        yield
    finally:
        set_mode(previous)


def configure(
    max_ops: Optional[int] = None,
    idle_flush_bytes: Optional[int] = None,
    compile_after: Optional[int] = None,
    compile: Optional[bool] = None,
    capture_source: Optional[bool] = None,
    graph_cache_size: Optional[int] = None,
    idle_flush_ops: Optional[int] = None,
    run_unrepeated_at_once: Optional[bool] = None,
    max_bytes: Optional[int] = None,
    run_at_once_on_host: Optional[bool] = None,
    run_at_once_if_cheaper: Optional[bool] = None,
) -> dict:
    """Sets knobs of adaptive eager; returns the resulting policy.

    max_ops: most ops in one graph (default 256; ``NEURON_LAB_MAX_GRAPH_OPS``).
    max_bytes: most bytes of live results in one graph, past its newest op's (default 8 MiB;
        intermediates that die inside the graph do not count). A launch gives its live
        results memory when it starts and frees what it read when it ends, so bounded graphs
        keep peak memory near eager mode's.
    idle_flush_bytes, idle_flush_ops: when the device is idle and this many bytes of
        results (default 1 MiB) or this many ops (default 32) are buffered, they are
        launched at once instead of waiting to grow (with ``compile=True``: unless a
        cached graph starts the same way, so that hot graphs stay the same).
    compile_after: launches of one graph before it is compiled with TorchInductor
        in the background (default 10; ``NEURON_LAB_COMPILE_AFTER``).
    compile: the compiled tier for graphs of eager code (default False;
        ``NEURON_LAB_COMPILE=1`` turns it on). Compiled code is faster for long
        elementwise chains but rounds differently from the CPU kernels: results change
        in the last bits, and from run to run with the moment a background compile
        finishes. Off, the default mode gives eager mode's numbers bit for bit. Graphs of
        ``torch.compile(backend="neuron")`` code compile whatever this says: their user
        asked for compiled code.
    capture_source: record each op's user source line (for errors and the profiler).
    graph_cache_size: graphs the cache holds at most; beyond, the least recently used
        is evicted (default 1024; ``counters()["graphs_evicted"]`` counts them).
    run_unrepeated_at_once: when at most 4 of the last 32 graphs repeated (``generate()``,
        whose shapes grow every step), or at most half of them and their ops are small
        (under 16 KiB written per op: a decoding loop whose fixed-shape prefix repeats), or
        3 graphs of small ops ran an earlier missed graph's operators with new shapes,
        building graphs costs more than fusing saves: ops
        then run at once on the calling thread while nothing is buffered (ops over 16 KiB:
        and the device is idle), with the same
        kernels and numbers (default True; ``counters()["ops_run_at_once"]`` counts them,
        and a recorded stretch every 16 host waits finds out when graphs repeat again).
    run_at_once_on_host: where the host runs launches (``launches.py``: kernels take every
        usable CPU, so no device thread computes while the host records), a replay is the
        recorded kernels run later on the same thread, and recording and replaying costs more
        than running them. So once 8 graphs ran there, ops run at once (as above; a loop that
        never waits on the host too), and no probe records again while that holds (default
        True; not with ``compile=True``). ``False`` keeps graphs recorded, e.g. to study their
        fusion.
    run_at_once_if_cheaper: where a device thread runs launches (``torch.get_num_threads()``
        below the usable CPUs: a machine with SMT, ``torchrun``'s one thread per process),
        recording pays only where the kernels it moves off the host thread take longer than
        the host then spends recording them and waiting for them. Each 16 launches weigh the
        two (``trace.totals()``'s ``record_ns`` and ``wait_ns`` against ``device_busy_ns``, on
        cached graphs: building one is paid once); where the host spent a fifth more (running
        at once has per-op costs of its own), ops run at once (as above), and a probe that finds graphs
        repeating records 16 launches again to weigh them anew, each such probe later than
        the last while recording keeps costing more (default True; not with
        ``compile=True``). ``False`` keeps such graphs recorded.
    """
    current = _native.policy()
    new = {
        "max_ops": current["max_ops"] if max_ops is None else int(max_ops),
        "max_bytes": current["max_bytes"] if max_bytes is None else int(max_bytes),
        "idle_flush_bytes": current["idle_flush_bytes"] if idle_flush_bytes is None else int(idle_flush_bytes),
        "compile_after": current["compile_after"] if compile_after is None else int(compile_after),
        "compile": current["compile"] if compile is None else bool(compile),
        "capture_source": current["capture_source"] if capture_source is None else bool(capture_source),
        "graph_cache_size": current["graph_cache_size"] if graph_cache_size is None else int(graph_cache_size),
        "idle_flush_ops": current["idle_flush_ops"] if idle_flush_ops is None else int(idle_flush_ops),
        "run_unrepeated_at_once": (current["run_unrepeated_at_once"] if run_unrepeated_at_once is None
                                   else bool(run_unrepeated_at_once)),
        "run_at_once_on_host": (current["run_at_once_on_host"] if run_at_once_on_host is None
                                  else bool(run_at_once_on_host)),
        "run_at_once_if_cheaper": (current["run_at_once_if_cheaper"] if run_at_once_if_cheaper is None
                                   else bool(run_at_once_if_cheaper)),
    }
    if new["max_ops"] < 1:
        raise ValueError(f"max_ops must be at least 1, got {new['max_ops']}")
    if new["max_bytes"] < 1:
        raise ValueError(f"max_bytes must be at least 1, got {new['max_bytes']}")
    if new["compile_after"] < 1:
        raise ValueError(f"compile_after must be at least 1, got {new['compile_after']}")
    if new["idle_flush_bytes"] < 0:
        raise ValueError(f"idle_flush_bytes must be >= 0, got {new['idle_flush_bytes']}")
    if new["idle_flush_ops"] < 1:
        raise ValueError(f"idle_flush_ops must be at least 1, got {new['idle_flush_ops']}")
    if new["graph_cache_size"] < 1:
        raise ValueError(f"graph_cache_size must be at least 1, got {new['graph_cache_size']}")
    if new["compile"]:
        from neuron_lab.adaptive_eager import compiler

        compiler.install()  # the background compiler, from the first time anything may compile
    _native.configure(new["max_ops"], new["idle_flush_bytes"], new["compile_after"], new["compile"],
                      new["capture_source"], new["graph_cache_size"], new["idle_flush_ops"],
                      new["run_unrepeated_at_once"], new["max_bytes"], new["run_at_once_on_host"],
                      new["run_at_once_if_cheaper"])
    return policy()


def policy() -> dict:
    """The current knobs (see ``configure``)."""
    return dict(_native.policy())


@contextlib.contextmanager
def configured(**knobs: object) -> Iterator[dict]:
    """Runs a block with some of ``configure``'s knobs set, and restores their previous
    values however the block ends; yields the policy in force inside.

    >>> with neuron_lab.configured(run_at_once_if_cheaper=False):  # graphs stay recorded
    ...     train(steps=10)
    """
    current = policy()
    unknown = sorted(set(knobs) - set(current))
    if unknown:
        raise TypeError(f"configured() got unknown knobs {unknown}; configure() takes {sorted(current)}")
    previous = {name: current[name] for name in knobs}
    inside = configure(**knobs)  # type: ignore[arg-type]  # names checked above
    try:
        yield inside
    finally:
        configure(**previous)  # type: ignore[arg-type]


def _int_env(name: str) -> Optional[int]:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


def apply_environment() -> None:
    """Reads NEURON_LAB_MODE, NEURON_LAB_MAX_GRAPH_OPS, NEURON_LAB_COMPILE_AFTER, NEURON_LAB_COMPILE."""
    name = os.environ.get("NEURON_LAB_MODE", "").strip().lower()
    if name:
        try:
            _check_mode(name)
        except ValueError as e:
            raise ValueError(f"NEURON_LAB_MODE: {e}") from None
        set_mode(name)
    compile_env = os.environ.get("NEURON_LAB_COMPILE")
    configure(max_ops=_int_env("NEURON_LAB_MAX_GRAPH_OPS"), compile_after=_int_env("NEURON_LAB_COMPILE_AFTER"))
    if compile_env not in (None, ""):
        from neuron_lab.files import UnsafeDirectoryError

        try:
            configure(compile=compile_env not in ("0", "false", "no", "off"))
        except UnsafeDirectoryError as e:  # never a reason for `import torch` to fail
            import warnings

            warnings.warn(f"NEURON_LAB_COMPILE: the compiled tier stays off: {e}", RuntimeWarning, stacklevel=2)
