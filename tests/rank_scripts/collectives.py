"""Every collective of the neuron c10d backend against gloo on CPU copies of its inputs.

Each case is one collective called the same way twice on every rank: on the neuron
process group with neuron tensors, then on a gloo group of the same ranks with CPU
tensors of the same values. The neuron outputs must equal gloo's (exactly, or within
1e-5 for float reductions). Variants: float32, bfloat16, int64; non-contiguous inputs
(transposed) and outputs (rows with a step); views at a storage offset; empty tensors;
tensors too large to travel inline in the ranks' meeting (the gloo data path); a side stream; inputs still pending in adaptive eager; ``async_op=True``. Then subgroups,
and on 4 ranks the two dimensions of a (2, 2) device mesh. One launch runs every case; the rank reports
``{case: {"ok", "problems"}}`` and pytest checks each case (``case_names`` lists them).

Run: ``torchrun --nproc-per-node N collectives.py BARRIER_DIR``.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["case_names"]

VARIANTS = ["float32", "bfloat16", "int64", "strided", "offset", "empty", "large", "stream", "pending", "async"]
_DTYPES = {"bfloat16": torch.bfloat16, "int64": torch.int64}
_SENTINEL = -3  # what outputs hold before a collective writes them
_ROWS, _COLS = 3, 4
_LARGE_COLS = 1536  # 3 rows of float32: 18 KiB, more than travels inline in the ranks' meeting


@dataclass
class Side:
    """One run of a case: the neuron group and neuron tensors, or the gloo reference."""

    name: str  # "neuron" or "gloo"
    group: dist.ProcessGroup
    device: torch.device
    variant: str
    ranks: list[int]  # global ranks of the group, in group-rank order
    futures: list[list[torch.Tensor]] = field(default_factory=list)  # async: each work's future value
    calls: list[list[torch.Tensor]] = field(default_factory=list)  # async: the output tensors of each call
    gaps: list[torch.Tensor] = field(default_factory=list)  # strided, offset: buffer rows outside the outputs

    @property
    def neuron(self) -> bool:
        return self.name == "neuron"

    @property
    def rank(self) -> int:
        return dist.get_rank(self.group)

    @property
    def size(self) -> int:
        return dist.get_world_size(self.group)

    @property
    def dtype(self) -> torch.dtype:
        return _DTYPES.get(self.variant, torch.float32)

    @property
    def cols(self) -> int:
        return {"empty": 0, "large": _LARGE_COLS}.get(self.variant, _COLS)

    def values(self, rows: int, salt: int, low: int = -5, high: int = 6) -> torch.Tensor:
        """Deterministic small values (exact in bfloat16) from this rank and ``salt``, on CPU."""
        n = rows * self.cols
        ints = (torch.arange(n, dtype=torch.int64) * 7 + salt * 13 + dist.get_rank() * 5) % (high - low) + low
        return (ints if self.dtype == torch.int64 else ints.to(self.dtype) / 4).reshape(rows, self.cols)

    def input(self, rows: int, salt: int = 0, **range_: int) -> torch.Tensor:
        """An input of ``rows`` x cols on this side's device, laid out as the variant says."""
        base = self.values(rows, salt, **range_)
        if not self.neuron:
            return base
        if self.variant == "strided":  # a transposed view at an offset: same values, columns contiguous
            holder = torch.zeros(self.cols + 1, rows, dtype=self.dtype, device=self.device)
            holder[1:] = base.t().to(self.device)
            return holder[1:].t()
        if self.variant == "offset":  # contiguous, one row into a larger tensor
            holder = torch.zeros(rows + 1, self.cols, dtype=self.dtype, device=self.device)
            holder[1:] = base.to(self.device)
            return holder[1:]
        if self.variant == "pending":  # computed by ops right here, never read on the host
            import neuron_lab.adaptive_eager as ae

            ae.forget_repeats()
            on_device = base.to(self.device)
            return on_device * 2 - on_device
        return base.to(self.device)

    def output(self, rows: int) -> torch.Tensor:
        """An output of ``rows`` x cols holding the sentinel; strided: every other row of a
        buffer, from its second row; offset: a buffer from its second row."""
        if self.neuron and self.variant in ("strided", "offset"):
            step = 2 if self.variant == "strided" else 1
            buffer = torch.full((step * rows + 1, self.cols), _SENTINEL, dtype=self.dtype, device=self.device)
            self.gaps.append(buffer[0::2] if step == 2 else buffer[:1])
            return buffer[1::step]
        return torch.full((rows, self.cols), _SENTINEL, dtype=self.dtype, device=self.device)

    def call(self, collective: Callable[..., Any], *args: Any, outputs: list[torch.Tensor], **kwargs: Any) -> None:
        """Calls ``collective(*args, group=..., **kwargs)`` (async variant: waits on its work and
        keeps its future's value), on a side stream in the stream variant."""
        if self.variant == "async":
            work = collective(*args, group=self.group, async_op=True, **kwargs)
            work.wait()  # the deprecated *_coalesced functions return a future, not a work
            if self.neuron:  # gloo's works differ: some keep no future
                future = work.get_future() if hasattr(work, "get_future") else work
                self.futures.append(_tensors(future.value()))
                self.calls.append(outputs)
            return
        with self.stream():
            collective(*args, group=self.group, **kwargs)

    @contextmanager
    def stream(self) -> Iterator[None]:
        """The stream variant's side stream on the neuron side (ordered after the current
        stream, and the current one after it), else nothing."""
        if not (self.neuron and self.variant == "stream"):
            yield
            return
        current = torch.neuron.current_stream()
        side = torch.neuron.Stream()
        side.wait_stream(current)
        with torch.neuron.stream(side):
            yield
        current.wait_stream(side)


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    return []


