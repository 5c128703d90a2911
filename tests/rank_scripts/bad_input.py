"""Bad calls on the neuron process group: each raises a clear error on every rank and
leaves the group usable (a good all_reduce after it matches gloo's).

One launch (2 ranks) goes through the lifecycle of the process group:
1. ``init_process_group()`` with no backend picks the neuron backend for neuron tensors;
2. ``destroy_process_group()``, then ``init_process_group("neuron")``: the bad calls
   (``CASES``), each followed by a good all_reduce;
3. destroy again, a second ``init_process_group("neuron")`` works, and more cycles of init,
   subgroup and destroy;
4. ``init_process_group("cpu:gloo,neuron:neuron")`` carries CPU and neuron tensors.
The rank reports ``{"lifecycle": {...}, "cases": {name: {"raised", "message", "usable"}}}``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["CASES"]

TIMEOUT = timedelta(seconds=60)
REINIT_CYCLES = 4


def _device() -> torch.device:
    return torch.device("neuron", int(os.environ["LOCAL_RANK"]) % torch.neuron.device_count())


def _rank() -> int:
    return dist.get_rank()


def _ones(*shape: int, dtype: torch.dtype = torch.float32, device: torch.device | None = None) -> torch.Tensor:
    return torch.ones(shape, dtype=dtype, device=device or _device())


# ---- the bad calls: rank-dependent arguments that do not fit together -------------------

def _shape_all_reduce() -> None:
    dist.all_reduce(_ones(3 if _rank() == 0 else 2, 4))


def _same_numel_all_reduce() -> None:
    dist.all_reduce(_ones(3, 4) if _rank() == 0 else _ones(4, 3))


def _dtype_all_reduce() -> None:
    dist.all_reduce(_ones(3, 4, dtype=torch.float32 if _rank() == 0 else torch.int64))


def _shape_broadcast() -> None:
    dist.broadcast(_ones(3 if _rank() == 0 else 2, 4), src=0)


def _roots_broadcast() -> None:
    dist.broadcast(_ones(3, 4), src=_rank())


def _different_collectives() -> None:
    if _rank() == 0:
        dist.all_reduce(_ones(3, 4))
    else:
        dist.broadcast(_ones(3, 4), src=0)


def _shape_all_gather() -> None:
    rows = 3 if _rank() == 0 else 2
    dist.all_gather([_ones(rows, 4) for _ in range(2)], _ones(rows, 4))


def _shape_all_gather_into_tensor() -> None:
    rows = 3 if _rank() == 0 else 2
    dist.all_gather_into_tensor(_ones(2 * rows, 4), _ones(rows, 4))


def _dtype_all_gather_into_tensor() -> None:
    dtype = torch.float32 if _rank() == 0 else torch.bfloat16
    dist.all_gather_into_tensor(_ones(6, 4, dtype=dtype), _ones(3, 4, dtype=dtype))


def _shape_reduce_scatter_tensor() -> None:
    rows = 3 if _rank() == 0 else 2
    dist.reduce_scatter_tensor(_ones(rows, 4), _ones(2 * rows, 4))


def _shape_reduce_scatter() -> None:
    rows = 3 if _rank() == 0 else 2
    dist.reduce_scatter(_ones(rows, 4), [_ones(rows, 4) for _ in range(2)])


def _splits_all_to_all_single() -> None:
    sends = [1, 1] if _rank() == 0 else [2, 1]
    dist.all_to_all_single(_ones(2, 4), _ones(sum(sends), 4), output_split_sizes=[1, 1], input_split_sizes=sends)


def _shape_gather() -> None:
    rows = 3 if _rank() == 0 else 2
    dist.gather(_ones(rows, 4), [_ones(rows, 4) for _ in range(2)] if _rank() == 0 else None, dst=0)


def _shape_scatter() -> None:
    rows = 3 if _rank() == 0 else 2
    dist.scatter(_ones(rows, 4), [_ones(rows, 4) for _ in range(2)] if _rank() == 0 else None, src=0)


def _shape_reduce() -> None:
    dist.reduce(_ones(3 if _rank() == 0 else 2, 4), dst=0)


def _cpu_tensor() -> None:
    dist.all_reduce(torch.ones(3, 4))


def _cpu_tensor_on_one_rank() -> None:
    dist.all_reduce(torch.ones(3, 4) if _rank() == 1 else _ones(3, 4))


def _wrong_list_length_on_one_rank() -> None:
    dist.all_gather([_ones(3, 4) for _ in range(2 if _rank() == 0 else 3)], _ones(3, 4))


def _unsupported_reduce_op() -> None:
    dist.all_reduce(_ones(3, 4, dtype=torch.int64), op=dist.ReduceOp.BAND)


MISMATCH = "CollectiveMismatchError"
_SHAPES = ["rank 0: float32[3, 4]", "rank 1: float32[2, 4]"]
_REJECTED_ON_RANK_1 = ["rank 1 raised an error before the data moved", "every rank raised"]


def _both(value: Any) -> tuple[Any, Any]:
    return value, value


# name -> (the call, the error rank 0 and rank 1 must raise, what their messages must mention)
CASES: dict[str, tuple[Callable[[], None], tuple[str, str], tuple[list[str], list[str]]]] = {
    "shape_all_reduce": (_shape_all_reduce, _both(MISMATCH), _both(_SHAPES)),
    "same_numel_all_reduce": (_same_numel_all_reduce, _both(MISMATCH),
                              _both(["rank 0: float32[3, 4]", "rank 1: float32[4, 3]"])),
    "dtype_all_reduce": (_dtype_all_reduce, _both(MISMATCH),
                         _both(["dtypes differ", "rank 0: float32[3, 4]", "rank 1: int64[3, 4]"])),
    "shape_broadcast": (_shape_broadcast, _both(MISMATCH), _both(_SHAPES)),
    "roots_broadcast": (_roots_broadcast, _both(MISMATCH), _both(["different roots", "root 0", "root 1"])),
    "different_collectives": (_different_collectives, _both(MISMATCH),
                              _both(["different collectives", "rank 0: all_reduce of float32[3, 4]",
                                     "rank 1: broadcast of float32[3, 4]"])),
    "shape_all_gather": (_shape_all_gather, _both(MISMATCH), _both(_SHAPES)),
    "shape_all_gather_into_tensor": (_shape_all_gather_into_tensor, _both(MISMATCH), _both(_SHAPES)),
    "dtype_all_gather_into_tensor": (_dtype_all_gather_into_tensor, _both(MISMATCH),
                                     _both(["rank 0: float32[3, 4]", "rank 1: bfloat16[3, 4]"])),
    "shape_reduce_scatter_tensor": (_shape_reduce_scatter_tensor, _both(MISMATCH),
                                    _both(["rank 0: float32[6, 4]", "rank 1: float32[4, 4]"])),
    "shape_reduce_scatter": (_shape_reduce_scatter, _both(MISMATCH), _both(_SHAPES)),
    "splits_all_to_all_single": (_splits_all_to_all_single, _both(MISMATCH),
                                 _both(["rank 1 sends 2 rows to rank 0, which expects 1"])),
    "shape_gather": (_shape_gather, _both(MISMATCH), _both(_SHAPES)),
    "shape_scatter": (_shape_scatter, _both(MISMATCH), _both(_SHAPES)),
    "shape_reduce": (_shape_reduce, _both(MISMATCH), _both(_SHAPES)),
    "cpu_tensor": (_cpu_tensor, _both("ValueError"),
                   _both(["cpu tensor", "tensor.to('neuron')", "backend='cpu:gloo,neuron:neuron'"])),
    "cpu_tensor_on_one_rank": (_cpu_tensor_on_one_rank, (MISMATCH, "ValueError"),
                               (_REJECTED_ON_RANK_1, ["cpu tensor", "tensor.to('neuron')"])),
    "wrong_list_length_on_one_rank": (_wrong_list_length_on_one_rank, (MISMATCH, "ValueError"),
                                      (_REJECTED_ON_RANK_1, ["expected 2 tensors (one per rank)", "got 3"])),
    "unsupported_reduce_op": (_unsupported_reduce_op, _both("ValueError"), _both(["BAND", "use SUM, AVG"])),
}


# ---- checks -------------------------------------------------------------------------------

def _reference() -> dist.ProcessGroupGloo:
    """A gloo group of every rank that outlives the process groups of the lifecycle (its
    own keys in the store): after a destroy, ``new_group(backend="gloo")`` can read the
    destroyed group's addresses from the store, as c10d reuses group names (torch 2.13)."""
    store = dist.PrefixStore("bad-input-reference/", dist.distributed_c10d._get_default_store())
    return dist.ProcessGroupGloo(store, _rank(), dist.get_world_size(), TIMEOUT)


