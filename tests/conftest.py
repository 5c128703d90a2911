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


@pytest.fixture(autouse=True)
def _recording() -> None:
    """Each test starts recording ops: an earlier test's varied shapes (graphs that never
    repeated) would otherwise have the runtime run ops at once (configure's
    run_unrepeated_at_once), which tests of fused graphs do not expect."""
    import neuron_lab.adaptive_eager as ae

    ae.forget_repeats()


MODES = ("eager", "adaptive", "blocking")


@pytest.fixture(params=MODES)
def mode(request):
    """A test that takes ``mode`` runs once in each of the device's modes (a test module's
    own ``parametrize("mode", ...)`` takes precedence)."""
    with neuron_lab.mode(request.param):
        yield request.param
    torch.neuron.synchronize()


# ---- a real IPython shell (tests of the Jupyter layer) -----------------------------------


@pytest.fixture(scope="module")
def shell(tmp_path_factory):
    """One InteractiveShell per test module, with plain-text tracebacks."""
    from IPython.core.interactiveshell import InteractiveShell

    os.environ.setdefault("IPYTHONDIR", str(tmp_path_factory.mktemp("ipython")))
    shell = InteractiveShell.instance()
    shell.run_line_magic("colors", "nocolor")  # plain text tracebacks, as a terminal without colours
    shell.user_ns["torch"] = torch
    gc.collect()
    gc.freeze()  # the per-test collections below then only walk this module's new objects
    yield shell
    gc.unfreeze()


def unload_extension(shell) -> None:
    """%unload_ext neuron_lab, and stops a timer a dashboard started without the extension."""
    from IPython.utils.capture import capture_output

    from neuron_lab.magics.autotime import timer_for

    with capture_output():
        shell.run_line_magic("unload_ext", "neuron_lab")
        timer = timer_for(shell)
        if timer is not None:
            timer.detach()


@pytest.fixture
def ip(shell):
    """The shell with the extension loaded, in adaptive mode; unloaded afterwards."""
    from IPython.utils.capture import capture_output

    previous_mode = neuron_lab.get_mode()
    neuron_lab.set_mode("adaptive")
    gc.collect()  # a collection inside a cell would free earlier tests' tensors in that cell
    gc.disable()
    with capture_output():
        shell.run_line_magic("load_ext", "neuron_lab")
    yield shell
    unload_extension(shell)
    shell.ast_node_interactivity = "last_expr"
    gc.enable()
    torch.neuron.synchronize()
    neuron_lab.set_mode(previous_mode)


@pytest.fixture
def adaptive_runtime():
    """Adaptive mode with the default policy and no pending work, before and after the test
    (which may change the mode or the policy freely)."""
    from neuron_lab import adaptive_eager

    torch.neuron.synchronize()
    previous_mode, previous_policy = neuron_lab.get_mode(), adaptive_eager.policy()
    neuron_lab.set_mode("adaptive")
    adaptive_eager.reset_counters()
    try:
        yield
    finally:
        try:
            torch.neuron.synchronize()
        finally:
            neuron_lab.set_mode(previous_mode)
            neuron_lab.configure(**previous_policy)


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
def launches_on_device_thread():
    """For tests of the device thread's own mechanics (wake-ups, hand-offs, its OpenMP
    workers): launches go to the stream's device thread on any machine, and their small graphs
    stay recorded. Under ``auto`` a machine whose kernels take every CPU runs them on the host
    (neuron_lab/device/launches.py); on the device thread, configure's run_at_once_if_cheaper
    would run ops at once where recording them costs the host more than it moves there."""
    from neuron_lab.device.launches import launches_run_on

    torch.neuron.synchronize()
    with neuron_lab.configured(run_at_once_if_cheaper=False), launches_run_on("device_thread"):
        yield
        torch.neuron.synchronize()


@pytest.fixture
def graphs_recorded_on_host():
    """For tests of recording itself (the graph cache, joins, the rules that decide whether
    graphs repeat, where launches run): graphs stay recorded whoever runs launches. Where the
    host runs them, configure's run_at_once_on_host would otherwise run ops at once after 8
    launches (RepeatTracker::kHostRunsWindow) on a machine whose kernels take every CPU; on a
    device thread, run_at_once_if_cheaper would where recording costs the host more than it
    moves to the device (the small ops of most tests)."""
    with neuron_lab.configured(run_at_once_on_host=False, run_at_once_if_cheaper=False):
        yield


@pytest.fixture
def no_stray_frees():
    """Exact memory statistics need every free to be the test's own: collect earlier
    tests' garbage (tensors kept alive by reference cycles, e.g. in saved tracebacks)
    first, and let no collection run midway."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


def run_python(code: str, env: dict[str, str] | None = None, unset: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter (for configuration read at import time), with
    ``env`` added to this process's environment and the variables in ``unset`` removed."""
    full_env = {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in unset}
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
