"""Every collective of the neuron c10d backend against gloo on CPU, and its bad input.

Each torchrun launch covers many cases (a launch costs seconds of process start): the
rank scripts report one result per case and the tests here check each case on each rank.
``rank_scripts/collectives.py`` compares every collective with gloo on 2 and 4 ranks;
``rank_scripts/bad_input.py`` checks that bad calls raise clear errors on every rank and
leave the group usable; ``rank_scripts/dead_rank.py`` kills a rank before a collective.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ranks import SCRIPTS, run_on_ranks
from rank_scripts.collectives import case_names


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
