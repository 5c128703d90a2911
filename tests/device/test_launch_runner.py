"""Where launches run (neuron_lab/device/launches.py): on the host thread that launches them
where their kernels take every usable CPU, else on the stream's device thread. Either way
results keep the CPU's bits and errors surface at the next wait."""

from __future__ import annotations

import os

import pytest
import torch

import neuron_lab
from neuron_lab import adaptive_eager as ae
from neuron_lab.device import launches
from neuron_lab.device.trace import device_counters, thread_phases, totals

from conftest import run_python


def _runs() -> tuple[int, int, int]:
    counters = device_counters()
    return counters["launches_run_by_host"], counters["launches_run_by_waiting_host"], counters["device_thread_wakeups"]


def _delta(before: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(a - b for a, b in zip(_runs(), before))


def _step(x: torch.Tensor) -> torch.Tensor:
    y = (x * 2 + 1).sin().sum()
    ae.flush()  # a launch that no wait follows at once
    return y


@pytest.fixture(autouse=True)
def _restore_runner():
    previous = launches.launch_runner()
    torch.neuron.synchronize()
    yield
    torch.neuron.synchronize()
    launches.set_launch_runner(previous)


def test_auto_runs_launches_on_the_host_where_kernels_take_every_usable_cpu() -> None:
    cpus = len(os.sched_getaffinity(0))
    launches.set_launch_runner("auto")
    assert launches.host_runs_launches(cpus)
    assert launches.host_runs_launches(cpus + 3)
    assert not launches.host_runs_launches(cpus - 1)
    launches.set_launch_runner("device_thread")
    assert not launches.host_runs_launches(cpus)
    launches.set_launch_runner("host")
    assert launches.host_runs_launches(1)


@pytest.mark.usefixtures("graphs_recorded_on_host")
@pytest.mark.parametrize("runner", ["host", "device_thread"])
def test_each_runner_runs_the_launch_where_it_says(runner: str) -> None:
    x = torch.randn(4096, device="neuron")
    torch.neuron.synchronize()
    launches.set_launch_runner(runner)
    for _ in range(3):
        _step(x)  # the graph is built, then repeats
    torch.neuron.synchronize()
    before = _runs()
    results = [_step(x) for _ in range(10)]
    by_host, by_waiting_host, wakeups = _delta(before)
    if runner == "host":
        assert (by_host, wakeups) == (10, 0), (by_host, by_waiting_host, wakeups)
    else:
        assert by_host == 0 and wakeups >= 1, (by_host, by_waiting_host, wakeups)
    expected = (x.cpu() * 2 + 1).sin().sum()
    assert all(torch.equal(r.cpu(), expected) for r in results)


def test_a_launch_the_host_runs_keeps_the_reduction_bits_of_its_thread_count() -> None:
    """The host runs the launch with the launching thread's thread count, as the device
    thread does: a 4M-element sum, which ATen splits by thread count, keeps the CPU's bits."""
    assert torch.get_num_threads() >= 2, "needs at least 2 intra-op threads to split the sum"
    torch.manual_seed(0)
    x = torch.randn(4_000_000)
    expected = x.sum()
    on_device = x.to("neuron")
    for runner in ("host", "device_thread"):
        launches.set_launch_runner(runner)
        for _ in range(3):
            assert torch.equal((on_device * 1.0).sum().cpu(), expected), runner


def test_an_error_in_a_launch_the_host_runs_surfaces_at_the_next_wait() -> None:
    """A value check that fails inside a launch the host ran at once is kept on the stream
    and raised at the next wait, as for a launch the device thread runs; the stream and
    every tensor computed before stay usable."""
    launches.set_launch_runner("host")
    kept = torch.arange(6.0, device="neuron") * 2
    torch.neuron.synchronize()
    with neuron_lab.mode("adaptive"):
        src = torch.zeros(3, device="neuron")
        index = torch.tensor([0, 1, 34], device="neuron")
        bad = src.scatter_add(0, index, torch.ones(3, device="neuron"))
        ae.flush()  # the host runs the launch now; the error waits for the wait
        with pytest.raises(RuntimeError, match="out of bounds"):
            torch.neuron.synchronize()
    del bad
    assert torch.equal(kept.cpu(), torch.arange(6.0) * 2)
    assert (kept + 1).sum().item() == 36.0


def test_a_bad_launch_runner_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="auto, device_thread, host"):
        launches.set_launch_runner("gpu")
    assert launches.launch_runner() in set(launches.LaunchRunner)
    result = run_python("import torch; torch.zeros(1, device='neuron')", env={"NEURON_LAB_LAUNCH_RUNNER": "sometimes"})
    assert result.returncode != 0
    assert "NEURON_LAB_LAUNCH_RUNNER='sometimes' is not a launch runner; use one of auto, device_thread, host" in result.stderr


def test_the_environment_chooses_the_runner_at_import() -> None:
    result = run_python(
        "import torch, neuron_lab.device.launches as l; torch.zeros(1, device='neuron'); print(l.launch_runner())",
        env={"NEURON_LAB_LAUNCH_RUNNER": "Device_Thread"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "device_thread"


_HOST_RUNS_HEAVY_LAUNCHES = """
import torch
from neuron_lab import adaptive_eager as ae
from neuron_lab.device import launches
from neuron_lab.device.trace import thread_phases, totals
launches.set_launch_runner("host")
x = torch.randn(384, 384, device="neuron")
torch.neuron.synchronize()
phases, recorded = thread_phases(), totals()["record_ns"]
for _ in range(3):
    y = x
    for _ in range(8):
        y = (y @ x).tanh()
    ae.flush()
after = thread_phases()
print(after["running_ops_ns"] - phases["running_ops_ns"], after["recording_ns"] - phases["recording_ns"],
      totals()["record_ns"] - recorded)
"""


def test_a_launch_the_host_runs_counts_as_running_ops_not_recording() -> None:
    """The per-cell line's parts stay what they say: the time the host spends running a
    launch it just made is running ops, and the recording that made it stays small (in this
    thread's phases, and in the process's recording total: a fresh process, so that no other
    thread records meanwhile)."""
    result = run_python(_HOST_RUNS_HEAVY_LAUNCHES)
    assert result.returncode == 0, result.stderr
    ran, recording, record_total = map(int, result.stdout.split()[-3:])
    assert ran > 5 * recording, (ran, recording)
    assert ran > 5 * record_total, (ran, record_total)


def test_launches_run_where_auto_decides_unless_chosen_otherwise() -> None:
    """The default is ``auto``: the host runs a launch where its kernels take every usable CPU."""
    code = "import torch, neuron_lab.device.launches as l; torch.zeros(1, device='neuron'); print(l.launch_runner())"
    result = run_python(code, unset=("NEURON_LAB_LAUNCH_RUNNER",))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "auto"