# ---- the collectives: each returns the tensors (or objects) to compare ------------------

Case = Callable[[Side], list[Any]]
EXACT = "exact"
CLOSE = "close"


def _all_reduce(op_name: str) -> Case:
    def case(side: Side) -> list[Any]:
        low, high = (1, 3) if op_name == "PRODUCT" else (-5, 6)  # products of 1/4 and 2/4 stay in range
        x = side.input(_ROWS, low=low, high=high)
        if op_name == "PREMUL_SUM":
            if side.neuron:
                op = dist._make_nccl_premul_sum(0.375)
            else:  # gloo has no PREMUL_SUM: scale, then sum
                x.mul_(0.375)
                op = dist.ReduceOp.SUM
        else:
            op = getattr(dist.ReduceOp, op_name)
        side.call(dist.all_reduce, x, op=op, outputs=[x])
        return [x]

    return case


def _broadcast(side: Side) -> list[Any]:
    x = side.input(_ROWS)
    side.call(dist.broadcast, x, group_src=side.size - 1, outputs=[x])
    return [x]


def _all_gather(side: Side) -> list[Any]:
    outs = [side.output(_ROWS) for _ in range(side.size)]
    side.call(dist.all_gather, outs, side.input(_ROWS), outputs=outs)
    return outs


def _all_gather_into_tensor(side: Side) -> list[Any]:
    out = side.output(_ROWS * side.size)
    side.call(dist.all_gather_into_tensor, out, side.input(_ROWS), outputs=[out])
    return [out]


def _all_gather_into_tensor_stacked(side: Side) -> list[Any]:
    """The output form that stacks the inputs, (world, *input.shape); gloo's reference is
    the concatenation (gloo refuses the stacked form), seen as the stack."""
    out = side.output(_ROWS * side.size)
    x = side.input(_ROWS)
    stacked = out.unflatten(0, (side.size, _ROWS))
    target = stacked if side.neuron else out
    side.call(dist.all_gather_into_tensor, target, x, outputs=[target])
    return [stacked]


