"""The ranks meet before a collective's data moves.

Gloo terminates the process when ranks pass tensors of different sizes to the same
collective. A notebook must never lose its kernel to a typo in a shape, so before each
collective the ranks exchange a signature (which collective, dtype, shape, root, split
sizes) and every rank raises the same error, naming each rank's tensors, when they
differ. The meeting is one allgather of a fixed 16 KiB per rank: always the same size,
so that gloo never sees a mismatch itself. Small collectives ride along in it: when a
tensor fits in the meeting's 16,128 spare bytes, its bytes travel with the signature
and the collective finishes locally (``meet`` returns every rank's bytes), in one
exchange instead of two.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["INLINE_BYTES", "CollectiveMismatchError", "Meeting", "Signature"]

_WIDTH = 32  # int64 slots of the signature
_MAX_DIMS = 8
_INLINE_SLOT, _FAILED_SLOT = _WIDTH - 2, _WIDTH - 1
_MEETING_BYTES = 16 << 10
_HEADER_BYTES = _WIDTH * 8
INLINE_BYTES = _MEETING_BYTES - _HEADER_BYTES
"""The largest tensor (in bytes) whose data travels in the meeting itself."""


class CollectiveMismatchError(RuntimeError):
    """The ranks of a group called a collective with tensors that do not fit together."""


@dataclass(frozen=True)
class Signature:
    """What must fit across ranks. ``shape`` is None where ranks may differ (the list
    outputs of gather on non-root ranks, for example); ``splits`` are all_to_all's."""

    collective: str
    dtype: torch.dtype | None
    shape: tuple[int, ...] | None
    root: int = -1
    input_splits: tuple[int, ...] = ()
    output_splits: tuple[int, ...] = ()
    failed: bool = False  # this rank raised before the data could move

    def encode(self, group_size: int, inline_bytes: int = -1) -> torch.Tensor:
        slots = [_code(self.collective), _dtype_code(self.dtype), self.root]
        shape = self.shape if self.shape is not None else ()
        slots += [-1 if self.shape is None else len(shape)] + _padded(shape, _MAX_DIMS)
        if group_size <= 8 and (self.input_splits or self.output_splits):
            slots += [1] + _padded(self.input_splits, 8) + _padded(self.output_splits, 8)
        return torch.tensor(_padded(slots, _INLINE_SLOT) + [inline_bytes, int(self.failed)], dtype=torch.int64)


def _padded(values: Sequence[int], width: int) -> list[int]:
    values = [int(v) for v in values]
    if len(values) > width:  # beyond the slots: a checksum still tells ranks apart
        values = values[: width - 1] + [hash(tuple(values)) & 0x7FFFFFFFFFFFFFFF]
    return values + [0] * (width - len(values))


def _code(name: str) -> int:
    """A number for a name, the same in every process (unlike ``hash`` of a str)."""
    return zlib.crc32(name.encode())


def _dtype_code(dtype: torch.dtype | None) -> int:
    return -1 if dtype is None else zlib.crc32(str(dtype).encode())


def _describe(slots: list[int], dtypes: dict[int, str], names: dict[int, str] | None = None) -> str:
    ndim = slots[3]
    dtype = dtypes.get(slots[1], "?")
    text = f"{dtype}[{', '.join(str(d) for d in slots[4:4 + ndim])}]" if ndim >= 0 else f"{dtype}"
    if slots[2] >= 0:
        text += f" root {slots[2]}"
    if slots[4 + _MAX_DIMS] == 1:
        base = 5 + _MAX_DIMS
        text += f" splits in {slots[base:base + 8]} out {slots[base + 8:base + 16]}"
    if names is not None:  # the ranks called different collectives: say which
        text = f"{names.get(slots[0], 'another collective')} of {text}"
    return text


