"""Streams and events for ``torch.neuron``, with the semantics of ``torch.cuda``.

A stream is an in-order queue of launches on one core; an event marks a point in
a stream that other streams (``wait_event``) or the host (``synchronize``) can
wait for, and that can be timed (``elapsed_time``). Both are thin subclasses of
``torch.Stream`` / ``torch.Event``, whose work the native device guard does.
"""

from __future__ import annotations

from typing import Any

import torch

from neuron_lab.device import _C
from neuron_lab.device.core import device_index

__all__ = [
    "Stream",
    "Event",
    "StreamContext",
    "stream",
    "current_stream",
    "default_stream",
    "set_stream",
    "num_streams",
    "stream_launches",
]


class Stream(torch.Stream):
    """An in-order queue of work on one NeuronCore (``torch.cuda.Stream`` for neuron).

    Args:
        device: the core (default: the current one).
        priority: accepted for compatibility; every stream has the same priority.
    """

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> "Stream":
        if "stream_id" in kwargs:  # re-wrapping an existing stream
            return super().__new__(cls, **kwargs)
        index = device_index(device)
        return super().__new__(cls, device=torch.device("neuron", index), priority=priority)

    def record_event(self, event: "Event | None" = None) -> "Event":
        """Records ``event`` (a new one if omitted) at the current end of this stream."""
        event = Event() if event is None else event
        event.record(self)
        return event

    def __repr__(self) -> str:
        return f"<torch.neuron.Stream device=neuron:{self.device_index} stream_id={self.stream_id}>"


class Event(torch.Event):
    """A marker in a stream (``torch.cuda.Event`` for neuron).

    Args:
        enable_timing: record a timestamp so that ``elapsed_time`` can be used.
        blocking, interprocess: accepted for compatibility with ``torch.cuda.Event``.
    """

    def __new__(
        cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> "Event":
        if interprocess:
            raise NotImplementedError(
                "neuron: interprocess events are not supported; the emulated device lives in one process"
            )
        return super().__new__(
            cls, device=torch.device("neuron", device_index(None)), enable_timing=enable_timing, blocking=blocking
        )

    def record(self, stream: torch.Stream | None = None) -> None:  # type: ignore[override]
        """Records the event on ``stream`` (default: the current stream)."""
        super().record(current_stream() if stream is None else stream)

    def wait(self, stream: torch.Stream | None = None) -> None:  # type: ignore[override]
        """Makes ``stream`` (default: the current stream) wait for this event."""
        super().wait(current_stream() if stream is None else stream)

    def elapsed_time(self, end_event: torch.Event) -> float:  # type: ignore[override]
        """Milliseconds from this event to ``end_event``; both need ``enable_timing=True``."""
        return _C.event_elapsed_time(self, end_event)


def _wrap(s: torch.Stream) -> Stream:
    return Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


def current_stream(device: Any = None) -> Stream:
    """The stream that new work on ``device`` (default: current core) goes to."""
    return _wrap(torch.accelerator.current_stream(device_index(device)))


def default_stream(device: Any = None) -> Stream:
    """The default stream (id 0) of a core."""
    s = torch.accelerator.current_stream(device_index(device))
    return Stream(stream_id=0, device_index=s.device_index, device_type=s.device_type)


def set_stream(stream: torch.Stream) -> None:
    """Makes ``stream`` the current stream of its core, and its core current (as CUDA does)."""
    if stream is None:
        return
    torch.accelerator.set_stream(stream)


class StreamContext:
    """Context manager that makes ``stream`` current, as ``torch.cuda.StreamContext`` does.

    Like CUDA, selecting a stream also selects its core for the block; on exit the
    previous stream of that core and the previous current core are restored.
    """

    def __init__(self, stream: torch.Stream | None) -> None:
        self.stream = stream
        self.previous_current: torch.Stream | None = None  # current core's stream at entry
        self.previous_target: torch.Stream | None = None  # the stream's core's stream at entry

    def __enter__(self) -> torch.Stream | None:
        if self.stream is not None:
            self.previous_current = current_stream()
            self.previous_target = current_stream(self.stream.device_index)
            set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc: object) -> None:
        if self.stream is None:
            return
        set_stream(self.previous_target)
        set_stream(self.previous_current)  # restores the current core as well


def stream(stream: torch.Stream | None) -> StreamContext:
    """``with torch.neuron.stream(s):`` runs the block's work on ``s``."""
    return StreamContext(stream)


def num_streams(device: int) -> int:
    """How many streams of a core (given by its index) exist so far; their ids are ``0 .. n-1``."""
    return int(_C.num_streams(int(device)))


def stream_launches(device: int, stream_id: int) -> tuple[int, int]:
    """(enqueued, completed) launches of one stream of a core since start, ops a host thread
    ran at once on it (counted as enqueued and completed together) included."""
    enqueued, completed = _C.stream_launches(int(device), int(stream_id))
    return int(enqueued), int(completed)