def _in_place(collective: str) -> Case:
    """FSDP's in-place forms: all_gather_into_tensor whose input is this rank's chunk of the
    output, reduce_scatter_tensor whose output is this rank's chunk of the input."""

    def case(side: Side) -> list[Any]:
        n, me = side.size, side.rank
        if collective == "all_gather_into_tensor":
            whole = side.output(_ROWS * n)
            whole[me * _ROWS:(me + 1) * _ROWS] = side.input(_ROWS)
            side.call(dist.all_gather_into_tensor, whole, whole[me * _ROWS:(me + 1) * _ROWS], outputs=[whole])
            return [whole]
        whole = side.input(_ROWS * n)
        chunk = whole[me * _ROWS:(me + 1) * _ROWS]
        side.call(dist.reduce_scatter_tensor, chunk, whole, outputs=[chunk])
        return [chunk]

    return case


def _all_gather_coalesced(side: Side) -> list[Any]:
    outs = [[side.output(_ROWS), side.output(1)] for _ in range(side.size)]
    flat = [t for group in outs for t in group]
    side.call(dist.all_gather_coalesced, outs, [side.input(_ROWS, 1), side.input(1, 2)], outputs=flat)
    return flat


def _all_reduce_coalesced(side: Side) -> list[Any]:
    xs = [side.input(_ROWS, 1), side.input(1, 2)]
    side.call(dist.all_reduce_coalesced, xs, outputs=xs)
    return xs


def _coalesced(collective: str, with_device: bool = False) -> Case:
    """``dist._coalescing_manager`` around two collectives of one kind (its fast path:
    one ``*_coalesced`` call of the group); ``with_device``: the neuron side names the
    device, as NCCL-style code does (gloo's reference cannot: it has no coalescing)."""

    def case(side: Side) -> list[Any]:
        if collective == "all_reduce":
            outs = [side.input(_ROWS, 1), side.input(1, 2)]
            calls = [(dist.all_reduce, (outs[0],)), (dist.all_reduce, (outs[1],))]
        elif collective == "all_gather_into_tensor":
            outs = [side.output(_ROWS * side.size), side.output(side.size)]
            calls = [(dist.all_gather_into_tensor, (outs[0], side.input(_ROWS, 1))),
                     (dist.all_gather_into_tensor, (outs[1], side.input(1, 2)))]
        else:
            outs = [side.output(_ROWS), side.output(1)]
            calls = [(dist.reduce_scatter_tensor, (outs[0], side.input(_ROWS * side.size, 1))),
                     (dist.reduce_scatter_tensor, (outs[1], side.input(side.size, 2)))]
        asynchronous = side.variant == "async"
        device = side.device if with_device and side.neuron else None
        with side.stream(), dist._coalescing_manager(side.group, device, async_ops=asynchronous) as manager:
            for function, args in calls:
                function(*args, group=side.group)
        if asynchronous:
            manager.wait()
        return outs

    return case


def _reduce_scatter(side: Side) -> list[Any]:
    out = side.output(_ROWS)
    side.call(dist.reduce_scatter, out, [side.input(_ROWS, salt) for salt in range(side.size)], outputs=[out])
    return [out]


def _reduce_scatter_tensor(op_name: str) -> Case:
    def case(side: Side) -> list[Any]:
        out = side.output(_ROWS)
        x = side.input(_ROWS * side.size)
        if op_name == "PREMUL_SUM":
            op = dist._make_nccl_premul_sum(0.625) if side.neuron else dist.ReduceOp.SUM
            if not side.neuron:
                x.mul_(0.625)
        else:
            op = getattr(dist.ReduceOp, op_name)
        side.call(dist.reduce_scatter_tensor, out, x, op=op, outputs=[out])
        return [out]

    return case


def _splits(size: int, sender: int, receiver: int) -> int:
    """Rows rank ``sender`` sends to ``receiver`` in the uneven all_to_all (zero included)."""
    return (sender + 2 * receiver) % 3


