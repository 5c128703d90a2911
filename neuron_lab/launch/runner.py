"""Runs a notebook cell on N ranks: ``run_on_ranks(code, nproc)``, the plain-Python twin
of ``%%neuron_distributed``.

The cell goes to a file, torchrun starts N fresh processes with the kernel's own
interpreter, each runs ``neuron_lab.launch.rank_main`` on it, and this module streams
their output into the caller's, each line labelled by its rank, then collects what each
rank reported (``job.py``) into a ``RanksResult`` or raises a ``RankError``/
``RankTimeoutError``. The caller's process (the notebook kernel) runs none of the cell
and stays usable, whatever the ranks do.

torchrun runs tied to the caller (``tied_torchrun.py``): when the kernel goes (interrupt,
restart, shutdown, SIGKILL), the ranks and the cell's folder go with it, and its stores
listen on 127.0.0.1 only (a single-node rendezvous on the loopback interface).
"""

from __future__ import annotations

import io
import os
import pickle
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from neuron_lab.launch import job as cell_job
from neuron_lab.launch import tied_torchrun
from neuron_lab.launch.result import RankError, RanksResult, RankTimeoutError, failure_message

__all__ = ["run_on_ranks", "DEFAULT_TIMEOUT_S", "START_TIMEOUT_S"]

DEFAULT_TIMEOUT_S = 600.0   # for the cell, once every rank is up
START_TIMEOUT_S = 180.0     # for the processes to start and form the group (imports, rendezvous)
_KILL_WAIT_S = 30.0         # torchrun's own grace period for its workers, after SIGTERM
_POLL_S = 0.2               # how often the loop checks the clocks while no output comes
_PREFIX = re.compile(r"^\[rank (\d+)\] ")
_LAUNCHER_TAIL_LINES = 40
_TIED_TORCHRUN = Path(tied_torchrun.__file__)  # run by path: torchrun's process needs no neuron_lab


def run_on_ranks(code: str, nproc: int = 2, *, push: Mapping[str, Any] | None = None,
                 timeout: float | None = DEFAULT_TIMEOUT_S, profile: bool = False,
                 start_timeout: float = START_TIMEOUT_S, first_line: int = 1,
                 stdout: TextIO | None = None, stderr: TextIO | None = None,
                 progress: Callable[[str], None] | None = None) -> RanksResult:
    """Runs ``code`` on ``nproc`` ranks, each a fresh process on its own neuron core, and
    returns what they did (``RanksResult``: rank 0's value, per-rank times, collectives
    and bytes moved, the slowest rank, and with ``profile=True`` each rank's ``Profile``).

    Each rank runs the code as a notebook cell (its last expression is its value; rank
    0's comes back pickled) with the ``"neuron"`` process group already initialised,
    its device set, and these names defined: ``torch``, ``dist`` (``torch.distributed``),
    ``rank``, ``world_size``, ``local_rank`` and ``device`` (``neuron:LOCAL_RANK %
    device_count``), in the caller's execution mode. The caller's variables are **not**
    there: the ranks are fresh processes. Pass picklable values in with ``push``
    (``push={"lr": 0.1}`` defines ``lr`` on every rank); tensors arrive on the device
    they were on.

    Output is printed to ``stdout``/``stderr`` (default: the caller's) as it comes, each
    line labelled ``[rank N]``. An error on any rank raises ``RankError`` naming the
    rank, the line of the cell and the error (every failed rank's, and which ranks were
    stopped because of it). ``timeout`` (seconds, None: no limit) bounds the cell once all
    ranks are up, ``start_timeout`` the start of the processes; past either, every rank is
    killed and ``RankTimeoutError`` raised. ``first_line`` is the number of the code's
    first line where the user sees it (2 under a magic's line), for errors.

    ``progress`` (e.g. ``print``) is called with a line saying what the launch is doing
    while the ranks start, at most once a second: launching (processes started, each
    importing torch and neuron_lab), the rendezvous (ranks that joined the process group),
    the cell running (and when the first output came), then a summary of the start-up.
    """
    __tracebackhide__ = True  # noqa: F841 - the notebook's traceback shows the error, not this function
    _check_arguments(code, nproc, timeout, start_timeout, first_line)
    pushed = _pickle_push(push or {})
    compile("\n" * (first_line - 1) + code, "<cell>", "exec")  # a SyntaxError here, at once, with its line
    import neuron_lab

    folder = Path(tempfile.mkdtemp(prefix="neuron-cell-"))
    run = None
    try:
        (folder / cell_job.CELL_FILE).write_text("\n" * (first_line - 1) + code)
        cell_job.Job(push=pushed, profile=profile, mode=neuron_lab.get_mode()).write(folder)
        run = _Run(folder, nproc, stdout or sys.stdout, stderr or sys.stderr, progress)
        run.wait(timeout, start_timeout)
        outcome = run.outcome()
        run.report(run.summary())
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # before letting torchrun go: it removes what is left
        if run is not None:
            run.release()
    if isinstance(outcome, Exception):
        raise outcome  # from here: the notebook's traceback then ends at run_on_ranks
    return outcome


