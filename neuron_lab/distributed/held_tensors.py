"""Host tensors that gloo's worker threads may still hold after their collective finished.

Gloo runs a collective on a worker thread, wakes the caller that waits for it, and only
then drops its reference to the work, and so to the work's tensors. When that is the last
reference to a tensor made in Python (the backend's host aliases and staging copies are
temporaries), the worker frees the tensor's Python object, which takes the GIL; a thread
that takes the GIL while the interpreter shuts down is ended by CPython inside a C++
destructor, which aborts the process ("terminate called without an active exception":
9 of 30 two-rank runs that exited right after a large all_reduce). So the backend hands
gloo its tensors through ``HoldingGloo``, which keeps a reference to each until gloo has
let go of it, and waits for the last ones when the process exits.
"""

from __future__ import annotations

import atexit
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["HoldingGloo", "held_count", "wait_until_released"]

_EXIT_WAIT_S = 30.0  # at most, for gloo's threads to drop the works of finished collectives

_lock = threading.Lock()
_held: list[tuple[torch.Tensor, int]] = []  # a tensor, and its use count before gloo got it


def _tensors(values: Any) -> list[torch.Tensor]:
    """The tensors in a gloo call's arguments (tensors, or lists of them, nested)."""
    if isinstance(values, torch.Tensor):
        return [values]
    if isinstance(values, (list, tuple)):
        return [t for v in values for t in _tensors(v)]
    return []


def _hold(tensors_and_counts: list[tuple[torch.Tensor, int]]) -> None:
    with _lock:
        _held[:] = [(t, n) for t, n in _held if t._use_count() > n]  # what gloo let go of
        _held.extend(tensors_and_counts)


def held_count() -> int:
    """How many tensors gloo may still hold (those it let go of are dropped here)."""
    _hold([])
    return len(_held)


def wait_until_released(timeout_s: float = _EXIT_WAIT_S) -> bool:
    """Waits until gloo's threads let go of every held tensor (they need no GIL for that:
    a reference is still here), then drops them; False if some were still held after
    ``timeout_s`` (those stay held)."""
    deadline = time.monotonic() + timeout_s
    while held_count() and time.monotonic() < deadline:
        time.sleep(0.001)
    return held_count() == 0


atexit.register(wait_until_released)  # atexit runs before the interpreter ends other threads


class HoldingGloo:
    """An inner ``ProcessGroupGloo`` whose calls keep their tensors referenced until gloo
    drops them (see the module's docstring); everything else passes through."""

    def __init__(self, gloo: dist.ProcessGroup) -> None:
        self.gloo = gloo

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.gloo, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            tensors = _tensors(args) + _tensors(list(kwargs.values()))
            counts = [(t, t._use_count()) for t in tensors]
            result = attribute(*args, **kwargs)
            _hold(counts)
            return result

        call.__name__ = name
        return call