def _all_to_all_single(uneven: bool) -> Case:
    def case(side: Side) -> list[Any]:
        n, me = side.size, side.rank
        if uneven:
            sends = [_splits(n, me, j) for j in range(n)]
            receives = [_splits(n, i, me) for i in range(n)]
            out, x = side.output(sum(receives)), side.input(sum(sends))
            side.call(dist.all_to_all_single, out, x, output_split_sizes=receives, input_split_sizes=sends,
                      outputs=[out])
        else:
            out, x = side.output(2 * n), side.input(2 * n)
            side.call(dist.all_to_all_single, out, x, outputs=[out])
        return [out]

    return case


def _all_to_all(uneven: bool) -> Case:
    """The list all_to_all; uneven (some tensors empty), gloo's reference is its
    all_to_all_single of the same rows, as gloo's list all_to_all needs equal sizes."""

    def case(side: Side) -> list[Any]:
        n, me = side.size, side.rank
        receives = [_splits(n, i, me) if uneven else 2 for i in range(n)]
        sends = [_splits(n, me, j) if uneven else 2 for j in range(n)]
        ins = [side.input(rows, salt=j) for j, rows in enumerate(sends)]
        if uneven and not side.neuron:
            out = side.output(sum(receives))
            side.call(dist.all_to_all_single, out, torch.cat(ins), output_split_sizes=receives,
                      input_split_sizes=sends, outputs=[out])
            return list(out.split(receives))
        outs = [side.output(rows) for rows in receives]
        side.call(dist.all_to_all, outs, ins, outputs=outs)
        return outs

    return case


def _gather(side: Side) -> list[Any]:
    root = side.size - 1
    outs = [side.output(_ROWS) for _ in range(side.size)] if side.rank == root else None
    side.call(dist.gather, side.input(_ROWS), outs, group_dst=root, outputs=outs or [])
    return outs or []


def _scatter(side: Side) -> list[Any]:
    root = side.size - 1
    out = side.output(_ROWS)
    ins = [side.input(_ROWS, salt) for salt in range(side.size)] if side.rank == root else None
    side.call(dist.scatter, out, ins, group_src=root, outputs=[out])
    return [out]


def _reduce(op_name: str) -> Case:
    def case(side: Side) -> list[Any]:
        root = 1 % side.size
        x = side.input(_ROWS)
        side.call(dist.reduce, x, group_dst=root, op=getattr(dist.ReduceOp, op_name), outputs=[x])
        return [x] if side.rank == root else []  # the other ranks' tensors are unspecified

    return case


def _send_recv(side: Side) -> list[Any]:
    """A ring with blocking send and recv: even ranks send first, odd ranks receive first."""
    n, me = side.size, side.rank
    out, x = side.output(_ROWS), side.input(_ROWS)
    nxt, prev = side.ranks[(me + 1) % n], side.ranks[(me - 1) % n]
    with side.stream():
        for step in ("send", "recv") if me % 2 == 0 else ("recv", "send"):
            if step == "send":
                dist.send(x, nxt, group=side.group)
            else:
                dist.recv(out, prev, group=side.group)
    return [out]


def _recv_any_source(side: Side) -> list[Any]:
    """The ring of ``_send_recv`` with receives that name no source: each rank hears from
    one rank only, so the source must be the previous one."""
    n, me = side.size, side.rank
    out, x = side.output(_ROWS), side.input(_ROWS)
    nxt, prev = side.ranks[(me + 1) % n], side.ranks[(me - 1) % n]
    source = None
    with side.stream():
        for step in ("send", "recv") if me % 2 == 0 else ("recv", "send"):
            if step == "send":
                dist.send(x, nxt, group=side.group)
            else:
                source = dist.recv(out, group=side.group)
    return [out, source == prev]


