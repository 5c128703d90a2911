"""``NeuronProcessGroup``: the c10d process group of the ``neuron`` backend.

Transport: each rank's NeuronCores are emulated in its own process, in host memory, so
a collective moves bytes between processes on one machine. It runs PyTorch's gloo over
CPU aliases of the device memory (no copy in or out for contiguous tensors): gloo is
PyTorch's own, tested transport for CPU memory, with the reduce ops, timeouts and
peer-failure detection that the APIs above expect; writing a new transport would only
re-earn those. What this class adds is the device's side of a collective:

- it is one launch of the current stream and a fusion boundary: the runtime launches
  what is buffered and waits for the launches that use the tensors (``Reason.COLLECTIVE``),
  then the data moves, then the outputs count as computed;
- non-contiguous tensors go through a contiguous host copy, PREMUL_SUM scales a copy;
- before any data moves the ranks agree on the collective (``agreement.py``): a shape
  or dtype mismatch raises on every rank instead of terminating the processes in gloo;
  a send and its receive swap their dtypes and sizes first (``point_to_point.py``);
- each collective leaves a ``CollectiveRecord`` (bytes moved, time) for the profiler.

Collectives run on the calling thread and return completed work (their future holds
the output tensors); point-to-point sends and receives are asynchronous, as pipeline
schedules need (``batch_isend_irecv`` posts every send and receive before waiting).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from neuron_lab.device.host_kernels import (InlineLaunch, host_alias, host_allocations_device, note_written,
                                            prepare_host_access)
from neuron_lab.device.trace import Reason, now_ns
from neuron_lab.distributed.agreement import INLINE_BYTES, CollectiveMismatchError, Meeting, Signature
from neuron_lab.distributed.held_tensors import HoldingGloo
from neuron_lab.distributed.point_to_point import MAX_TAG, Transfer, TransferHeader, submit
from neuron_lab.distributed.records import CollectiveRecord, record_collective

__all__ = ["NeuronProcessGroup"]

_DEVICE_TYPE = "neuron"
_GLOO_REDUCE_OPS = {dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MIN, dist.ReduceOp.MAX,
                    dist.ReduceOp.PRODUCT}


class _Staged:
    """The host side of one collective's tensors: a CPU alias of each neuron tensor's
    memory, or a contiguous copy of it when gloo cannot use the alias (non-contiguous),
    written back after the data moved."""

    def __init__(self, tensor: torch.Tensor, *, read: bool, scale: float | None = None) -> None:
        self.tensor = tensor
        on_device = tensor.device.type == _DEVICE_TYPE
        alias = host_alias(tensor) if on_device else tensor
        self.write_back_to: torch.Tensor | None = None
        if alias.is_contiguous() and scale is None:
            self.host = alias
        else:
            self.host = (alias * scale if scale is not None else alias.contiguous()) if read \
                else torch.empty(alias.shape, dtype=alias.dtype)
            self.write_back_to = alias

    def finish(self) -> None:
        if self.write_back_to is not None:
            self.write_back_to.copy_(self.host)


@dataclass
class _Plan:
    """One collective: its name, the tensors it reads and writes, and how to run it on gloo."""

    name: str
    reads: list[torch.Tensor]
    writes: list[torch.Tensor]
    bytes_moved: int
    bus_bytes: int
    signature: Signature
    outputs: Any  # what the work's future holds


def _together(collective: str) -> Callable[[Callable[..., dist.Work]], Callable[..., dist.Work]]:
    """Makes a collective fail on every rank when it fails on one before its data moved:
    an error raised while checking or preparing (a CPU tensor, a wrong output size, an
    error of the device) still takes part in the ranks' agreement, with a failure flag,
    so that the other ranks raise instead of waiting for this one until the timeout."""

    def wrap(method: Callable[..., dist.Work]) -> Callable[..., dist.Work]:
        @functools.wraps(method)
        def run(self: "NeuronProcessGroup", *args: Any, **kwargs: Any) -> dist.Work:
            self._agreed = False
            try:
                return method(self, *args, **kwargs)
            except Exception:
                if not self._agreed:
                    self._agreed = True
                    self._meet(collective, Signature(collective, None, None, failed=True))
                raise

        return run

    return wrap


_LocalFinish = Callable[[list[torch.Tensor], list[torch.Tensor]], None]
"""Finishes a small collective from every rank's input (rank order) into the host outputs."""


