"""A notebook cell on N ranks: ``neuron_lab.launch.run_on_ranks`` and ``%%neuron_distributed``.

Each launch starts fresh processes under torchrun (seconds each on this machine), so a few
module-scoped runs cover the cases: one successful profiled run of the twin, the same cell
through the magic in a real InteractiveShell, a cell failing on rank 1 only, and a cell
that hangs. Everything else (bad input, messages, the result's display) needs no launch.
"""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

import neuron_lab.launch as nd
from neuron_lab.launch import RankError, RanksResult, RankTimeoutError, compare_timelines, run_on_ranks
from neuron_lab.launch.job import CellError, Outcome
from neuron_lab.launch.rank_main import _keep_value
from neuron_lab.launch.runner import _launcher_summary
from neuron_lab.launch.result import failure_message

from conftest import unload_extension

# Rank r starts from arange(4) + r; two all_reduces of float32[4]: 16 bytes each, on each rank.
CELL = """\
x = torch.arange(4.0, device=device) + rank
print(f"rank {rank} of {world_size} on {device}: scale {scale}")
for _ in range(steps):
    dist.all_reduce(x)
import sys
print(f"to stderr from {rank}", file=sys.stderr)
{"rank": rank, "x": (x * scale).tolist()}
"""
ALL_REDUCE_LINE = 4  # of CELL
PUSH = {"scale": 3.0, "steps": 2}


def expected_value() -> dict:
    x = sum(torch.arange(4.0) + r for r in range(2))  # the first all_reduce
    for _ in range(PUSH["steps"] - 1):
        x = x * 2                                       # each further one sums two equal tensors
    return {"rank": 0, "x": (x * PUSH["scale"]).tolist()}


TWIN_PROGRESS: list[str] = []  # what the twin's run said while its ranks started


@pytest.fixture(scope="module")
def twin() -> tuple[RanksResult, str, str]:
    out, err = io.StringIO(), io.StringIO()
    TWIN_PROGRESS.clear()
    result = run_on_ranks(CELL, 2, push=PUSH, profile=True, stdout=out, stderr=err, timeout=300,
                          progress=TWIN_PROGRESS.append)
    return result, out.getvalue(), err.getvalue()


def is_progress(output) -> bool:
    return output.data.get("text/plain", "").startswith("%%neuron_distributed: ")


@pytest.fixture(scope="module")
def magic(shell: InteractiveShell):
    """The same cell through %%neuron_distributed: (ExecutionResult, printed text, rich outputs, result)."""
    with capture_output():
        shell.run_line_magic("load_ext", "neuron_lab")
    shell.user_ns.update(PUSH)
    try:
        with capture_output() as captured:
            executed = shell.run_cell("%%neuron_distributed -n 2 --push scale,steps --profile --timeout 300 -o run\n"
                                      + CELL, store_history=True)
        yield executed, captured.stdout, captured.stderr, captured.outputs, shell.user_ns.get("run")
    finally:
        unload_extension(shell)


@pytest.fixture(scope="module")
def rank1_failure() -> RankError:
    code = "x = torch.ones(2, device=device)\nif rank == 1:\n    learning_rate * 2\ndist.all_reduce(x)\n"
    with pytest.raises(RankError) as caught:
        run_on_ranks(code, 2, stdout=io.StringIO(), stderr=io.StringIO(), timeout=300)
    return caught.value


# ---- the twin ------------------------------------------------------------------------------


def test_rank_0s_last_expression_comes_back(twin) -> None:
    result, _, _ = twin
    assert result.has_value
    assert result.value == expected_value()
    assert result.value_repr == repr(expected_value())


def test_output_is_labelled_by_rank_on_its_stream(twin) -> None:
    result, out, err = twin
    assert sorted(out.splitlines()) == [f"[rank {r}] rank {r} of 2 on neuron:{r}: scale 3.0" for r in range(2)]
    assert sorted(err.splitlines()) == [f"[rank {r}] to stderr from {r}" for r in range(2)]
    for r, report in enumerate(result.ranks):
        assert report.stdout == [f"rank {r} of 2 on neuron:{r}: scale 3.0"]
        assert report.stderr == [f"to stderr from {r}"]


def test_bytes_moved_by_the_all_reduces_are_exact(twin) -> None:
    result, _, _ = twin
    for report in result.ranks:
        assert report.collectives == {"all_reduce": {"count": 2, "bytes_moved": 2 * 4 * 4}}
        assert report.bytes_moved == 32
    assert result.bytes_moved == [32, 32]