def _coalesced_point_to_point(side: Side) -> list[Any]:
    """isend/irecv of a ring inside ``_coalescing_manager(group, device)`` (neuron side; the
    gloo reference posts the same pair and waits for it)."""
    n, me = side.size, side.rank
    out, x = side.output(_ROWS), side.input(_ROWS)
    nxt, prev = side.ranks[(me + 1) % n], side.ranks[(me - 1) % n]
    if not side.neuron:
        works = [dist.isend(x, nxt, group=side.group), dist.irecv(out, prev, group=side.group)]
        for work in works:
            work.wait()
        return [out]
    with side.stream(), dist._coalescing_manager(side.group, side.device, async_ops=side.variant == "async") as cm:
        dist.isend(x, nxt, group=side.group)
        dist.irecv(out, prev, group=side.group)
    if side.variant == "async":
        cm.wait()
    return [out]


def _batch_isend_irecv(side: Side) -> list[Any]:
    n, me = side.size, side.rank
    out, x = side.output(_ROWS), side.input(_ROWS)
    ops = [dist.P2POp(dist.isend, x, side.ranks[(me + 1) % n], side.group),
           dist.P2POp(dist.irecv, out, side.ranks[(me - 1) % n], side.group)]
    with side.stream():
        works = dist.batch_isend_irecv(ops)
        for work in works:
            work.wait()
    if side.variant == "async" and side.neuron:  # gloo's sends keep no future
        side.futures.append([t for w in works for t in _tensors(w.get_future().value())])
        side.calls.append([x, out])
    return [out]


def _barrier(side: Side) -> list[Any]:
    """Each rank leaves a mark, then waits at the barrier: after it every rank's mark exists."""
    marks = Path(sys.argv[1])
    (marks / f"{side.name}-{dist.get_rank()}-{_barrier_round(side)}").touch()
    side.call(dist.barrier, outputs=[])
    seen = [(marks / f"{side.name}-{r}-{_barrier_round(side)}").exists() for r in side.ranks]
    return [seen]


def _barrier_round(side: Side) -> str:
    return f"{side.variant}-{'-'.join(map(str, side.ranks))}"


def _objects(side: Side) -> list[Any]:
    """The object collectives (objects carry a CPU tensor and a neuron tensor still pending
    in adaptive eager; their values are compared)."""
    me, n = side.rank, side.size
    mine = {"rank": dist.get_rank(), "text": "x" * (me + 1), "tensor": torch.arange(me + 2),
            "on_device": torch.arange(3).to(side.device) * (me + 1)}
    gathered: list[Any] = [None] * n
    dist.all_gather_object(gathered, mine, group=side.group)
    broadcast = [mine, me] if me == n - 1 else [None, None]
    dist.broadcast_object_list(broadcast, group_src=n - 1, group=side.group)
    gathered_at_root: list[Any] | None = [None] * n if me == 0 else None
    dist.gather_object(mine, gathered_at_root, group_dst=0, group=side.group)
    scattered: list[Any] = [None]
    dist.scatter_object_list(scattered, [{"for": r, "tensor": torch.full((2,), r)} for r in range(n)]
                             if me == 0 else None, group_src=0, group=side.group)
    device_type = side.device.type
    arrived_on_device = all(o["on_device"].device.type == device_type for o in gathered) and \
        broadcast[0]["on_device"].device.type == device_type
    return [_plain(gathered), _plain(broadcast), _plain(gathered_at_root), _plain(scattered), arrived_on_device]


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", value.tolist())
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


