"""Shared fixtures: every test sees the neuron device registered and fresh RNG seeds."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

import neuron_lab  # registers the device


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def replay_tier():
    """Adaptive eager's replay tier only, for tests that compare results bit for bit:
    graphs compiled by earlier tests (Inductor reorders float math, and whether a
    compiled graph is kept depends on timing) are forgotten, and none are compiled."""
    from neuron_lab import adaptive_eager

    compile_before = adaptive_eager.policy()["compile"]
    torch.neuron.synchronize()
    adaptive_eager.clear_graph_cache()
    neuron_lab.configure(compile=False)
    yield
    neuron_lab.configure(compile=compile_before)


@pytest.fixture
def no_stray_frees():
    """Exact memory statistics need every free to be the test's own: collect earlier
    tests' garbage (tensors kept alive by reference cycles, e.g. in saved tracebacks)
    first, and let no collection run midway."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


def run_python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter (for configuration read at import time)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
    )


def run_in_threads(target, count: int) -> list:
    """Runs target(i) for i in range(count) in as many threads, started together;
    returns the results in order and fails the test with any thread's exception."""
    results: list = [None] * count
    errors: list = []
    barrier = threading.Barrier(count)

    def worker(i: int) -> None:
        try:
            barrier.wait()
            results[i] = target(i)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    return results
