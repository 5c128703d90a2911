"""Sends and receives that do not fit (2 ranks): each raises a clear error on both ranks,
no process aborts, the receive's tensor keeps its values, and the group stays usable (a
matching exchange after it moves the right data, and an all_reduce works).

Before the handshake of ``point_to_point.py``, a smaller receive terminated rank 1 inside
gloo (SIGABRT), a larger one filled what arrived and a dtype mismatch reinterpreted bits.
Also checks that the handshake keeps gloo's progress rules: an ``isend`` completes while
its sender blocks in a receive. The rank reports ``{"cases": {name: {...}}}``.
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
SENT = 6  # elements rank 0 sends in each case


def _device() -> torch.device:
    return torch.device("neuron", int(os.environ["LOCAL_RANK"]) % torch.neuron.device_count())


def _rank() -> int:
    return dist.get_rank()


def _payload() -> torch.Tensor:
    return torch.arange(SENT, dtype=torch.float32, device=_device()) + 10


def _receive_buffer(case: str) -> torch.Tensor:
    """Rank 1's buffer: the wrong one for ``case``, filled with -1 to show it stays as it was."""
    numel = {"smaller": SENT - 2, "larger": SENT + 2}.get(case, SENT)
    dtype = torch.int32 if case == "dtype" else torch.float32
    return torch.full((numel,), -1, dtype=dtype, device=_device())


def _blocking(case: str) -> torch.Tensor | None:
    if _rank() == 0:
        dist.send(_payload(), 1)
        return None
    out = _receive_buffer(case)
    try:
        dist.recv(out, 0)
    finally:
        _kept.append(out)
    return out


def _async(case: str) -> None:
    if _rank() == 0:
        dist.isend(_payload(), 1).wait()
    else:
        out = _receive_buffer(case)
        _kept.append(out)
        dist.irecv(out, 0).wait()


def _batch(case: str) -> None:
    """Both ranks exchange in one batch; only rank 0 -> rank 1 does not fit."""
    peer = 1 - _rank()
    if _rank() == 0:
        mine, out = _payload(), torch.full((3,), -1.0, device=_device())
    else:
        mine, out = torch.arange(3.0, device=_device()), _receive_buffer(case)
        _kept.append(out)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, peer), dist.P2POp(dist.irecv, out, peer)])
    errors = []
    for work in works:  # wait for each, as pipeline schedules do, keeping the first error
        try:
            work.wait()
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    if errors:
        raise errors[0]


def _any_source(case: str) -> None:
    if _rank() == 0:
        dist.send(_payload(), 1)
    else:
        out = _receive_buffer(case)
        _kept.append(out)
        dist.recv(out)  # from any rank


def _cpu_tensor_on_rank_0(case: str) -> None:
    """Rank 0's send fails before its data moves (a CPU tensor on a neuron-only group)."""
    if _rank() == 0:
        dist.send(torch.ones(SENT), 1)
    else:
        out = _receive_buffer("fits")
        _kept.append(out)
        dist.recv(out, 0)


_kept: list[torch.Tensor] = []  # rank 1's receive buffer of the current case

MISMATCH = "PointToPointMismatchError"
_SIZES = {"smaller": "rank 1 receives into float32[4] (4 elements)",
          "larger": "rank 1 receives into float32[8] (8 elements)",
          "dtype": "rank 1 receives into int32[6] (6 elements)"}
_PROBLEMS = {"smaller": "numbers of elements differ", "larger": "numbers of elements differ",
             "dtype": "dtypes differ"}

# name -> (call, argument, error of rank 0 and rank 1, words both messages must hold)
CASES: dict[str, tuple[Callable[[str], Any], str, tuple[str, str], list[str]]] = {}
for _style, _call in (("send_recv", _blocking), ("isend_irecv", _async), ("batch_isend_irecv", _batch),
                      ("recv_any_source", _any_source)):
    for _case in ("smaller", "larger", "dtype"):
        CASES[f"{_style}_{_case}"] = (_call, _case, (MISMATCH, MISMATCH), [
            "send from rank 0 to rank 1 (tag 0)", "rank 0 sends float32[6] (6 elements)", _SIZES[_case],
            _PROBLEMS[_case], "torch.empty(6, dtype=torch.float32, device='neuron')", "both ranks raised"])
CASES["cpu_tensor_on_rank_0"] = (_cpu_tensor_on_rank_0, "", ("ValueError", MISMATCH), [])
CPU_TENSOR_WORDS = (["cpu tensor", "tensor.to('neuron')"], ["rank 0 raised an error before the data moved"])


def _matching_exchange() -> bool:
    """After a bad case: a matching send/recv both ways, then an all_reduce."""
    peer = 1 - _rank()
    mine = torch.arange(5.0, device=_device()) * (_rank() + 1)
    out = torch.zeros(5, device=_device())
    if _rank() == 0:
        dist.send(mine, peer)
        dist.recv(out, peer)
    else:
        dist.recv(out, peer)
        dist.send(mine, peer)
    total = torch.ones(3, device=_device())
    dist.all_reduce(total)
    return torch.equal(out.cpu(), torch.arange(5.0) * (peer + 1)) and torch.equal(total.cpu(), torch.full((3,), 2.0))


def _progress() -> dict[str, bool]:
    """gloo's progress rules hold with the handshake: an isend completes while its rank
    blocks in a receive, and a posted irecv lets the peer's blocking send complete."""
    peer, mine = 1 - _rank(), torch.full((4,), float(_rank() + 1), device=_device())
    out = torch.zeros(4, device=_device())
    if _rank() == 0:  # isend, then block in recv: rank 1 receives first, then sends
        work = dist.isend(mine, peer)
        dist.recv(out, peer)
        work.wait()
    else:
        dist.recv(out, peer)
        dist.send(mine, peer)
    first = torch.equal(out.cpu(), torch.full((4,), float(peer + 1)))
    out.zero_()
    if _rank() == 1:  # irecv posted, then a blocking send to the peer that receives after sending
        work = dist.irecv(out, peer)
        dist.send(mine, peer)
        work.wait()
    else:
        dist.send(mine, peer)
        dist.recv(out, peer)
    return {"isend_then_recv": first, "irecv_then_send": torch.equal(out.cpu(), torch.full((4,), float(peer + 1)))}


def main() -> None:
    from ranks import report

    torch.neuron.set_device(_device())
    dist.init_process_group("neuron", timeout=TIMEOUT)
    results: dict[str, Any] = {}
    for name, (call, case, _, _) in CASES.items():
        _kept.clear()
        try:
            call(case)
            raised, message = "nothing", ""
        except Exception as e:  # noqa: BLE001 - what was raised is the result
            raised, message = type(e).__name__, str(e)
        untouched = all(bool((t.cpu() == -1).all()) for t in _kept)
        results[name] = {"raised": raised, "message": message, "untouched": untouched, "usable": _matching_exchange()}
    results["progress"] = _progress()
    dist.destroy_process_group()
    report({"cases": results})


if __name__ == "__main__":
    main()