# name -> (case, comparison, variants)
_ALL_VARIANTS = VARIANTS
_NO_INT = [v for v in VARIANTS if v != "int64"]
_IN_PLACE_VARIANTS = ["float32", "bfloat16", "int64", "empty", "large", "stream", "pending", "async"]  # views of one tensor
_SAMPLE_VARIANTS = ["float32", "int64", "large", "pending", "async"]
COLLECTIVES: dict[str, tuple[Case, str, list[str]]] = {
    **{f"all_reduce_{op.lower()}": (_all_reduce(op), CLOSE, _ALL_VARIANTS) for op in ("SUM", "MIN", "MAX", "PRODUCT")},
    "all_reduce_avg": (_all_reduce("AVG"), CLOSE, _NO_INT),  # AVG of integers: gloo refuses too
    "all_reduce_premul_sum": (_all_reduce("PREMUL_SUM"), CLOSE, _NO_INT),  # a float factor
    "broadcast": (_broadcast, EXACT, _ALL_VARIANTS),
    "all_gather": (_all_gather, EXACT, _ALL_VARIANTS),
    "all_gather_into_tensor": (_all_gather_into_tensor, EXACT, _ALL_VARIANTS),
    "all_gather_into_tensor_stacked": (_all_gather_into_tensor_stacked, EXACT, _ALL_VARIANTS),
    "all_gather_into_tensor_in_place": (_in_place("all_gather_into_tensor"), EXACT, _IN_PLACE_VARIANTS),
    "reduce_scatter_tensor_in_place": (_in_place("reduce_scatter_tensor"), CLOSE, _IN_PLACE_VARIANTS),
    "all_gather_coalesced": (_all_gather_coalesced, EXACT, _ALL_VARIANTS),
    "all_reduce_coalesced": (_all_reduce_coalesced, CLOSE, _ALL_VARIANTS),
    "coalescing_manager_all_reduce": (_coalesced("all_reduce"), CLOSE, _ALL_VARIANTS),
    "coalescing_manager_all_gather_into_tensor": (_coalesced("all_gather_into_tensor"), EXACT, _ALL_VARIANTS),
    "coalescing_manager_reduce_scatter_tensor": (_coalesced("reduce_scatter_tensor"), CLOSE, _ALL_VARIANTS),
    **{f"coalescing_manager_device_{c}": (_coalesced(c, with_device=True), how, _SAMPLE_VARIANTS)
       for c, how in (("all_reduce", CLOSE), ("all_gather_into_tensor", EXACT), ("reduce_scatter_tensor", CLOSE))},
    "coalescing_manager_device_send_recv": (_coalesced_point_to_point, EXACT, _SAMPLE_VARIANTS),
    "reduce_scatter": (_reduce_scatter, CLOSE, _ALL_VARIANTS),
    **{f"reduce_scatter_tensor_{op.lower()}": (_reduce_scatter_tensor(op), CLOSE, _ALL_VARIANTS)
       for op in ("SUM", "MAX")},
    "reduce_scatter_tensor_avg": (_reduce_scatter_tensor("AVG"), CLOSE, _NO_INT),
    "reduce_scatter_tensor_premul_sum": (_reduce_scatter_tensor("PREMUL_SUM"), CLOSE, _NO_INT),
    "all_to_all_single": (_all_to_all_single(False), EXACT, _ALL_VARIANTS),
    "all_to_all_single_uneven": (_all_to_all_single(True), EXACT, _ALL_VARIANTS),
    "all_to_all": (_all_to_all(False), EXACT, _ALL_VARIANTS),
    "all_to_all_uneven": (_all_to_all(True), EXACT, _ALL_VARIANTS),
    "gather": (_gather, EXACT, _ALL_VARIANTS),
    "scatter": (_scatter, EXACT, _ALL_VARIANTS),
    "reduce_sum": (_reduce("SUM"), CLOSE, _ALL_VARIANTS),
    "reduce_max": (_reduce("MAX"), CLOSE, ["float32", "int64", "strided", "large", "async"]),
    "barrier": (_barrier, EXACT, ["float32", "stream", "async"]),
    "send_recv": (_send_recv, EXACT, [v for v in VARIANTS if v != "async"]),  # blocking calls
    "recv_any_source": (_recv_any_source, EXACT, ["float32", "int64", "strided", "large", "pending"]),
    "batch_isend_irecv": (_batch_isend_irecv, EXACT, _ALL_VARIANTS),
    "objects": (_objects, EXACT, ["float32"]),
}

