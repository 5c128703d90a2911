"""A rank dies before a collective: the survivor's collective raises (it does not hang).

Rank 1 exits with ``os._exit(1)`` after one good all_reduce; rank 0 then calls
all_reduce, catches what it raises and reports the error before exiting. Rank 0 ignores
the SIGTERM that torchrun sends when rank 1 fails, so that it gets to report; a hang would
still end at the group's timeout (20 s) or at the test's.
"""

from __future__ import annotations

import os
import signal
from datetime import timedelta

import torch
import torch.distributed as dist

TIMEOUT = timedelta(seconds=20)


def main() -> None:
    from ranks import report

    device = torch.device("neuron", int(os.environ["LOCAL_RANK"]) % torch.neuron.device_count())
    torch.neuron.set_device(device)
    dist.init_process_group("neuron", timeout=TIMEOUT)
    rank = dist.get_rank()
    x = torch.ones(3, 4, device=device)
    dist.all_reduce(x)
    first = x.cpu().tolist()
    if rank == 1:
        os._exit(1)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # torchrun's stop for the failed rank: report first
    try:
        dist.all_reduce(x)
        raised, message, backend_error = "nothing", "", False
    except Exception as e:  # noqa: BLE001 - what was raised is the result
        raised, message, backend_error = type(e).__name__, str(e), isinstance(e, dist.DistBackendError)
    report({"first": first, "raised": raised, "message": message, "is_dist_backend_error": backend_error})
    os._exit(0)  # no destroy: the peer is gone


if __name__ == "__main__":
    main()