def test_each_rank_reports_its_device_and_times_and_the_slowest_is_one_of_them(twin) -> None:
    result, _, _ = twin
    assert [r.device for r in result.ranks] == ["neuron:0", "neuron:1"]
    for report in result.ranks:
        assert report.wall_s > 0 and report.device_s > 0 and report.collective_s > 0
    assert result.slowest_rank in (0, 1)
    assert result.slowest_rank == max(result.ranks, key=lambda r: (r.compute_s, -r.rank)).rank


def test_profiles_hold_each_rank_s_launches_on_its_own_core(twin) -> None:
    result, _, _ = twin
    for rank, profile in enumerate(result.profiles):
        collectives = [l for l in profile.launches if l.name == "c10d::all_reduce"]
        assert len(collectives) == PUSH["steps"]
        assert {l.device for l in profile.launches if l.kind != "event"} == {rank}
        assert {l.source.line for l in collectives} == {ALL_REDUCE_LINE}
    figure = compare_timelines({"first": result, "again": result})
    titles = [ax.get_title(loc="left") for ax in figure.axes]
    assert titles == ["rank 0 (neuron:0)", "rank 1 (neuron:1)"] * 2
    assert [ax.get_title(loc="left") for ax in result.timeline().axes] == titles[:2]


def test_the_result_displays_as_html_and_text(twin) -> None:
    result, _, _ = twin
    text, page = repr(result), result._repr_html_()
    for shown in (text, page):
        assert f"slowest rank {result.slowest_rank}" in shown
        assert "all_reduce" in shown and "2 x, 32 B" in shown
        assert "neuron:1" in shown
    assert "<table" in page and "<table" not in text
    assert repr(expected_value()) in text


# ---- the magic, the twin's wrapper -------------------------------------------------------


def test_the_magic_gives_what_the_twin_gives(magic, twin) -> None:
    executed, out, _, outputs, run = magic
    result, twin_out, _ = twin
    assert executed.error_in_exec is None and executed.error_before_exec is None, out
    assert executed.result == result.value == expected_value()
    assert isinstance(run, RanksResult)
    assert [r.collectives for r in run.ranks] == [r.collectives for r in result.ranks]
    assert [r.stdout for r in run.ranks] == [r.stdout for r in result.ranks]
    assert [r.stderr for r in run.ranks] == [r.stderr for r in result.ranks]
    assert sorted(line for line in out.splitlines() if line.startswith("[rank")) == sorted(twin_out.splitlines())
    results = [o for o in outputs if not is_progress(o)]
    assert [sorted(o.data) for o in results] == [["text/html", "text/plain"], ["image/png", "text/plain"]]
    # While the ranks started, one line said what was happening, updated in place; it ends on the summary.
    progress = [o for o in outputs if is_progress(o)]
    assert progress and progress[0].data["text/plain"].startswith("%%neuron_distributed: launching 2 rank"), progress
    assert "2 ranks up after" in progress[-1].data["text/plain"], progress[-1].data
    assert all(o.update for o in progress[1:]), "later progress lines must replace the first, not pile up"
    assert "slowest rank" in results[0].data["text/plain"]
    # Under the magic's line, the cell's lines are numbered as the notebook shows them.
    for profile in run.profiles:
        assert {l.source.line for l in profile.launches if l.name == "c10d::all_reduce"} == {ALL_REDUCE_LINE + 1}


def test_the_twin_says_each_phase_of_the_start_up_in_order(twin) -> None:
    lines = TWIN_PROGRESS
    assert lines[0] == "launching 2 rank processes under torchrun", lines
    phases = [next((i for i, l in enumerate(lines) if l.startswith(p)), None)
              for p in ("launching", "running the cell on 2 ranks")]
    assert None not in phases and phases == sorted(phases), lines
    assert any("first output after" in l for l in lines), lines
    summary = lines[-1]
    assert summary.startswith("2 ranks up after") and "rendezvous" in summary and "done after" in summary, summary
    assert len(lines) == len(set(lines)), "a line is reported only when it changes"


def test_the_magic_is_registered_by_load_ext_and_removed_by_unload(shell: InteractiveShell) -> None:
    with capture_output():
        shell.run_line_magic("load_ext", "neuron_lab")
    assert "neuron_distributed" in shell.magics_manager.magics["cell"]
    assert "DistributedMagics" in shell.magics_manager.registry
    unload_extension(shell)
    assert "neuron_distributed" not in shell.magics_manager.magics["cell"]
    assert "DistributedMagics" not in shell.magics_manager.registry