# What subgroups and device mesh dimensions run: small (inline in the meeting) and large.
GROUP_SAMPLE = ["all_reduce_sum", "all_reduce_premul_sum", "broadcast", "all_gather_into_tensor",
                "reduce_scatter_tensor_sum", "all_to_all_single_uneven", "gather", "scatter", "reduce_sum",
                "all_gather_into_tensor_in_place", "batch_isend_irecv", "send_recv", "recv_any_source", "barrier",
                "objects"]
_POINT_TO_POINT = ("batch_isend_irecv", "send_recv", "recv_any_source")


def group_cases(label: str) -> dict[str, tuple[str, str]]:
    """The cases a subgroup (or mesh dimension) ``label`` runs: name -> (collective, variant).
    A group of one has no peer to send to."""
    cases = {}
    for collective in GROUP_SAMPLE:
        if label == "single" and collective in _POINT_TO_POINT:
            continue
        for variant in ("float32", "large"):
            if variant in COLLECTIVES[collective][2]:
                cases[f"{collective}[{label}]" if variant == "float32" else f"{collective}[{label} {variant}]"] = \
                    (collective, variant)
    return cases


def subgroups(world: int) -> dict[str, list[list[int]]]:
    """Named partitions of the world: each rank is in at most one group of each."""
    if world == 2:
        return {"pair": [[0, 1]], "single": [[1]]}
    return {"evens_odds": [[0, 2], [1, 3]], "last_three": [[1, 2, 3]]}


def case_names(world: int) -> list[str]:
    """Every case this script reports on ``world`` ranks."""
    names = [f"{c}[{v}]" for c, (_, _, variants) in COLLECTIVES.items() for v in variants]
    for label in subgroups(world):
        names += list(group_cases(label))
    if world == 4:
        names += [name for dim in ("dp", "tp") for name in group_cases(f"mesh_{dim}")]
    return names


# ---- running and comparing ---------------------------------------------------------------

def _compare(neuron: list[Any], gloo: list[Any], how: str, dtype: torch.dtype) -> list[str]:
    problems = []
    if len(neuron) != len(gloo):
        return [f"{len(neuron)} outputs on neuron, {len(gloo)} on gloo"]
    for i, (a, b) in enumerate(zip(neuron, gloo, strict=True)):
        if not isinstance(b, torch.Tensor):
            if a != b:
                problems.append(f"output {i}: neuron {a!r} != gloo {b!r}")
            continue
        if a.device.type != "neuron" or a.dtype != b.dtype or a.shape != b.shape:
            problems.append(f"output {i}: neuron {a.device} {a.dtype} {tuple(a.shape)} vs gloo {b.dtype} "
                            f"{tuple(b.shape)}")
            continue
        got = a.cpu()
        exact = how == EXACT or not b.dtype.is_floating_point
        same = torch.equal(got, b) if exact else torch.allclose(got.float(), b.float(), rtol=1e-5, atol=1e-5)
        if not same:
            problems.append(f"output {i}: neuron {_head(got)} != gloo {_head(b)}")
    return problems


def _head(t: torch.Tensor, count: int = 24) -> str:
    values = t.reshape(-1)[:count].tolist()
    return f"{tuple(t.shape)} {values}{' ...' if t.numel() > count else ''}"


def _side_checks(side: Side) -> list[str]:
    """What a variant promises beyond the values: strided gaps untouched, futures holding
    the output tensors."""
    problems = []
    for gap in side.gaps:
        if not torch.equal(gap.cpu(), torch.full(gap.shape, _SENTINEL, dtype=gap.dtype)):
            problems.append(f"a collective wrote outside its output rows: {_head(gap.cpu())}")
    for value, expected in zip(side.futures, side.calls, strict=True):
        if len(value) != len(expected) or any(
                v.data_ptr() != e.data_ptr() or v.shape != e.shape for v, e in zip(value, expected, strict=False)):
            problems.append(f"the work's future holds {[tuple(v.shape) for v in value]}, "
                            f"not the outputs {[tuple(e.shape) for e in expected]}")
    if side.variant == "async" and len(side.futures) != len(side.calls):
        problems.append("an async call kept no future")
    return problems


