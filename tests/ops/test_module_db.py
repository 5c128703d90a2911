"""PyTorch's module database on neuron: one test per ModuleInfo of ``module_db`` and
execution mode (the default, adaptive, and blocking), against the CPU.

What each case checks (forward, gradients, buffers, state_dict round trips, deepcopy,
pickle) is in ``tests/module_db_support.py``. CI runs ``NEURON_MODULE_SAMPLES``
(default 2) inputs per module and train/eval mode; the full sweep with its pass rate
is ``scripts/sweep.py --db modules``.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the shared helpers

import module_db_support as support  # noqa: E402
from isolated import assert_passed  # noqa: E402


@pytest.fixture(scope="module")
def runner():
    r = support.make_runner(support.samples_from_env())
    yield r
    r.close()


@pytest.mark.parametrize("mode", support.MODES)
@pytest.mark.parametrize("module_id", support.all_module_ids())
def test_module(module_id: str, mode: str, runner) -> None:
    assert_passed(runner.run(module_id, mode=mode), f"{module_id} [{mode}]")