@pytest.mark.parametrize("cell, message", [
    ("%%neuron_distributed -n 0\nx = 1", "at least 1"),
    ("%%neuron_distributed --timeout -1\nx = 1", ">= 0"),
    ("%%neuron_distributed\n   \n", "the cell is empty"),
    ("%%neuron_distributed --push not_a_variable\nx = 1", "no variable 'not_a_variable'"),
    ("%%neuron_distributed --push 'a b'\nx = 1", "variable names separated by commas"),
    ("%%neuron_distributed --push rank_fn\nx = 1", "cannot be sent to the ranks"),
    ("%%neuron_distributed --push world_size\nx = 1", "defined by every rank itself"),
    ("%%neuron_distributed\nx = 1\n!ls\n", "line 3 of the cell uses IPython syntax"),
    ("%%neuron_distributed -o 1x\nx = 1", "-o needs a variable name"),
])
def test_bad_options_are_usage_errors_before_any_rank_starts(shell: InteractiveShell, cell: str, message: str) -> None:
    with capture_output():
        shell.run_line_magic("load_ext", "neuron_lab")
    shell.user_ns.update(rank_fn=lambda: 1, world_size=2)
    try:
        with capture_output() as captured:
            executed = shell.run_cell(cell)
        error = executed.error_in_exec or executed.error_before_exec
        assert isinstance(error, UsageError), captured.stdout + captured.stderr
        assert message in str(error)
        assert "Traceback" not in captured.stdout + captured.stderr
    finally:
        unload_extension(shell)


# ---- failures ------------------------------------------------------------------------------


def test_an_error_on_rank_1_names_rank_1_the_line_and_the_error(rank1_failure: RankError) -> None:
    message = str(rank1_failure)
    assert message.startswith("the cell failed on rank 1 (of 2 ranks)\n"), message
    assert "rank 1 at line 3 of the cell: learning_rate * 2" in message
    assert "NameError: name 'learning_rate' is not defined" in message
    assert 'File "' in message and "line 3, in <module>" in message  # rank 1's traceback
    own = {r: e for r, e in rank1_failure.failures.items() if not e.transport}
    assert list(own) == [1] and own[1].type_name == "NameError" and own[1].line == 3
    # rank 0 was waiting in its all_reduce: stopped by torchrun, or its collective failed
    assert ("rank 0: stopped when rank 1 failed" in message
            or "rank 0: its collective at line 4 failed when rank 1 failed" in message), message


def test_a_name_error_says_notebook_variables_are_not_in_the_ranks(rank1_failure: RankError) -> None:
    message = str(rank1_failure)
    assert "the notebook's variables are not defined in them" in message
    assert "push={'learning_rate': learning_rate}" in message and "--push learning_rate" in message


def test_the_caller_stays_usable_after_a_failure(rank1_failure: RankError) -> None:
    x = torch.ones(3, device="neuron") * 2
    assert x.sum().item() == 6.0
    assert rank1_failure.outputs == [([], []), ([], [])]  # the cell printed nothing


def test_a_hanging_cell_is_stopped_at_its_timeout_with_its_ranks_killed() -> None:
    code = "t = torch.zeros(2, device=device)\ndist.recv(t, src=1 - rank)  # both wait: never sent\n"
    with pytest.raises(RankTimeoutError) as caught:
        run_on_ranks(code, 2, timeout=1, stdout=io.StringIO(), stderr=io.StringIO())
    assert "did not finish on 2 ranks within timeout=1 s" in str(caught.value)
    assert len(caught.value.killed) == 2
    for pid in caught.value.killed:
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"), pid


def test_several_failed_ranks_are_all_named() -> None:
    errors = {0: CellError("ValueError", "bad lr", 2, "check(lr)", "Traceback ...\nValueError: bad lr"),
              1: CellError("ZeroDivisionError", "division by zero", 5, "1 / 0", "")}
    message = failure_message(2, errors, [])
    assert message.startswith("the cell failed on ranks 0, 1 (of 2 ranks)")
    assert "rank 0 at line 2 of the cell: check(lr)\nValueError: bad lr" in message
    assert "rank 1 at line 5 of the cell: 1 / 0\nZeroDivisionError: division by zero" in message


def test_a_rank_that_died_is_named_and_its_peers_failures_are_consequences() -> None:
    lost = {0: CellError("torch.distributed.DistBackendError", "peer gone", 4, "dist.all_reduce(x)", "", transport=True)}
    message = failure_message(2, lost, [1], launcher_tail="worker 1 exited with signal 9")
    assert message.startswith("rank 1 (of 2 ranks) exited without a report: the process died")
    assert "rank 0: its collective at line 4 failed when rank 1 failed" in message
    assert "worker 1 exited with signal 9" in message


