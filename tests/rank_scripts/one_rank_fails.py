"""A collective that fails on one rank before its data moves fails on every rank, at once."""

import os

import torch
import torch.distributed as dist

from neuron_lab.distributed import CollectiveMismatchError
from ranks import report

dist.init_process_group("neuron")
rank = dist.get_rank()
device = torch.device("neuron", int(os.environ["LOCAL_RANK"]) % torch.neuron.device_count())
outcomes = {}


def attempt(case, call):
    try:
        call()
        outcomes[case] = ["no error", ""]
    except Exception as e:  # noqa: BLE001 - reported to the test
        outcomes[case] = [type(e).__name__, str(e)]


# Rank 1 passes a CPU tensor; rank 0 passes a right one and must not wait for rank 1.
attempt("cpu tensor on rank 1", lambda: dist.all_reduce(torch.ones(2) if rank == 1 else torch.ones(2, device=device)))
# Rank 0's output is too small; the check runs before the ranks meet.
attempt("small output on rank 0", lambda: dist.all_gather_into_tensor(
    torch.empty(3 if rank == 0 else 4, device=device), torch.ones(2, device=device)))
# The second pair of a coalesced gather is wrong on rank 0: nothing of the first pair moves either.
first = torch.zeros(4, device=device)
attempt("coalesced", lambda: dist.distributed_c10d._get_default_group().allgather_into_tensor_coalesced(
    [first, torch.empty(5 if rank == 0 else 4, device=device)],
    [torch.ones(2, device=device), torch.ones(2, device=device)]).wait())
good = torch.full((2,), float(rank + 1), device=device)
dist.all_reduce(good)
report({"outcomes": outcomes, "first": first.cpu().tolist(), "after": good.cpu().tolist()})
dist.destroy_process_group()
