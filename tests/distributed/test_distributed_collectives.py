"""Every collective of the neuron c10d backend against gloo on CPU, and its bad input.

Each torchrun launch covers many cases (a launch costs seconds of process start): the
rank scripts report one result per case and the tests here check each case on each rank.
``rank_scripts/collectives.py`` compares every collective with gloo on 2 and 4 ranks;
``rank_scripts/bad_input.py`` checks that bad calls raise clear errors on every rank and
leave the group usable; ``rank_scripts/dead_rank.py`` kills a rank before a collective;
``rank_scripts/point_to_point_mismatch.py`` sends into receives that do not fit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from rank_scripts.bad_input import CASES as BAD_CASES
from rank_scripts.bad_input import REINIT_CYCLES
from rank_scripts.collectives import case_names
from rank_scripts.point_to_point_mismatch import CASES as P2P_CASES
from rank_scripts.point_to_point_mismatch import CPU_TENSOR_WORDS as P2P_CPU_WORDS
from ranks import SCRIPTS, run_on_ranks

Reports = list[dict[str, Any]]


@pytest.fixture(scope="module")
def collective_reports(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], Reports]:
    """Each rank's report of one launch of every collective case on ``world`` ranks
    (launched at first use, once per world size)."""
    launched: dict[int, Reports] = {}

    def reports(world: int) -> Reports:
        if world not in launched:
            marks = tmp_path_factory.mktemp(f"barrier-{world}")
            launched[world] = run_on_ranks(SCRIPTS / "collectives.py", world, str(marks), timeout=900)
        return launched[world]

    return reports


@pytest.mark.parametrize("world", [2, 4])
def test_every_case_reported(collective_reports: Callable[[int], Reports], world: int) -> None:
    for rank, rep in enumerate(collective_reports(world)):
        assert rep["backend"] == "neuron"
        assert sorted(rep["cases"]) == sorted(case_names(world)), f"rank {rank} reported other cases"


@pytest.mark.parametrize(("world", "case"), [(w, c) for w in (2, 4) for c in case_names(w)])
def test_collective_matches_gloo(collective_reports: Callable[[int], Reports], world: int, case: str) -> None:
    reports = collective_reports(world)
    members = [rank for rank, rep in enumerate(reports) if rep["cases"][case].get("member", True)]
    assert members, f"{case}: no rank was a member of its group"
    failures = {rank: reports[rank]["cases"][case]["problems"] for rank in members
                if not reports[rank]["cases"][case]["ok"]}
    assert not failures, "\n".join(f"rank {rank}: {'; '.join(p)}" for rank, p in failures.items())


# ---- bad input ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bad_input_reports() -> Reports:
    """Each rank's report of the bad-input lifecycle (one launch, 2 ranks)."""
    return run_on_ranks(SCRIPTS / "bad_input.py", 2, timeout=600)


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_call_raises_clearly_on_every_rank_and_the_group_stays_usable(bad_input_reports: Reports,
                                                                           case: str) -> None:
    _, errors, mentions = BAD_CASES[case]
    for rank, rep in enumerate(bad_input_reports):
        result = rep["cases"][case]
        assert result["raised"] == errors[rank], f"rank {rank}: {result}"
        for words in mentions[rank]:
            assert words in result["message"], f"rank {rank}: {words!r} not in {result['message']!r}"
        assert result["usable"], f"rank {rank}: the all_reduce after {case} did not match gloo's"


def test_no_backend_argument_picks_the_neuron_backend(bad_input_reports: Reports) -> None:
    for rep in bad_input_reports:
        no_backend = rep["lifecycle"]["no_backend"]
        # torch 2.13 keeps the backend argument as given ("undefined") for get_backend(), on
        # every device; the backend that runs is in the group's config and class.
        assert no_backend["get_backend"] == "undefined"
        assert no_backend["backend_config"] == "neuron:neuron"
        assert no_backend["neuron_group"] and no_backend["subgroup_neuron"]
        assert no_backend["all_reduce"] and no_backend["subgroup_all_reduce"]


def test_destroy_then_init_again(bad_input_reports: Reports) -> None:
    for rep in bad_input_reports:
        assert rep["lifecycle"]["first_init_usable"]
        assert rep["lifecycle"]["second_init"] == {"get_backend": "neuron", "usable": True}
        assert rep["lifecycle"]["cycles"] == [True] * REINIT_CYCLES


def test_cpu_and_neuron_group_carries_both(bad_input_reports: Reports) -> None:
    for rep in bad_input_reports:
        assert rep["lifecycle"]["mixed"] == {
            "get_backend": "cpu:gloo,neuron:neuron", "cpu_all_reduce": True, "neuron_all_reduce": True,
            "cpu_all_gather": True, "neuron_all_gather": True, "objects": True}


def test_a_dead_rank_makes_the_survivor_raise() -> None:
    survivor, dead = run_on_ranks(SCRIPTS / "dead_rank.py", 2, timeout=300, expect_failure=True)
    assert dead == {}
    assert survivor["first"] == [[2.0] * 4] * 3
    assert survivor["raised"] == "DistBackendError" and survivor["is_dist_backend_error"]
    for words in ("all_reduce on the neuron process group", "rank 0 of 2", "failed in its transport",
                  "timeout 0:00:20"):
        assert words in survivor["message"]


# ---- sends and receives that do not fit ---------------------------------------------------

@pytest.fixture(scope="module")
def point_to_point_reports() -> Reports:
    """Each rank's report of every point-to-point mismatch case (one launch, 2 ranks)."""
    return run_on_ranks(SCRIPTS / "point_to_point_mismatch.py", 2, timeout=300)


@pytest.mark.parametrize("case", sorted(P2P_CASES))
def test_mismatched_send_and_recv_raise_on_both_ranks_and_the_group_stays_usable(
        point_to_point_reports: Reports, case: str) -> None:
    """Before: a smaller recv aborted rank 1 (SIGABRT in gloo), a larger one or another
    dtype returned with wrong data and no error."""
    _, _, errors, words = P2P_CASES[case]
    for rank, rep in enumerate(point_to_point_reports):
        result = rep["cases"][case]
        assert result["raised"] == errors[rank], f"rank {rank}: {result}"
        for w in words or P2P_CPU_WORDS[rank]:
            assert w in result["message"], f"rank {rank}: {w!r} not in {result['message']!r}"
        assert result["untouched"], f"rank {rank}: the receive's tensor changed although nothing was sent"
        assert result["usable"], f"rank {rank}: the matching send/recv and all_reduce after {case} failed"
    if errors[0] == errors[1]:  # both ranks say the same
        assert point_to_point_reports[0]["cases"][case]["message"] == point_to_point_reports[1]["cases"][case]["message"]


def test_sends_progress_while_their_rank_blocks_in_a_receive(point_to_point_reports: Reports) -> None:
    for rep in point_to_point_reports:
        assert rep["cases"]["progress"] == {"isend_then_recv": True, "irecv_then_send": True}
