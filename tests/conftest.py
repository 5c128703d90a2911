"""Shared fixtures: every test sees the neuron device registered and fresh RNG seeds."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import neuron_lab  # noqa: F401  (registers the device)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


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
