"""Adaptive eager: the neuron device's runtime records eager ops lazily, fuses
runs of them into small graphs, caches the graphs by structure and compiles hot
ones in the background, while programs keep eager semantics.

Public API (also at the top level of ``neuron_lab``): ``set_mode``,
``get_mode``, ``mode``, ``configure``; and here: ``counters``,
``reset_counters``, ``graphs``, ``clear_graph_cache``, ``flush``,
``synchronize_all``, ``wait_for_compiles``. See ``docs/adaptive_eager.md`` for the policy.
"""

from __future__ import annotations

from neuron_lab.adaptive_eager.compiler import pending_compiles, set_recording_torch_compile_graph, wait_for_compiles
from neuron_lab.adaptive_eager.modes import MODES, configure, configured, get_mode, mode, policy, set_mode
from neuron_lab.adaptive_eager.stats import (
    clear_graph_cache,
    counters,
    flush,
    forget_repeats,
    graphs,
    queue_depth,
    reset_counters,
    synchronize_all,
)

__all__ = [
    "MODES",
    "set_mode",
    "get_mode",
    "mode",
    "configure",
    "configured",
    "policy",
    "counters",
    "reset_counters",
    "graphs",
    "clear_graph_cache",
    "forget_repeats",
    "flush",
    "synchronize_all",
    "queue_depth",
    "wait_for_compiles",
    "pending_compiles",
    "set_recording_torch_compile_graph",
    "start",
]


def start() -> None:
    """Connects the runtime to the device: what it needs at import (the environment's
    mode and knobs) now, the rest (an exit hook that waits for queued work) at the
    device's first use. The background
    compiler starts only when something may compile (``configure(compile=True)``,
    ``NEURON_LAB_COMPILE=1``, the neuron torch.compile backend): ``import torch`` starts
    no thread and changes nothing of torch."""
    from neuron_lab.adaptive_eager import modes
    from neuron_lab.device.registration import on_first_use

    modes.apply_environment()
    on_first_use(_on_first_use)


def _on_first_use() -> None:
    import atexit

    atexit.register(_finish_at_exit)


def _finish_at_exit() -> None:
    from neuron_lab.adaptive_eager import compiler, stats
    from neuron_lab.device.api import _is_in_bad_fork
    from neuron_lab.device.trace import Reason

    if _is_in_bad_fork():
        return  # a child forked after the device started: the work is the parent's

    try:
        stats.synchronize_all(Reason.EXIT)
    except Exception as e:  # noqa: BLE001 - the process is ending: say it, do not raise
        import sys

        first_line = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"neuron_lab: an error in device work was never waited for: {type(e).__name__}: {first_line}",
              file=sys.stderr)
    compiler.stop()  # if it ever started