def _reduce_locally(op: dist.ReduceOp, group_size: int) -> _LocalFinish:
    """A reduction of every rank's input in rank order (the same bits on every rank)."""

    kind = _op_type(op)
    if kind not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN,
                    dist.ReduceOp.MAX):
        raise ValueError(f"no local reduction for {kind}")

    def finish(rows: list[torch.Tensor], outputs: list[torch.Tensor]) -> None:
        total = rows[0].clone()
        for row in rows[1:]:
            if kind in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
                total.add_(row)
            elif kind == dist.ReduceOp.PRODUCT:
                total.mul_(row)
            elif kind == dist.ReduceOp.MIN:
                torch.minimum(total, row, out=total)
            else:
                torch.maximum(total, row, out=total)
        if kind == dist.ReduceOp.AVG:
            total.div_(group_size)
        outputs[0].copy_(total)

    return finish


def _reduces_locally(op: dist.ReduceOp, dtype: torch.dtype) -> bool:
    """Whether a small reduction may finish locally with gloo's results: real numbers only
    (gloo's bool and complex rules are its own), AVG of floating point only."""
    if dtype == torch.bool or dtype.is_complex:
        return False
    return _op_type(op) != dist.ReduceOp.AVG or dtype.is_floating_point


def _op_type(op: Any) -> Any:
    """The ``ReduceOp.RedOpType`` of a ``ReduceOp`` object or of a RedOpType."""
    return op.op if hasattr(op, "op") else op


def _nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


_incarnations = 0  # default process groups this process made (init_process_group calls)


def _incarnation() -> int:
    """Which ``init_process_group`` of this process a new group belongs to. c10d names
    groups by a counter that ``destroy_process_group`` resets, over a store that outlives
    them (torchrun's): after a destroy, the next group "0" would read the dead one's gloo
    addresses from the store and fail to connect. Every rank makes every default group,
    so this count agrees across ranks and keeps the incarnations' keys apart."""
    global _incarnations
    if not dist.is_initialized():  # making the default group
        _incarnations += 1
    return _incarnations