class Meeting:
    """The ranks' meetings of one process group, over its inner gloo group. Owns the
    meeting buffers (reused: a group runs one collective at a time)."""

    def __init__(self, gloo: dist.ProcessGroup, rank: int, group_size: int) -> None:
        self._gloo, self._rank, self._size = gloo, rank, group_size
        self._mine = torch.empty(_MEETING_BYTES, dtype=torch.uint8)
        self._header = self._mine[:_HEADER_BYTES].view(torch.int64)
        self._everyone = [torch.empty(_MEETING_BYTES, dtype=torch.uint8) for _ in range(group_size)]

    def agree(self, signature: Signature) -> None:
        """``meet`` without data: raises ``CollectiveMismatchError`` on every rank when the
        ranks' signatures differ, or on the other ranks when this one failed
        (``signature.failed``; that rank raises its own error)."""
        self.meet(signature)

    def meet(self, signature: Signature, payload: torch.Tensor | None = None) -> list[torch.Tensor] | None:
        """Checks that the ranks' signatures fit together (see ``agree``). ``payload``, a
        contiguous CPU tensor of at most ``INLINE_BYTES``, travels along; when every rank
        sent one, returns every rank's payload bytes (uint8 views valid until the next
        meeting, in rank order), else None."""
        inline = -1 if payload is None else payload.numel() * payload.element_size()
        if inline > INLINE_BYTES:
            raise ValueError(f"a payload of {inline} bytes does not fit in the meeting's {INLINE_BYTES}")
        self._header.copy_(signature.encode(self._size, inline))
        if inline > 0:
            self._mine[_HEADER_BYTES:_HEADER_BYTES + inline].copy_(payload.reshape(-1).view(torch.uint8))
        self._gloo.allgather([self._everyone], [self._mine]).wait()
        rows = [e[:_HEADER_BYTES].view(torch.int64).tolist() for e in self._everyone]
        _check(rows, signature, self._size)
        if signature.failed or any(r[_INLINE_SLOT] < 0 for r in rows):
            return None
        return [e[_HEADER_BYTES:_HEADER_BYTES + r[_INLINE_SLOT]] for e, r in zip(self._everyone, rows)]


def _check(rows: list[list[int]], signature: Signature, group_size: int) -> None:
    failed = [i for i, r in enumerate(rows) if r[_FAILED_SLOT] == 1]
    if failed:
        if signature.failed:
            return
        ranks = ", ".join(str(i) for i in failed)
        raise CollectiveMismatchError(
            f"{signature.collective} on a neuron process group of {group_size} ranks: rank {ranks} raised an error "
            f"before the data moved (its own output says which); nothing was sent, and every rank raised.")
    problem = ""
    first = rows[0]
    if any(r[0] != first[0] for r in rows):
        problem = "the ranks called different collectives"
    elif any(r[1] != first[1] for r in rows):
        problem = "the dtypes differ"
    elif any(r[2] != first[2] for r in rows):
        problem = "the ranks name different roots"
    elif signature.input_splits or signature.output_splits:
        problem = _splits_problem(rows, group_size) if group_size <= 8 else ""
    elif all(r[3] >= 0 for r in rows) and any(r[3:4 + _MAX_DIMS] != first[3:4 + _MAX_DIMS] for r in rows):
        problem = "the shapes differ"
    if not problem:
        return
    dtypes = {_dtype_code(d): str(d).replace("torch.", "") for d in _ALL_DTYPES}
    names = {_code(n): n for n in _COLLECTIVES} if any(r[0] != first[0] for r in rows) else None
    per_rank = "; ".join(f"rank {i}: {_describe(r, dtypes, names)}" for i, r in enumerate(rows))
    raise CollectiveMismatchError(
        f"{signature.collective} on a neuron process group of {group_size} ranks: {problem} ({per_rank}). "
        f"Every rank must pass tensors of the same dtype and shape (and the same root); nothing was sent, "
        f"and every rank raised this error.")


def _splits_problem(rows: list[list[int]], n: int) -> str:
    base = 5 + _MAX_DIMS
    for i, r in enumerate(rows):
        for j in range(n):
            sent, received = r[base + j], rows[j][base + 8 + i]
            if sent != received:
                return f"rank {i} sends {sent} rows to rank {j}, which expects {received}"
    return ""


_COLLECTIVES = ("all_reduce", "all_reduce_coalesced", "broadcast", "reduce", "all_gather", "all_gather_coalesced",
                "all_gather_into_tensor", "all_gather_into_tensor_coalesced", "reduce_scatter",
                "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced", "all_to_all_single", "all_to_all",
                "gather", "scatter", "barrier")  # names to show for another rank's code
_ALL_DTYPES = [getattr(torch, name) for name in (
    "float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "bool",
    "complex64", "complex128")]