def _check_arguments(code: str, nproc: int, timeout: float | None, start_timeout: float, first_line: int) -> None:
    if not isinstance(code, str):
        raise TypeError(f"run_on_ranks runs code given as a str, got {type(code).__name__}")
    if not code.strip():
        raise ValueError("run_on_ranks got no code to run: pass the cell's source as a str")
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be a whole number of ranks >= 1, got {nproc!r}")
    for name, value in (("timeout", timeout), ("start_timeout", start_timeout)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise ValueError(f"{name} must be a number of seconds > 0 (or None for timeout), got {value!r}")
    if start_timeout is None:
        raise ValueError("start_timeout must be a number of seconds > 0: processes that never start must not "
                         "hang the caller")
    if isinstance(first_line, bool) or not isinstance(first_line, int) or first_line < 1:
        raise ValueError(f"first_line must be a line number >= 1, got {first_line!r}")


class _NotebookReferences(pickle.Pickler):
    """Refuses objects that pickle by reference to the caller's ``__main__`` (classes and
    functions defined in a notebook): the ranks have no such names to unpickle them by."""

    def reducer_override(self, obj: Any) -> Any:
        kind = obj if isinstance(obj, type) or callable(obj) and hasattr(obj, "__qualname__") else type(obj)
        if getattr(kind, "__module__", None) == "__main__":
            raise pickle.PicklingError(f"{kind.__qualname__} is defined in the notebook (__main__), which the ranks "
                                       f"do not have")
        return NotImplemented


def _pickle_push(push: Mapping[str, Any]) -> bytes:
    """The pushed values, pickled and checked here: a bad one fails before any process starts."""
    if not isinstance(push, Mapping):
        raise TypeError(f"push must be a dict of names to values, e.g. push={{'lr': 0.1}}, got {type(push).__name__}")
    for name, value in push.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"push: {name!r} is not a variable name; use push={{'lr': 0.1}}")
        if name in cell_job.PREDEFINED:
            raise ValueError(f"push: {name!r} is defined by every rank itself ({', '.join(cell_job.PREDEFINED)}); "
                             f"push it under another name")
        buffer = io.BytesIO()
        try:
            _NotebookReferences(buffer).dump(value)
        except Exception as e:  # noqa: BLE001 - any pickling failure is the same problem for the user
            raise ValueError(f"push: {name!r} ({type(value).__name__}) cannot be sent to the ranks: {e}. Push "
                             f"picklable data (numbers, strings, lists, dicts, tensors, state_dicts) and define "
                             f"functions and classes in the cell itself") from None
    return pickle.dumps(dict(push))


