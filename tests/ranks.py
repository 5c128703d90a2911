"""Multi-process tests: run a script on N ranks with torchrun, collect what each rank reports.

Test side::

    reports = run_on_ranks(SCRIPTS / "collectives.py", nproc=2)   # one dict per rank

Rank side (a script in ``tests/rank_scripts/``)::

    from ranks import report
    report({"case": value, ...})        # JSON-able; once per rank, at the end

A rank that fails, hangs or never reports fails the test with every rank's output.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["EXAMPLES", "SCRIPTS", "RankFailure", "load_example", "report", "run_example", "run_on_ranks"]

TESTS = Path(__file__).resolve().parent
SCRIPTS = TESTS / "rank_scripts"
EXAMPLES = TESTS.parent / "examples"
_RESULTS_VARIABLE = "NEURON_LAB_TEST_RANK_RESULTS"


class RankFailure(AssertionError):
    """A rank exited with an error, timed out or did not report."""


def run_on_ranks(script: Path, nproc: int, *args: str, timeout: float = 600,
                 env: dict[str, str] | None = None, expect_failure: bool = False) -> list[dict[str, Any]]:
    """Runs ``script`` under ``torchrun --standalone --nproc-per-node nproc`` and returns
    each rank's report, in rank order. With ``expect_failure`` a non-zero exit is allowed
    (the reports of the ranks that got to report are returned, ``{}`` for the others)."""
    with tempfile.TemporaryDirectory(prefix="neuron-ranks-") as results:
        full_env = {**os.environ, "OMP_NUM_THREADS": "1", _RESULTS_VARIABLE: results,
                    "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS), os.environ.get("PYTHONPATH", "")]),
                    **(env or {})}
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                   str(script), *args]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=full_env)
        except subprocess.TimeoutExpired as e:
            raise RankFailure(f"{script.name} on {nproc} ranks did not finish in {timeout:.0f} s\n"
                              f"{_tail(e.stdout)}\n{_tail(e.stderr)}") from None
        reports = []
        for rank in range(nproc):
            path = Path(results) / f"rank{rank}.json"
            reports.append(json.loads(path.read_text()) if path.exists() else None)
    if (done.returncode != 0 and not expect_failure) or (not expect_failure and None in reports):
        missing = [r for r, rep in enumerate(reports) if rep is None]
        raise RankFailure(f"{script.name} on {nproc} ranks exited with {done.returncode}; ranks without a report: "
                          f"{missing}\n--- stdout\n{_tail(done.stdout)}\n--- stderr\n{_tail(done.stderr)}")
    return [rep if rep is not None else {} for rep in reports]


def run_example(file_name: str, nproc: int = 2) -> list[float]:
    """``torchrun --standalone --nproc-per-node 2 examples/<file_name>`` from the repository
    root, as a user runs it; the per-step losses rank 0 printed (``step N loss X``, one line
    per step, in order)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(TESTS.parent), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               str(Path("examples") / file_name)]
    done = subprocess.run(command, check=False, cwd=TESTS.parent, capture_output=True, text=True, timeout=600,
                          env=env)
    if done.returncode != 0:
        raise RankFailure(f"{file_name} exited with {done.returncode}\n{_tail(done.stdout)}\n{_tail(done.stderr)}")
    steps = re.findall(r"^step (\d+) loss ([0-9.e+-]+)$", done.stdout, flags=re.MULTILINE)
    assert steps and [int(s) for s, _ in steps] == list(range(len(steps))), f"one line per step:\n{done.stdout}"
    return [float(loss) for _, loss in steps]


def load_example(file_name: str) -> ModuleType:
    """``examples/<file_name>`` imported as a module (its model, batches and constants)."""
    spec = importlib.util.spec_from_file_location(f"example_{Path(file_name).stem}", EXAMPLES / file_name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mse_losses(model: Any, optimizer: Any, batch: Any, steps: int) -> list[float]:
    """Per-step MSE losses of ``model`` trained in this process on ``batch(step)``: the
    single-process reference an example's printed losses are compared with."""
    import torch.nn.functional as F

    losses = []
    for step in range(steps):
        x, y = batch(step)
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def report(values: dict[str, Any]) -> None:
    """Rank side: hands this rank's results to ``run_on_ranks`` (call once, at the end)."""
    rank = int(os.environ["RANK"])
    path = Path(os.environ[_RESULTS_VARIABLE]) / f"rank{rank}.json"
    path.write_text(json.dumps(values))


def _tail(text: str | bytes | None, chars: int = 6000) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return (text or "")[-chars:]
