"""PyTorch's optimizer database on neuron: one test per optimizer of ``optim_db``,
implementation (for-loop, foreach, fused, differentiable) and execution mode (the
default, adaptive, and blocking), against the CPU.

What each case checks (the parameters after every step, the whole optimizer state and
its round trip) is in ``tests/optim_db_support.py``. CI runs ``NEURON_OPTIM_SAMPLES``
(default 3) configs per case; the full sweep with its pass rate is
``scripts/sweep.py --db optims``.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the shared helpers

import optim_db_support as support  # noqa: E402
from isolated import assert_passed  # noqa: E402


@pytest.fixture(scope="module")
def runner():
    r = support.make_runner(support.samples_from_env())
    yield r
    r.close()


@pytest.mark.parametrize("mode", support.MODES)
@pytest.mark.parametrize("case_id", support.all_case_ids())
def test_optimizer(case_id: str, mode: str, runner) -> None:
    assert_passed(runner.run(case_id, mode=mode), f"{case_id} [{mode}]")