class NeuronProcessGroup(dist.ProcessGroup):
    """A process group of ``neuron`` tensors (and CPU tensors when the group was created as
    ``"cpu:gloo,neuron:neuron"``), over an inner gloo group on the loopback interface."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        self._rank, self._size, self._timeout = rank, size, timeout
        options = dist.ProcessGroupGloo._Options()
        options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        options._timeout = timeout
        inner_store = dist.PrefixStore(f"neuron-gloo/{_incarnation()}/", store)
        gloo = dist.ProcessGroupGloo(inner_store, rank, size, options)
        self._gloo = HoldingGloo(gloo)  # keeps the tensors of each call until gloo's threads drop them
        # Object collectives and DeviceMesh ask the group which devices it serves.
        self._meeting = Meeting(self._gloo, rank, size)
        self._register_backend(torch.device(_DEVICE_TYPE), dist.ProcessGroup.BackendType.CUSTOM, gloo)
        self._name = ""
        self._desc = ""
        self._serves_cpu: bool | None = None  # decided at the first CPU tensor
        self._agreed = False  # whether the current collective's ranks have met (see _together)
        self._coalesced_point_to_point: list[dist.Work] | None = None  # inside _coalescing_manager(device=)

    # ---- identity (functional collectives and DeviceMesh look groups up by name) ----
    def getBackendName(self) -> str:  # noqa: N802 - c10d's name
        return _DEVICE_TYPE

    def getGroupName(self) -> str:  # noqa: N802
        return self._name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._name = name

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._desc = desc

    def __repr__(self) -> str:
        return f"NeuronProcessGroup(rank={self._rank}, size={self._size}, name={self._name!r})"

    # ---- checks --------------------------------------------------------------------
    def _check(self, collective: str, tensors: Sequence[torch.Tensor]) -> None:
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{collective} on a neuron process group got {type(t).__name__}, not a tensor")
            kind = t.device.type
            if kind == _DEVICE_TYPE:
                continue
            if kind == "cpu" and (self._cpu_allowed() or host_allocations_device() is not None):
                # A graph compiled for the host (torch.compile's default on neuron) runs
                # as one launch over device memory: its CPU tensors are the device's.
                continue
            hint = ("create the group with backend='cpu:gloo,neuron:neuron' to run CPU collectives over gloo, "
                    "or move the tensor with tensor.to('neuron')") if kind == "cpu" else "move it with tensor.to('neuron')"
            raise ValueError(f"{collective} on a neuron process group got a {kind} tensor "
                             f"({tuple(t.shape)}, {t.dtype}): this group carries neuron tensors; {hint}")

    def _cpu_allowed(self) -> bool:
        if self._serves_cpu is None:
            config = dist.distributed_c10d._world.pg_backend_config.get(self, "")
            self._serves_cpu = "cpu:" in str(config)
        return self._serves_cpu

    # ---- running one collective --------------------------------------------------
    def _meet(self, collective: str, signature: Signature,
              payload: torch.Tensor | None = None) -> list[torch.Tensor] | None:
        """The ranks' meeting (``agreement.Meeting.meet``). It is a collective's first
        exchange, so a peer that exited or timed out shows here: as the collective's
        transport error, naming it and the group, not gloo's bare message."""
        try:
            return self._meeting.meet(signature, payload)
        except CollectiveMismatchError:
            raise
        except RuntimeError as e:
            raise _transport_error(collective, self, e) from e

    def _run(self, plan: _Plan, issue: Callable[[list[torch.Tensor], list[torch.Tensor]], dist.Work],
             scale: float | None = None, local: _LocalFinish | None = None) -> dist.Work:
        """Runs one collective as one launch of the current stream: the device's side
        (see the module docstring), the ranks' meeting, then ``issue(host_reads,
        host_writes)`` on gloo; or, when ``local`` is given and the first input fits in the
        meeting (``agreement.INLINE_BYTES``), ``local(every rank's input, host_writes)``."""
        start = now_ns()
        device_tensors = [t for t in plan.reads + plan.writes if t.device.type == _DEVICE_TYPE]
        if device_tensors:  # may raise an error of earlier device work: before the meeting
            prepare_host_access(plan.reads, plan.writes, plan.name, Reason.COLLECTIVE)
        ready = now_ns()
        staged: dict[int, _Staged] = {}

        def stage(t: torch.Tensor, read: bool) -> torch.Tensor:
            key = id(t)
            if key not in staged:
                staged[key] = _Staged(t, read=read, scale=scale if read else None)
            return staged[key].host

        device = device_tensors[0].device.index if device_tensors else -1
        launch = InlineLaunch(device, f"c10d::{plan.name}") if device >= 0 else None
        if launch is not None:
            launch.__enter__()
        try:
            host_reads = [stage(t, True) for t in plan.reads]
            host_writes = [stage(t, False) for t in plan.writes]
            payload = host_reads[0] if local is not None and _nbytes(host_reads[:1]) <= INLINE_BYTES else None
            self._agreed = True
            rows = self._meet(plan.name, plan.signature, payload)
            if rows is not None and payload is not None:
                local([row.view(payload.dtype).view(payload.shape) for row in rows], host_writes)
            else:
                try:
                    issue(host_reads, host_writes).wait()
                except RuntimeError as e:
                    raise _transport_error(plan.name, self, e) from e
            for s in staged.values():
                s.finish()
        finally:
            if launch is not None:
                launch.__exit__(None, None, None)
        if device_tensors:
            note_written([t for t in plan.writes if t.device.type == _DEVICE_TYPE])
        self._record(plan, start, ready, device)
        self._agreed = False  # a later failure of the same call (coalesced lists) must agree again
        return _completed(plan.outputs)

    def _plan(self, name: str, reads: list[torch.Tensor], writes: list[torch.Tensor], *, bus: float | None,
              outputs: Any, root: int = -1, total: int | None = None,
              splits: tuple[list[int], list[int]] | None = None, signed: list[torch.Tensor] | None = None) -> _Plan:
        """A collective's plan; ``signed`` are the tensors whose dtype and shape every rank
        must share (the inputs unless said), ``bus`` the ring factor of its bus bytes (None:
        the bytes once, as for a broadcast)."""
        signed = reads if signed is None else signed
        self._check(name, reads + writes)
        dtype = signed[0].dtype if signed else None
        if len(signed) == 1:
            shape: tuple[int, ...] = tuple(signed[0].shape)
        else:  # lists: their count and each one's size
            shape = (len(signed), *[t.numel() for t in signed])
        if splits is not None:
            signature = Signature(name, dtype, None, root, tuple(splits[0]), tuple(splits[1]))
        else:
            signature = Signature(name, dtype, shape, root)
        moved = total if total is not None else _nbytes(reads)
        bus_bytes = moved if bus is None else self._ring(moved, bus)
        return _Plan(name, reads, writes, moved, bus_bytes, signature, outputs)

    def _check_outputs(self, name: str, singles: list[torch.Tensor], per_rank: list[torch.Tensor],
                       expected: int) -> None:
        """``per_rank`` holds one tensor per rank for each tensor of ``singles``, each like it."""
        if len(per_rank) != expected:
            raise ValueError(f"{name}: expected {self._size} tensors (one per rank) for each of the {len(singles)} "
                             f"tensor(s), got {len(per_rank)}")
        for i, t in enumerate(per_rank):
            like = singles[i // self._size]
            if t.shape != like.shape or t.dtype != like.dtype:
                raise ValueError(f"{name}: tensor {i} of the list is {tuple(t.shape)} {t.dtype}, but it must match "
                                 f"{tuple(like.shape)} {like.dtype}")

    def _record(self, plan: _Plan, start: int, ready: int, device: int) -> None:
        record_collective(CollectiveRecord(
            name=plan.name, group=self._name, group_size=self._size, rank=self._rank, device=device,
            bytes_moved=plan.bytes_moved, bus_bytes=plan.bus_bytes, start_ns=start, end_ns=now_ns(),
            wait_ns=ready - start))

    def _ring(self, nbytes: int, factor: float) -> int:
        return int(nbytes * factor * (self._size - 1) / self._size) if self._size > 1 else 0

    def _reduce_op(self, collective: str, op: dist.ReduceOp) -> tuple[dist.ReduceOp, float | None]:
        """The gloo op to run and the factor to scale inputs by first (PREMUL_SUM)."""
        kind = _op_type(op)
        if kind == dist.ReduceOp.PREMUL_SUM:
            factor = op.factor if hasattr(op, "factor") else None
            if isinstance(factor, torch.Tensor):
                factor = factor.item()
            if factor is None:
                raise ValueError(f"{collective}: a PREMUL_SUM reduce op needs a factor "
                                 "(torch.distributed._make_nccl_premul_sum(factor))")
            return dist.ReduceOp.SUM, float(factor)
        if kind not in _GLOO_REDUCE_OPS:
            raise ValueError(f"{collective}: reduce op {kind} is not supported on neuron; use SUM, AVG, MIN, MAX, "
                             "PRODUCT or PREMUL_SUM")
        return dist.ReduceOp(kind), None

    # ---- collectives -----------------------------------------------------------------
    @_together("all_reduce")
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.AllreduceOptions()
        op, scale = self._reduce_op("all_reduce", opts.reduceOp)
        local = _reduce_locally(op, self._size) if len(tensors) == 1 and _reduces_locally(op, tensors[0].dtype) else None
        return self._run(self._plan("all_reduce", tensors, tensors, bus=2.0, outputs=tensors),
                         lambda r, w: self._gloo.allreduce(w, _with(dist.AllreduceOptions(), reduceOp=op)),
                         scale, local)

    @_together("all_reduce_coalesced")
    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        op, scale = self._reduce_op("all_reduce_coalesced", opts.reduceOp)

        def issue(r: list[torch.Tensor], w: list[torch.Tensor]) -> dist.Work:
            for t in w:  # gloo's coalesced allreduce wants one dtype; one allreduce each is as good here
                self._gloo.allreduce([t], _with(dist.AllreduceOptions(), reduceOp=op)).wait()
            return _completed(w)

        return self._run(self._plan("all_reduce_coalesced", tensors, tensors, bus=2.0, outputs=tensors), issue,
                         scale)

    @_together("broadcast")
    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.BroadcastOptions()
        root = opts.rootRank
        plan = self._plan("broadcast", tensors, tensors, bus=None, outputs=tensors, root=root)
        local = (lambda rows, w: w[0].copy_(rows[root])) if len(tensors) == 1 else None
        return self._run(plan, lambda r, w: self._gloo.broadcast(w, _with(dist.BroadcastOptions(), rootRank=root)),
                         local=local)

    @_together("reduce")
    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.ReduceOptions()
        op, scale = self._reduce_op("reduce", opts.reduceOp)
        root = opts.rootRank
        plan = self._plan("reduce", tensors, tensors, bus=None, outputs=tensors, root=root)
        return self._run(plan, lambda r, w: self._gloo.reduce(w, _with(dist.ReduceOptions(), reduceOp=op,
                                                                      rootRank=root)), scale)

    @_together("all_gather")
    def allgather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  opts: Any = None) -> dist.Work:
        outputs = [t for group in output_lists for t in group]
        self._check_outputs("all_gather", inputs, outputs, len(inputs) * self._size)
        plan = self._plan("all_gather", inputs, outputs, bus=1.0, outputs=output_lists, total=_nbytes(outputs))

        def issue(r: list[torch.Tensor], w: list[torch.Tensor]) -> dist.Work:
            grouped = [w[i * self._size:(i + 1) * self._size] for i in range(len(r))]
            return self._gloo.allgather(grouped, r)

        def local(rows: list[torch.Tensor], w: list[torch.Tensor]) -> None:
            for out, row in zip(w, rows, strict=True):
                out.copy_(row)

        return self._run(plan, issue, local=local if len(inputs) == 1 else None)

    @_together("all_gather_coalesced")
    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                            opts: Any = None) -> dist.Work:
        # c10d's coalesced allgather: output_lists[rank][i] receives inputs[i] of that rank.
        outputs = [t for group in output_lists for t in group]
        plan = self._plan("all_gather_coalesced", inputs, outputs, bus=1.0, outputs=output_lists,
                          total=_nbytes(outputs))

        def issue(r: list[torch.Tensor], w: list[torch.Tensor]) -> dist.Work:
            n = len(r)
            for i, t in enumerate(r):
                self._gloo.allgather([[w[rank * n + i] for rank in range(self._size)]], [t]).wait()
            return _completed(w)

        return self._run(plan, issue)

    @_together("all_gather_into_tensor")
    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        return self._gather_into_tensor("all_gather_into_tensor", output, input)

    @_together("all_gather_into_tensor")
    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        return self._gather_into_tensor("all_gather_into_tensor", output, input)

    @_together("all_gather_into_tensor_coalesced")
    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> dist.Work:
        pairs = list(zip(outputs, inputs, strict=True))
        for o, i in pairs:  # every pair before any data moves
            self._check_gathered("all_gather_into_tensor_coalesced", o, i)
        for o, i in pairs:
            self._gather_into_tensor("all_gather_into_tensor_coalesced", o, i)
        return _completed(outputs)

    @_together("all_gather_into_tensor_coalesced")
    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: Any = None) -> dist.Work:
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def _check_gathered(self, name: str, output: torch.Tensor, input: torch.Tensor) -> None:
        if output.numel() != input.numel() * self._size or output.dtype != input.dtype:
            raise ValueError(f"{name}: the output ({tuple(output.shape)}, {output.dtype}) must hold "
                             f"{self._size} x the input ({tuple(input.shape)}, {input.dtype})")

    def _gather_into_tensor(self, name: str, output: torch.Tensor, input: torch.Tensor) -> dist.Work:
        self._check_gathered(name, output, input)
        plan = self._plan(name, [input], [output], bus=1.0, outputs=[output], total=_nbytes([output]))
        # flat: the output may stack the inputs (world, *input.shape), which gloo refuses
        return self._run(plan, lambda r, w: self._gloo._allgather_base(w[0].view(-1), r[0].view(-1)),
                         local=lambda rows, w: torch.cat([row.reshape(-1) for row in rows], out=w[0].view(-1)))

    @_together("reduce_scatter")
    def reduce_scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                       opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        op, scale = self._reduce_op("reduce_scatter", opts.reduceOp)
        inputs = [t for group in input_lists for t in group]
        self._check_outputs("reduce_scatter", outputs, inputs, len(outputs) * self._size)
        plan = self._plan("reduce_scatter", inputs, outputs, bus=1.0, outputs=outputs, total=_nbytes(inputs),
                          signed=outputs)
        # gloo has no reduce_scatter of lists: an allreduce of each rank's chunk row, then a copy.
        return self._run(plan, lambda r, w: self._reduce_scatter_rows(r, w, op), scale)

    def _reduce_scatter_rows(self, r: list[torch.Tensor], w: list[torch.Tensor], op: dist.ReduceOp) -> dist.Work:
        for i, out in enumerate(w):
            row = torch.cat([t.reshape(-1) for t in r[i * self._size:(i + 1) * self._size]])
            self._gloo.allreduce([row], _with(dist.AllreduceOptions(), reduceOp=op)).wait()
            n = out.numel()
            out.copy_(row[self._rank * n:(self._rank + 1) * n].view(out.shape))
        return _completed(w)

    @_together("reduce_scatter_tensor")
    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        return self.reduce_scatter_single(output, input, opts)

    @_together("reduce_scatter_tensor")
    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        return self._scatter_reduce_tensor("reduce_scatter_tensor", output, input, opts)

    @_together("reduce_scatter_tensor_coalesced")
    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> dist.Work:
        pairs = list(zip(outputs, inputs, strict=True))
        for o, i in pairs:  # every pair before any data moves
            self._check_scattered("reduce_scatter_tensor_coalesced", o, i)
        for o, i in pairs:
            self._scatter_reduce_tensor("reduce_scatter_tensor_coalesced", o, i, opts)
        return _completed(outputs)

    @_together("reduce_scatter_tensor_coalesced")
    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> dist.Work:
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    def _scatter_reduce_tensor(self, name: str, output: torch.Tensor, input: torch.Tensor, opts: Any) -> dist.Work:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        op, scale = self._reduce_op(name, opts.reduceOp)
        self._check_scattered(name, output, input)
        plan = self._plan(name, [input], [output], bus=1.0, outputs=[output], total=_nbytes([input]))
        return self._run(plan, lambda r, w: self._reduce_scatter_rows(
            list(r[0].reshape(self._size, -1)), w, op), scale)

    def _check_scattered(self, name: str, output: torch.Tensor, input: torch.Tensor) -> None:
        if input.numel() != output.numel() * self._size or output.dtype != input.dtype:
            raise ValueError(f"{name}: the input ({tuple(input.shape)}, {input.dtype}) must hold "
                             f"{self._size} x the output ({tuple(output.shape)}, {output.dtype})")

    @_together("all_to_all_single")
    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                      input_split_sizes: list[int], opts: Any = None) -> dist.Work:
        return self.all_to_all_single(output, input, output_split_sizes, input_split_sizes, opts)

    @_together("all_to_all_single")
    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                          input_split_sizes: list[int], opts: Any = None) -> dist.Work:
        out_splits, in_splits = list(output_split_sizes), list(input_split_sizes)
        rows_in = input.shape[0] if input.dim() else input.numel()
        rows_out = output.shape[0] if output.dim() else output.numel()
        if not in_splits:
            in_splits = [rows_in // self._size] * self._size
        if not out_splits:
            out_splits = [rows_out // self._size] * self._size
        if sum(in_splits) != rows_in or sum(out_splits) != rows_out:
            raise ValueError(f"all_to_all_single: split sizes {in_splits} / {out_splits} do not add up to the "
                             f"input's {rows_in} and output's {rows_out} rows")
        plan = self._plan("all_to_all_single", [input], [output], bus=1.0, outputs=[output],
                          total=_nbytes([input]), splits=(in_splits, out_splits))
        return self._run(plan, lambda r, w: self._gloo.alltoall_base(w[0], r[0], out_splits, in_splits))

    @_together("all_to_all")
    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> dist.Work:
        if len(outputs) != self._size or len(inputs) != self._size:
            raise ValueError(f"all_to_all: needs {self._size} input and output tensors (one per rank), got "
                             f"{len(inputs)} and {len(outputs)}")
        in_rows = [t.numel() for t in inputs]
        out_rows = [t.numel() for t in outputs]
        plan = self._plan("all_to_all", inputs, outputs, bus=1.0, outputs=outputs, total=_nbytes(inputs),
                          splits=(in_rows, out_rows))

        def issue(r: list[torch.Tensor], w: list[torch.Tensor]) -> dist.Work:
            flat_in = torch.cat([t.reshape(-1) for t in r])
            flat_out = torch.empty(sum(out_rows), dtype=flat_in.dtype)
            self._gloo.alltoall_base(flat_out, flat_in, out_rows, in_rows).wait()
            for t, chunk in zip(w, flat_out.split(out_rows), strict=True):
                t.copy_(chunk.view(t.shape))
            return _completed(w)

        return self._run(plan, issue)

    @_together("gather")
    def gather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.GatherOptions()
        root = opts.rootRank
        outputs = [t for group in output_lists for t in group]
        plan = self._plan("gather", inputs, outputs, bus=None, outputs=output_lists, root=root,
                          total=_nbytes(inputs) * (self._size if self._rank == root else 1))
        return self._run(plan, lambda r, w: self._gloo.gather([w] if w else [], r,
                                                              _with(dist.GatherOptions(), rootRank=root)))

    @_together("scatter")
    def scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.ScatterOptions()
        root = opts.rootRank
        inputs = [t for group in input_lists for t in group]
        plan = self._plan("scatter", inputs, outputs, bus=None, outputs=outputs, root=root,
                          total=_nbytes(outputs) * (self._size if self._rank == root else 1), signed=outputs)
        return self._run(plan, lambda r, w: self._gloo.scatter(w, [r] if r else [],
                                                               _with(dist.ScatterOptions(), rootRank=root)))

    @_together("barrier")
    def barrier(self, opts: Any = None) -> dist.Work:
        start = now_ns()
        self._agreed = True
        self._meet("barrier", Signature("barrier", None, ()))
        try:
            self._gloo.barrier().wait()
        except RuntimeError as e:
            raise _transport_error("barrier", self, e) from e
        record_collective(CollectiveRecord("barrier", self._name, self._size, self._rank, -1, 0, 0, start, now_ns(), 0))
        return _completed([])

    # ---- dist._coalescing_manager(group, device) -------------------------------------
    def _start_coalescing(self, device: torch.device) -> None:
        """The manager records the block's all_reduce, all_gather_into_tensor and
        reduce_scatter_tensor calls and issues them as one ``*_coalesced`` call of this group;
        other collectives here are synchronous, so what is left to group are the sends and
        receives of the block. (Without this, c10d asked the inner gloo group, which raised
        "Backend gloo does not implement startCoalescing".)"""
        self._coalesced_point_to_point = []

    def _end_coalescing(self, device: torch.device) -> dist.Work:
        """Waits for the block's sends and receives (all posted by now); completed work."""
        works, self._coalesced_point_to_point = self._coalesced_point_to_point or [], None
        errors = []
        for work in works:  # every one, so that none is left half done when one fails
            try:
                work.wait()
            except Exception as e:  # noqa: BLE001 - raised below, with the others
                errors.append(e)
        if len(errors) > 1:
            raise type(errors[0])(" | ".join(str(e) for e in errors)) from errors[0]
        if errors:
            raise errors[0]
        return _completed([])

    # ---- point to point (asynchronous) -------------------------------------------------
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> dist.Work:
        return self._point_to_point("send", tensors, dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> dist.Work:
        return self._point_to_point("recv", tensors, src, tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> dist.Work:
        """``dist.recv`` / ``irecv`` without a source (without this, c10d handed the neuron
        tensors to the inner gloo group and the receive never completed)."""
        return self._point_to_point("recv", tensors, -1, tag)

    def _point_to_point(self, name: str, tensors: list[torch.Tensor], peer: int, tag: int) -> dist.Work:
        """One send or receive (``peer`` -1: from any rank). Its two sides first swap
        their dtypes and sizes (``point_to_point.py``): a mismatch raises on both ranks
        with nothing sent, where gloo would terminate the receiver or corrupt its tensor.
        An error here (a CPU tensor, an error of earlier device work) still takes part in
        the handshake, flagged, so that the peer raises instead of waiting."""
        sending = name == "send"
        start = now_ns()
        if not 0 <= tag <= MAX_TAG:
            raise ValueError(f"{name} on a neuron process group: tag {tag} is out of range; use 0 to {MAX_TAG}")
        what = f"{name} {'to' if sending else 'from'} {f'rank {peer}' if peer >= 0 else 'any rank'}"
        transfer = Transfer(self._gloo, sending, peer, tag, self._rank, [], TransferHeader(None, 0, ()),
                            lambda e: _transport_error(what, self, e))
        device_tensors = [t for t in tensors if isinstance(t, torch.Tensor) and t.device.type == _DEVICE_TYPE]
        try:
            self._check(name, tensors)
            if device_tensors:
                prepare_host_access(tensors if sending else [], [] if sending else tensors, name, Reason.COLLECTIVE)
            staged = [_Staged(t, read=sending) for t in tensors]
        except Exception:
            transfer.header = TransferHeader(None, 0, (), failed=True)
            submit(transfer)
            raise
        ready = now_ns()
        transfer.hosts, transfer.header = [s.host for s in staged], TransferHeader.of(tensors)
        submit(transfer)
        device = device_tensors[0].device.index if device_tensors else -1
        nbytes = _nbytes(tensors)
        plan = _Plan(name, tensors, [], nbytes, nbytes, Signature(name, None, None), tensors)

        def finished() -> None:
            if not sending:
                for s in staged:
                    s.finish()
                if device_tensors:
                    note_written(device_tensors)
            self._record(plan, start, ready, device)

        point_to_point = _PointToPointWork(transfer, finished, tensors, what, self._timeout)
        if self._coalesced_point_to_point is not None:
            self._coalesced_point_to_point.append(point_to_point)
        return point_to_point


class _PointToPointWork(dist.Work):
    """An asynchronous send or receive: ``wait()`` waits for its transfer (handshake and
    data, on a lane thread), then (for a receive) writes back staged copies and marks the
    tensors computed; it raises the transfer's error, on both ranks for a mismatch."""

    def __init__(self, transfer: Transfer, finished: Callable[[], None], tensors: list[torch.Tensor],
                 what: str, group_timeout: timedelta) -> None:
        super().__init__()
        self._transfer, self._finished, self._tensors = transfer, finished, tensors
        self._what, self._group_timeout = what, group_timeout
        self._done = False

    def wait(self, timeout: timedelta | None = None) -> bool:
        if not self._done:
            limit = timeout.total_seconds() if timeout else None
            if not self._transfer.done.wait(limit):
                raise dist.DistBackendError(f"{self._what} did not complete in {timeout}; it goes on in the "
                                            f"background (and fails after the group's timeout, "
                                            f"{self._group_timeout}, if its peer never takes part)")
            if self._transfer.error is not None:
                raise self._transfer.error
            self._done = True
            self._finished()
        return True

    def is_completed(self) -> bool:
        return self._done or self._transfer.done.is_set()

    def is_success(self) -> bool:
        return self._transfer.done.is_set() and self._transfer.error is None

    def exception(self) -> BaseException | None:
        return self._transfer.error

    def _source_rank(self) -> int:
        """The rank a receive from any rank got its data from (after ``wait()``)."""
        return self._transfer.source

    def get_future(self) -> torch.futures.Future:
        """A future of the tensors (waits for the transfer first)."""
        self.wait()
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(self._tensors)
        return future


def _with(options: Any, **fields: Any) -> Any:
    for name, value in fields.items():
        setattr(options, name, value)
    return options


def _completed(outputs: Any) -> dist.Work:
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(outputs)
    return _create_work_from_future(future)


def _transport_error(what: str, group: NeuronProcessGroup, error: RuntimeError) -> RuntimeError:
    return dist.DistBackendError(
        f"{what} on the neuron process group {group.getGroupName()!r} (rank {group.rank()} of {group.size()}) "
        f"failed in its transport: {error}. A peer rank may have exited or timed out "
        f"(timeout {group._timeout}); the tensors on this rank are as they were before the collective.")
