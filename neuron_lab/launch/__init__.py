"""Run code on N ranks from Python or a notebook: ``run_on_ranks`` (the plain-Python twin
of ``%%neuron_distributed``) starts the ranks with torchrun, streams each rank's output
labelled by rank, and returns a ``RanksResult`` (rank 0's value, per-rank times, bytes
moved by collectives, the slowest rank, optional profiles).

A workbench layer: it stands on the backend (``neuron_lab.distributed``), the runtime and
observability, and never on the magics, which wrap it.

=========================  ==========================================================
``runner.py``              starts the ranks, streams their output, collects the outcome
``rank_main.py``           one rank: sets up the group, runs the cell, reports (``python -m``)
``job.py``                 the files the caller and the ranks exchange
``result.py``              ``RanksResult``, ``RankReport``, the errors, ``compare_timelines``
=========================  ==========================================================
"""

from __future__ import annotations

from neuron_lab.launch.result import RankError, RankReport, RanksResult, RankTimeoutError, compare_timelines
from neuron_lab.launch.runner import run_on_ranks

__all__ = ["RankError", "RankReport", "RankTimeoutError", "RanksResult", "compare_timelines", "run_on_ranks"]
