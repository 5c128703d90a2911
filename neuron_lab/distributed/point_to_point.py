"""Sends and receives whose two sides agree before their data moves.

Gloo's send/recv moves bytes with no check of its own: a receive smaller than its send
terminates the receiving process (gloo's EnforceNotMet, then ``std::terminate``), a larger
one fills what arrived and leaves the rest as it was, and a float32 send into an int32
receive reinterprets the bits. So each transfer starts with a handshake: the sender and
the receiver swap a fixed-size header (dtype, number of elements, shape, whether this
side already failed), and both compare the same two headers. When they fit, the data
moves; when they do not, no data moves and both ranks raise the same
``PointToPointMismatchError``, so the pair stays usable for the next transfer.

Gloo's sends complete once the receiver has posted its receive, without the receiving
thread's help; code that posts an ``isend`` and then blocks on a receive relies on that.
The handshake keeps it: each transfer runs on a *lane* thread (one per peer, tag and
direction, so transfers of one channel keep their order and different channels never wait
for each other, as in gloo), which swaps the headers and then posts the data. The user's
thread only stages the tensors and, in ``wait()``, waits for its lane.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from neuron_lab.distributed.agreement import _ALL_DTYPES, CollectiveMismatchError, _dtype_code

__all__ = ["MAX_TAG", "PointToPointMismatchError", "Transfer", "TransferHeader", "submit"]

MAX_TAG = (1 << 29) - 1
"""The largest tag a neuron send or receive takes: the handshake's headers travel on
gloo tags above it (the sender's at ``tag + 2**29``, the receiver's at ``tag + 2**30``)."""
_SENDER_HEADER_TAG, _RECEIVER_HEADER_TAG = 1 << 29, 1 << 30
_MAGIC = 0x4E50_3250  # "NP2P": a header, not stray data
_MAX_DIMS = 8
_SLOTS = 16  # magic, failed, dtype, numel, count, ndim, dims[8], 2 spare


class PointToPointMismatchError(CollectiveMismatchError):
    """A send and its receive do not fit (dtype or number of elements), or one side failed
    before its data moved; raised on both ranks, with nothing sent."""


@dataclass(frozen=True)
class TransferHeader:
    """What one side of a transfer holds: ``numel`` and ``dtype`` must match the other
    side's; the shape is shown in errors only (a send may land in a tensor of another
    shape with as many elements, as on CUDA)."""

    dtype: torch.dtype | None
    numel: int
    shape: tuple[int, ...]
    count: int = 1
    failed: bool = False

    @staticmethod
    def of(tensors: Sequence[torch.Tensor]) -> "TransferHeader":
        first = tensors[0] if tensors else None
        return TransferHeader(first.dtype if first is not None else None, sum(t.numel() for t in tensors),
                              tuple(first.shape) if first is not None else (), len(tensors))

    def encode(self) -> torch.Tensor:
        dims = list(self.shape[:_MAX_DIMS]) + [0] * (_MAX_DIMS - min(len(self.shape), _MAX_DIMS))
        slots = [_MAGIC, int(self.failed), _dtype_code(self.dtype), self.numel, self.count, len(self.shape), *dims]
        return torch.tensor(slots + [0] * (_SLOTS - len(slots)), dtype=torch.int64)

    @staticmethod
    def decode(slots: torch.Tensor) -> "TransferHeader":
        values = slots.tolist()
        if values[0] != _MAGIC:
            raise RuntimeError("the peer's handshake header is not one: does the peer run a neuron process group?")
        ndim = values[5]
        return TransferHeader(_DTYPES_BY_CODE.get(values[2]), values[3], tuple(values[6:6 + min(ndim, _MAX_DIMS)]),
                              values[4], bool(values[1]))

    def describe(self) -> str:
        dtype = str(self.dtype).replace("torch.", "") if self.dtype is not None else "?"
        text = f"{dtype}[{', '.join(str(d) for d in self.shape)}] ({self.numel} elements)"
        return text if self.count == 1 else f"{self.count} tensors, the first {text}"


_DTYPES_BY_CODE = {_dtype_code(d): d for d in [*_ALL_DTYPES, torch.uint16, torch.uint32, torch.uint64,
                                                torch.float8_e4m3fn, torch.float8_e5m2, torch.complex32]}


def mismatch(sender: int, receiver: int, tag: int, sent: TransferHeader, expected: TransferHeader) -> str | None:
    """The error both sides of one transfer raise, or None when the two headers fit (the
    same text on both ranks: each computes it from the same two headers)."""
    what = f"send from rank {sender} to rank {receiver} (tag {tag})"
    if sent.failed or expected.failed:
        ranks = " and ".join(f"rank {r}" for r, h in ((sender, sent), (receiver, expected)) if h.failed)
        return (f"{what}: {ranks} raised an error before the data moved (its own output says which); nothing was "
                "sent, and both ranks raised.")
    if sent.dtype == expected.dtype and sent.numel == expected.numel and sent.count == expected.count:
        return None
    if sent.dtype != expected.dtype:
        problem = "the dtypes differ (a recv never converts: the bits would be reinterpreted)"
    elif sent.numel != expected.numel:
        problem = "the numbers of elements differ"
    else:
        problem = "the numbers of tensors differ"
    dtype = str(sent.dtype).replace("torch.", "")
    return (f"{what} does not fit its recv: rank {sender} sends {sent.describe()}, rank {receiver} receives into "
            f"{expected.describe()}; {problem}. A recv needs a tensor of the send's dtype and number of elements, "
            f"e.g. torch.empty({sent.shape if len(sent.shape) != 1 else sent.shape[0]}, dtype=torch.{dtype}, "
            f"device='neuron'). Nothing was sent; both ranks raised this error, and the group stays usable.")


@dataclass(eq=False)
class Transfer:
    """One send or receive: its handshake and data, run on a lane thread (``run``);
    ``done`` is set when it finished, with ``error`` set if it failed. ``peer`` is -1 for
    a receive from any rank until the handshake names the sender (``source``)."""

    gloo: object  # the inner (holding) gloo group
    sending: bool
    peer: int
    tag: int
    rank: int
    hosts: list[torch.Tensor]
    header: TransferHeader
    transport_error: Callable[[RuntimeError], Exception]
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    source: int = -1

    def run(self) -> None:
        try:
            self.source = self._handshake()
            if self.error is None:
                gloo = self.gloo
                move = gloo.send if self.sending else gloo.recv
                move(self.hosts, self.source, self.tag).wait()
        except RuntimeError as e:
            self.error = self.transport_error(e)
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            self.error = e
        finally:
            self.done.set()

    def _handshake(self) -> int:
        """Swaps headers with the peer; sets ``error`` when they do not fit. Returns the peer."""
        mine, theirs = self.header.encode(), torch.empty(_SLOTS, dtype=torch.int64)
        my_tag, their_tag = ((_SENDER_HEADER_TAG, _RECEIVER_HEADER_TAG) if self.sending
                             else (_RECEIVER_HEADER_TAG, _SENDER_HEADER_TAG))
        gloo, peer = self.gloo, self.peer
        if peer < 0:  # a receive from any rank: the first sender's header names it
            received = gloo.recv_anysource([theirs], their_tag + self.tag)
            received.wait()
            peer = received._source_rank()
            gloo.send([mine], peer, my_tag + self.tag).wait()
        else:
            sent = gloo.send([mine], peer, my_tag + self.tag)
            received = gloo.recv([theirs], peer, their_tag + self.tag)
            sent.wait()
            received.wait()
        other = TransferHeader.decode(theirs)
        sender, receiver = (self.rank, peer) if self.sending else (peer, self.rank)
        sent_header, expected = (self.header, other) if self.sending else (other, self.header)
        problem = mismatch(sender, receiver, self.tag, sent_header, expected)
        if problem is not None:
            self.error = PointToPointMismatchError(problem)
        return peer


class _Lane:
    def __init__(self) -> None:
        self.queue: collections.deque[Transfer] = collections.deque()
        self.running = False


_lock = threading.Lock()
_lanes: dict[tuple[int, int, int, bool], _Lane] = {}


def submit(transfer: Transfer) -> None:
    """Queues ``transfer`` on its lane (this group, peer, tag, direction) and starts the
    lane's thread if it is idle; the thread ends when its lane is empty."""
    key = (id(transfer.gloo), transfer.peer, transfer.tag, transfer.sending)
    with _lock:
        lane = _lanes.setdefault(key, _Lane())
        lane.queue.append(transfer)
        if lane.running:
            return
        lane.running = True
    direction = "send to" if transfer.sending else "recv from"
    threading.Thread(target=_drain, args=(key, lane), daemon=True,
                     name=f"neuron-p2p {direction} {transfer.peer} tag {transfer.tag}").start()


def _drain(key: tuple[int, int, int, bool], lane: _Lane) -> None:
    while True:
        with _lock:
            if not lane.queue:
                lane.running = False
                if _lanes.get(key) is lane:
                    del _lanes[key]
                return
            transfer = lane.queue.popleft()
        transfer.run()
