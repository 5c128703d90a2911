"""The neuron c10d backend end to end (several processes under torchrun)."""

from __future__ import annotations

import pytest

from ranks import SCRIPTS, run_on_ranks


def test_two_ranks_all_reduce_pending_tensors_on_their_own_cores() -> None:
    reports = run_on_ranks(SCRIPTS / "smoke.py", nproc=2)
    world = 1 + 2
    for rank, rep in enumerate(reports):
        assert rep["backend"] == "neuron"
        assert rep["sum"] == [world * v for v in (1.0, 2.0, 3.0, 4.0)]
        assert rep["device"] == f"neuron:{rank}"


def test_the_profiler_explain_and_the_trace_show_collectives_with_their_bytes() -> None:
    reports = run_on_ranks(SCRIPTS / "observe.py", nproc=2)
    for rep in reports:
        assert rep["total"] == 512 * 4.0
        # all_reduce of 1 KiB moves it once (ring bus bytes 2 (n-1)/n); the gather takes 1 KiB, gives 2 KiB.
        assert rep["collectives"] == [["all_reduce", 1024, 1024, 2], ["all_gather_into_tensor", 2048, 1024, 2]]
        assert rep["trace"] == [["all_reduce", 1024], ["all_gather_into_tensor", 2048]]
        assert "Collectives" in rep["table"] and "all_gather_into_tensor" in rep["table"]
        assert "neuron-collectives" in rep["html"]
        assert "collectives (2: 3.0 KiB moved" in rep["explain"]
        assert "2 collectives (3.0 KiB" in rep["summary"]
        assert rep["collective_lane"] in rep["lanes"]
        # Each collective is one launch of the stream, on the host's thread.
        assert rep["inline_launches"].count("c10d::all_reduce") == 1
        assert rep["inline_launches"].count("c10d::all_gather_into_tensor") == 1
        assert "COLLECTIVE" in rep["by_design_waits"]


def test_a_collective_that_fails_on_one_rank_before_its_data_moves_fails_on_every_rank() -> None:
    """The failing rank raises its own error; the others raise at once (not at the
    timeout) naming that rank; nothing moved, and the group works afterwards."""
    reports = run_on_ranks(SCRIPTS / "one_rank_fails.py", nproc=2, timeout=300)
    cases = {"cpu tensor on rank 1": 1, "small output on rank 0": 0, "coalesced": 0}
    for rank, rep in enumerate(reports):
        for case, failing in cases.items():
            kind, message = rep["outcomes"][case]
            if rank == failing:
                assert kind == "ValueError", (case, message)
            else:
                assert kind == "CollectiveMismatchError", (case, message)
                assert f"rank {failing} raised an error before the data moved" in message
        assert rep["first"] == [0.0] * 4  # the coalesced call moved nothing
        assert rep["after"] == [3.0, 3.0]


def test_small_and_large_collectives_equal_gloo_on_the_cpu_for_every_reduce_op() -> None:
    """Small tensors finish in the ranks' meeting (one exchange), large ones go through
    gloo: both give gloo's bits (two ranks: every reduction is one exact operation)."""
    reports = run_on_ranks(SCRIPTS / "reduce_paths.py", nproc=2, timeout=300)
    for rank, rep in enumerate(reports):
        unequal = {case: diff for case, (equal, diff) in rep["results"].items() if not equal}
        assert not unequal, f"rank {rank}: {unequal}"
        assert len(rep["results"]) == 3 * 2 * 2 + 2 * 2 * 6 + 2 * 4


def test_functional_collectives_inside_torch_compile_equal_eager() -> None:
    """With backend="neuron" and with TorchInductor's default (which runs neuron graphs
    as host code over device memory, so its collectives see CPU tensors of the device)."""
    reports = run_on_ranks(SCRIPTS / "compiled_collectives.py", nproc=2, timeout=600)
    for rep in reports:
        assert len(rep["eager"]) == 8
        for backend in ("neuron", "inductor"):
            assert rep[backend] == pytest.approx(rep["eager"], abs=1e-5), backend