def _good_all_reduce(reference: dist.ProcessGroupGloo, group: dist.ProcessGroup | None = None) -> bool:
    """A good all_reduce on the neuron group matches gloo's on CPU copies."""
    values = torch.arange(12, dtype=torch.float32).reshape(3, 4) * (_rank() + 1) - 5
    on_device = values.to(_device())
    dist.all_reduce(on_device, group=group)
    reference.allreduce([values]).wait()
    return on_device.device.type == "neuron" and torch.equal(on_device.cpu(), values)


def _bad_call(call: Callable[[], None], reference: dist.ProcessGroupGloo) -> dict[str, Any]:
    try:
        call()
        raised, message = "nothing", ""
    except Exception as e:  # noqa: BLE001 - what was raised is the result
        raised, message = type(e).__name__, str(e)
    return {"raised": raised, "message": message, "usable": _good_all_reduce(reference)}


def _no_backend() -> tuple[dict[str, Any], dist.ProcessGroupGloo]:
    """``init_process_group()`` with no backend, on a machine whose accelerator is neuron;
    also makes the reference group."""
    from neuron_lab.distributed.process_group import NeuronProcessGroup

    dist.init_process_group(timeout=TIMEOUT)
    reference = _reference()
    subgroup = dist.new_group(ranks=[0, 1])  # a new group of the same (default) backend
    result = {"get_backend": str(dist.get_backend()), "backend_config": dist.get_backend_config(),
              "neuron_group": isinstance(dist.group.WORLD, NeuronProcessGroup),
              "subgroup_neuron": isinstance(subgroup, NeuronProcessGroup),
              "all_reduce": _good_all_reduce(reference), "subgroup_all_reduce": _good_all_reduce(reference, subgroup)}
    dist.destroy_process_group()
    return result, reference