class _Run:
    """One torchrun launch: its process, the reader threads of its output, the clocks."""

    def __init__(self, folder: Path, nproc: int, stdout: TextIO, stderr: TextIO,
                 progress: Callable[[str], None] | None = None) -> None:
        self.folder, self.nproc = folder, nproc
        self.sinks = {"stdout": stdout, "stderr": stderr}
        self.outputs: list[tuple[list[str], list[str]]] = [([], []) for _ in range(nproc)]
        self.launcher_lines: list[str] = []
        self.progress = progress
        self.last_report = ""
        self.imported_at: float | None = None  # every rank process runs (torch and neuron_lab imported)
        self.up_at: float | None = None        # every rank joined the process group
        self.first_output_at: float | None = None
        self.started_at = time.monotonic()
        self.report(f"launching {nproc} rank process{'es' if nproc != 1 else ''} under torchrun")
        self.timed_out: str | None = None
        self.killed: list[int] = []
        tie, self._tie = os.pipe()  # torchrun's end closes with this process, however it ends
        try:
            self.process = subprocess.Popen(
                [sys.executable, str(_TIED_TORCHRUN), "--tie", str(tie), "--folder", str(folder), "--",
                 *_loopback_rendezvous(), f"--nproc-per-node={nproc}", "--tee=3", f"--log-dir={folder / 'logs'}",
                 "-m", "neuron_lab.launch.rank_main", str(folder)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                errors="replace", bufsize=1, env=_environment(nproc), start_new_session=True, pass_fds=(tie,))
        except BaseException:
            os.close(self._tie)
            raise
        finally:
            os.close(tie)
        self.lines: queue.Queue[tuple[str, str | None]] = queue.Queue()
        self.readers = [threading.Thread(target=self._read, args=(name, stream), daemon=True,
                                         name=f"neuron-ranks-{name}")
                        for name, stream in (("stdout", self.process.stdout), ("stderr", self.process.stderr))]
        for reader in self.readers:
            reader.start()

    def _read(self, name: str, stream: TextIO) -> None:
        for line in stream:
            self.lines.put((name, line))
        self.lines.put((name, None))

    def wait(self, timeout: float | None, start_timeout: float) -> None:
        """Shows output as it comes until torchrun exits. The clocks: ``start_timeout`` until
        every rank is up, then ``timeout`` until every rank reported (the cell's own time),
        then a grace period for the processes to exit. Past a deadline, or when the caller
        is interrupted, every rank is killed."""
        open_streams = 2
        deadline = self.started_at + start_timeout
        phase = "start"
        try:
            while open_streams:
                try:
                    name, line = self.lines.get(timeout=_POLL_S)
                except queue.Empty:
                    pass
                else:
                    if line is None:
                        open_streams -= 1
                    else:
                        self._show(name, line)
                now = time.monotonic()
                self.report(self.status(now))
                if phase == "start" and self._all_have(cell_job.started_file):
                    phase, deadline = "cell", now + timeout if timeout is not None else float("inf")
                if phase == "cell" and self._all_have(cell_job.outcome_file):
                    phase, deadline = "exit", now + _KILL_WAIT_S
                if now <= deadline:
                    continue
                if phase == "start":
                    self.timed_out = (f"the {self.nproc} rank processes did not start and form their process group "
                                      f"within start_timeout={start_timeout:g} s")
                elif phase == "cell":
                    self.timed_out = f"the cell did not finish on {self.nproc} ranks within timeout={timeout:g} s"
                self._stop()  # in the exit phase: every rank reported, only their exit is late
                break
        except BaseException:  # KeyboardInterrupt (the kernel's interrupt) or anything else: no rank survives
            self._stop()
            raise
        finally:
            self._drain()

    def report(self, text: str) -> None:
        """Hands a new progress line to the caller's ``progress`` (a changed one only)."""
        if self.progress is None or text == self.last_report:
            return
        self.last_report = text
        try:
            self.progress(text)
        except Exception:  # noqa: BLE001 - a broken progress display must not lose the ranks
            self.progress = None

    def status(self, now: float) -> str:
        """What the launch is doing, in whole seconds (a line changes at most once a second)."""
        elapsed = f"{now - self.started_at:.0f} s"
        imported = sum(cell_job.pid_file(self.folder, r).exists() for r in range(self.nproc))
        joined = sum(cell_job.started_file(self.folder, r).exists() for r in range(self.nproc))
        if imported == self.nproc and self.imported_at is None:
            self.imported_at = now
        if joined == self.nproc and self.up_at is None:
            self.up_at = now
        if imported < self.nproc:
            return (f"launching: {imported} of {self.nproc} rank processes have started and imported torch and "
                    f"neuron_lab ({elapsed})")
        if joined < self.nproc:
            return f"rendezvous: {joined} of {self.nproc} ranks have joined the process group ({elapsed})"
        first = ("no output yet" if self.first_output_at is None
                 else f"first output after {self.first_output_at - self.started_at:.1f} s")
        return f"running the cell on {self.nproc} ranks, up after {self.up_at - self.started_at:.1f} s; {first}"

    def summary(self) -> str:
        """The start-up, once the run is over: how long each phase took."""
        if self.up_at is None:
            return f"the {self.nproc} ranks did not all start (after {time.monotonic() - self.started_at:.1f} s)"
        imported = self.imported_at if self.imported_at is not None else self.up_at
        first = ("" if self.first_output_at is None
                 else f"; first output after {self.first_output_at - self.started_at:.1f} s")
        return (f"{self.nproc} ranks up after {self.up_at - self.started_at:.1f} s (processes started and torch "
                f"imported {imported - self.started_at:.1f} s, rendezvous {self.up_at - imported:.1f} s){first}; "
                f"done after {time.monotonic() - self.started_at:.1f} s")

    def _show(self, name: str, line: str) -> None:
        match = _PREFIX.match(line)
        if match is None or int(match.group(1)) >= self.nproc:
            self.launcher_lines.append(line.rstrip("\n"))
            return
        if self.first_output_at is None:
            self.first_output_at = time.monotonic()
            self.report(self.status(self.first_output_at))
        rank = int(match.group(1))
        self.outputs[rank][0 if name == "stdout" else 1].append(line[match.end():].rstrip("\n"))
        sink = self.sinks[name]
        sink.write(line if line.endswith("\n") else line + "\n")
        sink.flush()

    def _drain(self) -> None:
        """Shows what the readers still hold (after a stop, whatever came before the kill)."""
        for reader in self.readers:
            reader.join(timeout=_KILL_WAIT_S)
        while True:
            try:
                name, line = self.lines.get_nowait()
            except queue.Empty:
                return
            if line is not None:
                self._show(name, line)

    def _all_have(self, marker: Callable[[Path, int], Path]) -> bool:
        """Whether every rank wrote its ``marker`` file (started, outcome)."""
        return all(marker(self.folder, r).exists() for r in range(self.nproc))

    def _stop(self) -> None:
        """Kills every rank (SIGKILL: a rank stuck in a collective ignores nothing) and what
        the ranks started: torchrun kills everything below it when asked through the tie,
        and torchrun's own main then ends, closing the output."""
        for rank in range(self.nproc):
            path = cell_job.pid_file(self.folder, rank)
            if not path.exists():
                continue
            pid = int(path.read_text())
            if _is_rank_of(pid, self.folder):
                try:
                    os.kill(pid, signal.SIGKILL)
                    self.killed.append(pid)
                except ProcessLookupError:
                    pass
        try:
            os.write(self._tie, tied_torchrun.STOP)
        except OSError:  # torchrun is gone already
            pass

    def release(self) -> None:
        """Lets torchrun go (it exits, removing the folder if it is still there) and waits
        for it; kills its process group if it lingers."""
        if self._tie >= 0:
            os.close(self._tie)
            self._tie = -1
        try:
            self.process.wait(timeout=_KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        for stream in (self.process.stdout, self.process.stderr):
            stream.close()

    def outcome(self) -> RanksResult | RankError | RankTimeoutError:
        """The ranks' outcomes as a result, or the error that explains what went wrong."""
        elapsed = time.monotonic() - self.started_at
        outcomes = [cell_job.read_outcome(self.folder, r) for r in range(self.nproc)]
        if self.timed_out:
            reported = [o.rank for o in outcomes if o is not None and o.error is None]
            done = f"; ranks {reported} had finished" if reported else ""
            return RankTimeoutError(
                f"{self.timed_out}{done}. Every rank process was killed (the caller is unaffected). A rank waiting "
                f"in a collective that another rank never calls hangs: check that every rank calls the same "
                f"collectives in the same order, or raise the timeout (timeout=..., --timeout).",
                self.killed, self.outputs)
        failures = {o.rank: o.error for o in outcomes if o is not None and o.error is not None}
        missing = [r for r, o in enumerate(outcomes) if o is None]
        if failures or missing:
            summary = _launcher_summary(self.launcher_lines)
            return RankError(failure_message(self.nproc, failures, missing, summary), failures, missing, self.outputs)
        return RanksResult(outcomes, self.outputs, elapsed)


def _launcher_summary(lines: list[str]) -> str:
    """torchrun's own account of a failure: its summary of the failed workers (exit codes,
    signals) when it printed one, else its last lines."""
    for i, line in enumerate(lines):
        if line.strip() == "Failures:":
            return "\n".join(lines[max(i - 3, 0):])
    return "\n".join(lines[-_LAUNCHER_TAIL_LINES:])


def _loopback_rendezvous() -> list[str]:
    """torchrun's arguments for one node on the loopback interface: what ``--standalone``
    does, with 127.0.0.1 for the rendezvous store and the workers' store (whose servers
    ``tied_torchrun`` binds to 127.0.0.1)."""
    loopback = tied_torchrun.LOOPBACK
    return ["--nnodes=1", "--rdzv-backend=c10d", f"--rdzv-endpoint={loopback}:0", f"--rdzv-id={uuid.uuid4()}",
            f"--local-addr={loopback}"]


def _environment(nproc: int) -> dict[str, str]:
    """The caller's environment, with this neuron_lab first on the path and unbuffered,
    rank-labelled output."""
    package_root = str(Path(__file__).resolve().parents[2])
    path = [package_root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "PYTHONUNBUFFERED": "1",
           "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank ${rank}] "}
    if nproc > 1:
        env.setdefault("OMP_NUM_THREADS", "1")  # what torchrun sets anyway, without its warning
    return env


def _is_rank_of(pid: int, folder: Path) -> bool:
    """Whether ``pid`` is still one of this run's rank processes (not a reused process id)."""
    if not Path("/proc").is_dir():  # macOS: trust the id, written moments ago
        return True
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()  # empty for a process that already exited
    except OSError:
        return False
    return str(folder).encode() in command
