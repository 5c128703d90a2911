"""OpInfo conformance of the ``neuron`` device: one test per OpInfo of PyTorch's op_db.

Each op that supports float32 on the CPU is checked against the CPU reference
(forward, backward, in-place variant) by ``tests/opinfo_support.py``; see its
docstring for what is compared. Ops run in a crash-isolating worker subprocess,
so a segfault fails only its own test.

CI mode (the default) checks at most ``NEURON_OPINFO_SAMPLES`` (default 2)
samples per op::

    PYTHONPATH=. .venv/bin/python -m pytest tests/ops/test_opinfo.py -p no:cacheprovider -q
    NEURON_OPINFO_SAMPLES=all PYTHONPATH=. .venv/bin/python -m pytest tests/ops/test_opinfo.py -k conv

Ops in ``opinfo_support.EXCLUSIONS`` are reported as skipped with their reason.
For the full sweep with a pass-rate summary use ``scripts/sweep.py --db ops``.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the shared helpers

import opinfo_support as support  # noqa: E402
from isolated import assert_passed  # noqa: E402


@pytest.fixture(scope="module")
def runner():
    r = support.make_runner(support.samples_from_env())
    yield r
    r.close()


@pytest.mark.parametrize("op_id", support.all_op_ids())
def test_opinfo(op_id: str, runner) -> None:
    assert_passed(runner.run(op_id), op_id)