def run_case(collective: str, variant: str, neuron_group: dist.ProcessGroup, gloo_group: dist.ProcessGroup,
             ranks: list[int], device: torch.device) -> dict[str, Any]:
    """One case on both groups; ``{"ok": bool, "problems": [...]}``."""
    case, how, _ = COLLECTIVES[collective]
    import neuron_lab.adaptive_eager as ae

    neuron = Side("neuron", neuron_group, device, variant, ranks)
    gloo = Side("gloo", gloo_group, torch.device("cpu"), variant, ranks)
    problems: list[str] = []
    try:
        flushes_before = ae.counters()["flushes"].get("collective", 0)
        got = case(neuron)
        flushed = ae.counters()["flushes"].get("collective", 0) - flushes_before
        expected = case(gloo)
        problems += _compare(got, expected, how, gloo.dtype)
        problems += _side_checks(neuron)
        if variant == "pending" and flushed < 1:
            problems.append("the inputs were not pending: the collective flushed nothing")
        if variant == "async" and not neuron.futures and collective not in ("objects",) \
                and not collective.startswith("coalescing_manager") and collective != "send_recv":
            problems.append("no future was checked")
    except Exception as e:  # noqa: BLE001 - reported per case; the ranks stay in step
        problems.append(f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}")
    return {"ok": not problems, "problems": problems}


def _gloo_groups(partition: list[list[int]]) -> tuple[dist.ProcessGroup | None, list[int]]:
    """Gloo groups of a partition (every rank creates every group); this rank's and its ranks."""
    mine, my_ranks = None, []
    for ranks in partition:
        group = dist.new_group(ranks=ranks, backend="gloo")
        if dist.get_rank() in ranks:
            mine, my_ranks = group, ranks
    return mine, my_ranks


def main() -> None:
    from ranks import report

    device = torch.device("neuron", int(os.environ["LOCAL_RANK"]) % torch.neuron.device_count())
    torch.neuron.set_device(device)
    dist.init_process_group("neuron")
    world = dist.get_world_size()
    world_ranks = list(range(world))
    reference = dist.new_group(backend="gloo")
    results: dict[str, Any] = {}
    for collective, (_, _, variants) in COLLECTIVES.items():
        for variant in variants:
            results[f"{collective}[{variant}]"] = run_case(collective, variant, dist.group.WORLD, reference,
                                                           world_ranks, device)
    for label, partition in subgroups(world).items():
        neuron_mine, ranks = None, []
        for members in partition:
            group = dist.new_group(ranks=members)
            if dist.get_rank() in members:
                neuron_mine, ranks = group, members
        gloo_mine, _ = _gloo_groups(partition)
        for name, (collective, variant) in group_cases(label).items():
            if neuron_mine is None:  # not a member: nothing to run
                results[name] = {"ok": True, "problems": [], "member": False}
                continue
            results[name] = run_case(collective, variant, neuron_mine, gloo_mine, ranks, device)
    if world == 4:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("neuron", (2, 2), mesh_dim_names=("dp", "tp"))
        layout = mesh.mesh
        partitions = {"dp": [layout[:, j].tolist() for j in range(2)], "tp": [layout[i, :].tolist() for i in range(2)]}
        for dim, partition in partitions.items():
            group = mesh.get_group(dim)
            gloo_mine, ranks = _gloo_groups(partition)
            backend = dist.get_backend(group)
            for name, (collective, variant) in group_cases(f"mesh_{dim}").items():
                result = run_case(collective, variant, group, gloo_mine, ranks, device)
                if backend != "neuron":
                    result = {"ok": False, "problems": [f"the mesh group's backend is {backend}"]}
                results[name] = result
    report({"cases": results, "backend": dist.get_backend()})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