def _cycle(reference: dist.ProcessGroupGloo) -> bool:
    """One more init, subgroup, all_reduces and destroy: the groups of a new init must not
    meet the destroyed ones' keys in the store (which connect or not depending on timing,
    so several cycles make a stale read show)."""
    dist.init_process_group("neuron", timeout=TIMEOUT)
    usable = _good_all_reduce(reference) and _good_all_reduce(reference, dist.new_group(ranks=[0, 1]))
    dist.destroy_process_group()
    return usable


def _mixed(reference: dist.ProcessGroupGloo) -> dict[str, Any]:
    """``"cpu:gloo,neuron:neuron"``: CPU tensors go to gloo, neuron tensors to the neuron backend."""
    dist.init_process_group("cpu:gloo,neuron:neuron", timeout=TIMEOUT)
    values = torch.arange(8, dtype=torch.float32).reshape(2, 4) * (_rank() + 2)
    on_cpu, on_device, expected = values.clone(), values.to(_device()), values.clone()
    dist.all_reduce(on_cpu)
    dist.all_reduce(on_device)
    reference.allreduce([expected]).wait()
    gathered_cpu, gathered_device = torch.zeros(4, 4), torch.zeros(4, 4, device=_device())
    dist.all_gather_into_tensor(gathered_cpu, values)
    dist.all_gather_into_tensor(gathered_device, values.to(_device()))
    gathered_expected = torch.zeros(4, 4)
    reference._allgather_base(gathered_expected, values).wait()
    objects: list[Any] = [None, None]
    dist.all_gather_object(objects, {"rank": _rank()})
    dist.barrier()
    result = {"get_backend": str(dist.get_backend()),
              "cpu_all_reduce": torch.equal(on_cpu, expected),
              "neuron_all_reduce": on_device.device.type == "neuron" and torch.equal(on_device.cpu(), expected),
              "cpu_all_gather": torch.equal(gathered_cpu, gathered_expected),
              "neuron_all_gather": torch.equal(gathered_device.cpu(), gathered_expected),
              "objects": objects == [{"rank": 0}, {"rank": 1}]}
    dist.destroy_process_group()
    return result


def main() -> None:
    from ranks import report

    torch.neuron.set_device(_device())
    no_backend, reference = _no_backend()
    lifecycle: dict[str, Any] = {"no_backend": no_backend}
    dist.init_process_group("neuron", timeout=TIMEOUT)
    lifecycle["first_init_usable"] = _good_all_reduce(reference)
    cases = {name: _bad_call(call, reference) for name, (call, _, _) in CASES.items()}
    dist.destroy_process_group()
    dist.init_process_group("neuron", timeout=TIMEOUT)
    lifecycle["second_init"] = {"get_backend": str(dist.get_backend()), "usable": _good_all_reduce(reference)}
    dist.destroy_process_group()
    lifecycle["cycles"] = [_cycle(reference) for _ in range(REINIT_CYCLES)]
    lifecycle["mixed"] = _mixed(reference)
    report({"lifecycle": lifecycle, "cases": cases})


if __name__ == "__main__":
    main()