def test_torchrun_s_summary_of_failed_workers_is_what_the_error_quotes() -> None:
    lines = ["Traceback (most recent call last):", '  File "run.py", line 1', "ChildFailedError:",
             "=" * 20, "neuron_lab.launch.rank_main FAILED", "-" * 20, "Failures:", "[1]:",
             "  exitcode  : -9 (pid: 123)"]
    assert _launcher_summary(lines).splitlines() == lines[3:]
    assert _launcher_summary(["one", "two"]) == "one\ntwo"


# ---- bad input to the twin (nothing starts) ------------------------------------------------


@pytest.mark.parametrize("kwargs, error, message", [
    ({"code": "", "nproc": 2}, ValueError, "no code"),
    ({"code": 3, "nproc": 2}, TypeError, "given as a str"),
    ({"code": "x = 1", "nproc": 0}, ValueError, "nproc must be"),
    ({"code": "x = 1", "nproc": 2, "timeout": 0}, ValueError, "timeout must be"),
    ({"code": "x = 1", "nproc": 2, "push": {"rank": 3}}, ValueError, "defined by every rank itself"),
    ({"code": "x = 1", "nproc": 2, "push": {"my lr": 3}}, ValueError, "not a variable name"),
    ({"code": "x = 1", "nproc": 2, "push": {"f": lambda: 1}}, ValueError, "cannot be sent to the ranks"),
    ({"code": "x = 1", "nproc": 2, "push": [("lr", 1)]}, TypeError, "push must be a dict"),
])
def test_bad_arguments_fail_before_any_rank_starts(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        run_on_ranks(**kwargs)


def test_values_of_notebook_classes_cannot_be_pushed() -> None:
    notebook_class = type("Config", (), {"__module__": "__main__"})  # as a class defined in a notebook
    with pytest.raises(ValueError, match=r"'config' \(Config\) cannot be sent.*defined in the notebook"):
        run_on_ranks("x = 1", 2, push={"config": notebook_class()})


def test_a_syntax_error_is_raised_at_once_with_the_cell_s_line() -> None:
    with pytest.raises(SyntaxError) as caught:
        run_on_ranks("x = 1\ny = (\n", 2, first_line=2)
    assert caught.value.lineno == 3


def test_a_value_that_cannot_be_pickled_stays_in_the_ranks_with_its_repr() -> None:
    outcome = Outcome(rank=0, world_size=1, device="neuron:0")
    _keep_value(lambda: 1, outcome)  # what rank 0 does with its last expression
    assert outcome.has_value and outcome.value is None and "<lambda>" in outcome.value_repr
    result = RanksResult([outcome], [([], [])], elapsed_s=1.0)
    with pytest.raises(ValueError, match="could not come back to the caller.*picklable data"):
        result.value
    assert "stays in the ranks" in repr(result) and "stays in the ranks" in result._repr_html_()
    kept = Outcome(rank=0, world_size=1, device="neuron:0")
    _keep_value({"loss": [0.5]}, kept)
    assert pickle.loads(kept.value) == {"loss": [0.5]}
    assert RanksResult([kept], [([], [])], elapsed_s=1.0).value == {"loss": [0.5]}


def test_an_unprofiled_run_says_how_to_get_timelines() -> None:
    result = RanksResult([Outcome(rank=0, world_size=1, device="neuron:0")], [([], [])], elapsed_s=1.0)
    with pytest.raises(ValueError, match="profile=True"):
        result.timeline()


def test_the_package_exports_the_runner_and_the_backend_does_not_load_it() -> None:
    assert nd.run_on_ranks is run_on_ranks and "run_on_ranks" in nd.__all__
    from conftest import run_python

    done = run_python("import sys, neuron_lab, neuron_lab.distributed; "
                      "print(sorted(m for m in sys.modules if m.startswith('neuron_lab.launch')))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# ---- the ranks and their folder go with the caller; the stores listen on loopback -------------

SLEEPING_CELL = "import time\ntime.sleep(300)\n"
_REPOSITORY = Path(__file__).resolve().parents[2]


def _caller_environment(tmp: Path) -> dict[str, str]:
    """The caller's environment: its cell folder under ``tmp`` (TMPDIR), this checkout's neuron_lab."""
    import os

    path = os.pathsep.join([str(_REPOSITORY), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


def _cell_folder_once_ranks_run(tmp: Path, alive: Callable[[], bool], timeout: float = 240) -> Path:
    """The caller's cell folder under ``tmp``, once both ranks started the cell."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert alive(), "the caller exited before its ranks started"
        for folder in tmp.glob("neuron-cell-*"):
            if all((folder / f"rank{r}.started").exists() for r in range(2)):
                return folder
        time.sleep(0.1)
    raise AssertionError(f"the ranks did not start within {timeout} s")


def _still_running(processes: list[psutil.Process]) -> list[str]:
    running = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                running.append(f"{p.pid} {' '.join(p.cmdline()[:4])}")
        except psutil.NoSuchProcess:
            pass
    return running


def _gone_within(processes: list[psutil.Process], folder: Path, seconds: float) -> tuple[list[str], bool]:
    """Waits until every process ended and the folder is removed; what is left after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and (_still_running(processes) or folder.exists()):
        time.sleep(0.1)
    return _still_running(processes), folder.exists()


def _below(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGTERM", "SIGINT"])
def test_ranks_and_folder_go_with_the_caller(tmp_path: Path, signal_name: str) -> None:
    """The process that called run_on_ranks (a kernel) is killed, terminated (what a kernel
    restart or shutdown does to a busy kernel) or interrupted mid-cell: torchrun, its ranks
    and the cell's folder are gone within seconds. Before, torchrun and the ranks ran on
    (their own session) and the folder stayed, but for the interrupt."""
    import signal

    def as_a_kernel_starts() -> None:  # SIGINT raises KeyboardInterrupt, whatever this process ignores
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    caller = subprocess.Popen([sys.executable, "-c", f"from neuron_lab.launch import run_on_ranks\n"
                                                     f"run_on_ranks({SLEEPING_CELL!r}, 2, timeout=600)"],
                              env=_caller_environment(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              preexec_fn=as_a_kernel_starts)
    try:
        folder = _cell_folder_once_ranks_run(tmp_path, lambda: caller.poll() is None)
        below = _below(caller.pid)
        assert len(below) >= 3, [p.cmdline() for p in below]  # torchrun and two ranks
        caller.send_signal(getattr(signal, signal_name))
        caller.wait(timeout=60)
        left, folder_left = _gone_within(below, folder, 15)
        assert not left, f"still running after {signal_name} of the caller: {left}"
        assert not folder_left, f"{folder} is still there after {signal_name} of the caller"
    finally:
        if caller.poll() is None:
            caller.kill()
            caller.wait()


def test_a_kernel_killed_and_restarted_during_a_cell_takes_the_ranks_and_folder(tmp_path: Path) -> None:
    """A Jupyter kernel killed and restarted (SIGKILL) while %%neuron_distributed runs.
    (A polite restart, a shutdown request to the busy kernel, already ended the ranks here
    with ipykernel 7.4: the kernel stops the cell, and the runner stopped the ranks.)"""
    from jupyter_client.manager import KernelManager

    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(env=_caller_environment(tmp_path))
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=120)
        client.execute("%load_ext neuron_lab", reply=True, timeout=120)
        client.execute("%%neuron_distributed -n 2 --timeout 600\n" + SLEEPING_CELL)
        kernel_pid = manager.provisioner.pid
        folder = _cell_folder_once_ranks_run(tmp_path, lambda: psutil.pid_exists(kernel_pid))
        below = _below(kernel_pid)
        assert len(below) >= 3, [p.cmdline() for p in below]
        manager.restart_kernel(now=True)
        left, folder_left = _gone_within(below, folder, 20)
        assert not left, f"still running after the kernel's restart: {left}"
        assert not folder_left, f"{folder} is still there after the kernel's restart"
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_torchrun_and_ranks_listen_on_the_loopback_interface_only(tmp_path: Path) -> None:
    """torchrun's stores (rendezvous and the workers' bootstrap store) are unauthenticated:
    another machine must not reach them. Before, torch's TCPStore listened on every interface."""
    caller = subprocess.Popen([sys.executable, "-c", f"from neuron_lab.launch import run_on_ranks\n"
                                                     f"run_on_ranks({SLEEPING_CELL!r}, 2, timeout=600)"],
                              env=_caller_environment(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _cell_folder_once_ranks_run(tmp_path, lambda: caller.poll() is None)
        listening = {}
        for process in _below(caller.pid):
            sockets = [c.laddr for c in process.net_connections("inet") if c.status == psutil.CONN_LISTEN]
            listening[f"{process.pid} {' '.join(process.cmdline()[1:3])}"] = [(a.ip, a.port) for a in sockets]
        torchrun = [name for name in listening if "tied_torchrun" in name]
        assert torchrun and len(listening[torchrun[0]]) >= 2, listening  # its rendezvous and bootstrap stores
        exposed = {name: [a for a in addresses if a[0] != "127.0.0.1"] for name, addresses in listening.items()}
        assert not any(exposed.values()), f"listening beyond 127.0.0.1: {exposed}"
    finally:
        caller.kill()
        caller.wait()
