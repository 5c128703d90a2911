"""The neuron c10d backend end to end (several processes under torchrun)."""

from __future__ import annotations

from ranks import SCRIPTS, run_on_ranks


def test_two_ranks_all_reduce_pending_tensors_on_their_own_cores() -> None:
    reports = run_on_ranks(SCRIPTS / "smoke.py", nproc=2)
    world = 1 + 2
    for rank, rep in enumerate(reports):
        assert rep["backend"] == "neuron"
        assert rep["sum"] == [world * v for v in (1.0, 2.0, 3.0, 4.0)]
        assert rep["device"] == f"neuron:{rank}"
