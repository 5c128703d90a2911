"""The ranks agree on a collective before its data moves.

Gloo terminates the process when ranks pass tensors of different sizes to the same
collective. A notebook must never lose its kernel to a typo in a shape, so before each
collective the ranks exchange a small signature (which collective, dtype, shape, root,
split sizes) and every rank raises the same error, naming each rank's tensors, when
they differ. The exchange is one allgather of 256 bytes per collective.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["CollectiveMismatchError", "Signature", "agree"]

_WIDTH = 32  # int64 slots per rank
_MAX_DIMS = 8


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

    def encode(self, group_size: int) -> torch.Tensor:
        slots = [_code(self.collective), _dtype_code(self.dtype), self.root]
        shape = self.shape if self.shape is not None else ()
        slots += [-1 if self.shape is None else len(shape)] + _padded(shape, _MAX_DIMS)
        if group_size <= 8 and (self.input_splits or self.output_splits):
            slots += [1] + _padded(self.input_splits, 8) + _padded(self.output_splits, 8)
        return torch.tensor(_padded(slots, _WIDTH - 1) + [int(self.failed)], dtype=torch.int64)


def _padded(values: Sequence[int], width: int) -> list[int]:
    values = [int(v) for v in values]
    if len(values) > width:  # beyond the slots: a checksum still tells ranks apart
        values = values[: width - 1] + [hash(tuple(values)) & 0x7FFFFFFFFFFFFFFF]
    return values + [0] * (width - len(values))


_COLLECTIVE_CODES: dict[str, int] = {}
_DTYPE_CODES: dict[torch.dtype, int] = {}


def _code(name: str) -> int:
    return _COLLECTIVE_CODES.setdefault(name, sum(ord(c) * 31**i for i, c in enumerate(name)) % (1 << 40))


def _dtype_code(dtype: torch.dtype | None) -> int:
    if dtype is None:
        return -1
    return _DTYPE_CODES.setdefault(dtype, sum(ord(c) * 131**i for i, c in enumerate(str(dtype))) % (1 << 40))


def _describe(slots: list[int], dtypes: dict[int, str]) -> str:
    ndim = slots[3]
    dtype = dtypes.get(slots[1], "?")
    text = f"{dtype}[{', '.join(str(d) for d in slots[4:4 + ndim])}]" if ndim >= 0 else f"{dtype}"
    if slots[2] >= 0:
        text += f" root {slots[2]}"
    if slots[4 + _MAX_DIMS] == 1:
        base = 5 + _MAX_DIMS
        text += f" splits in {slots[base:base + 8]} out {slots[base + 8:base + 16]}"
    return text


def agree(gloo: dist.ProcessGroup, signature: Signature, rank: int, group_size: int) -> None:
    """Raises ``CollectiveMismatchError`` on every rank when the ranks' signatures differ
    (or their all_to_all splits do not pair up), or on the other ranks when a rank failed
    before the data could move (``signature.failed``: that rank raises its own error)."""
    mine = signature.encode(group_size)
    everyone = [torch.empty_like(mine) for _ in range(group_size)]
    gloo.allgather([everyone], [mine]).wait()
    rows = [e.tolist() for e in everyone]
    failed = [i for i, r in enumerate(rows) if r[-1] == 1]
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
    per_rank = "; ".join(f"rank {i}: {_describe(r, dtypes)}" for i, r in enumerate(rows))
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


_ALL_DTYPES = [getattr(torch, name) for name in (
    "float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "bool",
    "complex64", "complex128")]
