"""Runs conformance cases in a worker subprocess, and reports sweeps over them.

The suites driven by PyTorch's databases (``opinfo_support``, ``module_db_support``,
``optim_db_support``) each check hundreds of cases. A case that crashes the process
(segfault, abort) or hangs must fail only itself: :class:`CaseRunner` runs cases one at
a time in a worker process (``python <suite file> --worker``, which calls :func:`serve`)
and starts a fresh worker after a crash or a time-out. ``NEURON_TEST_INPROCESS=1`` runs
cases in the calling process instead (for debugging).

:func:`sweep` runs every case of a suite and prints the failures and the pass rate

    pass rate = passed / applicable,   applicable = all cases - exclusions

for the scripts in ``scripts/``.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_TIMEOUT = 300.0


@dataclass
class CaseResult:
    """The outcome of one conformance case on the neuron device."""

    case_id: str
    status: str  # passed | failed | skipped | excluded | crashed | timeout | error
    message: str = ""  # first failure (one paragraph), or the skip reason
    samples: int = 0  # samples run
    checks: dict[str, int] = field(default_factory=dict)  # checks that ran, by kind
    failures: list[str] = field(default_factory=list)  # every failing check, one line each
    seconds: float = 0.0

    @property
    def first_line(self) -> str:
        return self.message.strip().splitlines()[0] if self.message.strip() else ""


def samples_from_env(variable: str, default: int) -> Optional[int]:
    """Samples per case from an environment variable: unset, ``default``; ``all`` (or ``0``,
    ``none``): None, every sample; else the number given (at least 1)."""
    raw = os.environ.get(variable, "").strip().lower()
    if not raw:
        return default
    if raw in ("all", "none", "0"):
        return None
    return max(1, int(raw))


def run_guarded(case_id: str, exclusions: dict[str, str], check: Callable[[], CaseResult]) -> CaseResult:
    """Runs one case's ``check`` in this process, as a worker does: an excluded case is
    reported as such; an exception of the harness itself becomes an ``error`` result with
    its traceback; warnings are silenced and the default dtype a case may set is restored."""
    if case_id in exclusions:
        return CaseResult(case_id, "excluded", exclusions[case_id])
    import traceback
    import warnings

    import torch
    from parity import describe

    previous_dtype = torch.get_default_dtype()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return check()
        except Exception as e:
            return CaseResult(case_id, "error", "harness error: " + describe(e) + "\n" + traceback.format_exc())
        finally:
            torch.set_default_dtype(previous_dtype)


def main(run_case: RunCase, prepare: Callable[[], Any], *, description: str, case_flag: str, case_help: str,
         unit: str, modes: Optional[tuple[str, ...]] = None) -> None:
    """The command line of a suite file: ``--worker`` serves a :class:`CaseRunner`; else the
    cases named with ``case_flag`` run in this process and each result is printed."""
    if sys.argv[1:2] == ["--worker"]:
        serve(run_case, prepare=prepare)
        return
    import argparse

    import neuron_lab  # noqa: F401  (registers the device)

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(case_flag, action="append", required=True, dest="cases", help=case_help + " (repeatable)")
    parser.add_argument("--samples", type=int, default=0, help=f"{unit} per case (0: all)")
    if modes:
        parser.add_argument("--mode", choices=modes, default=modes[0])
    ns = parser.parse_args()
    mode = getattr(ns, "mode", None)
    for case_id in ns.cases:
        params: dict[str, Any] = {"samples": ns.samples or None}
        if mode:
            params["mode"] = mode
        r = run_case(case_id, params)
        label = f"{r.case_id} [{mode}]" if mode else r.case_id
        print(f"{label}: {r.status} ({r.samples} {unit}, {r.seconds:.1f}s) {r.checks}")
        if r.message:
            print(r.message)


def timeout_from_env() -> float:
    return float(os.environ.get("NEURON_TEST_TIMEOUT", os.environ.get("NEURON_OPINFO_TIMEOUT", DEFAULT_TIMEOUT)))


RunCase = Callable[[str, dict], CaseResult]


def serve(run_case: RunCase, prepare: Optional[Callable[[], None]] = None) -> None:
    """The worker's loop: one JSON request per line on stdin (``{"case": id, "params": {}}``),
    one JSON :class:`CaseResult` per line back."""
    # The protocol goes over the original stdout; anything the cases print goes to stderr.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import torch  # noqa: F401

    import neuron_lab  # noqa: F401  (registers the device)

    if prepare is not None:
        prepare()
    proto.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        req = json.loads(line)
        print(f"=== case {req['case']} {req['params']}", file=sys.stderr, flush=True)
        res = run_case(req["case"], req["params"])
        proto.write(json.dumps(asdict(res)) + "\n")


class CaseRunner:
    """Runs cases one at a time in a worker subprocess, surviving crashes and hangs."""

    def __init__(self, worker_script: str, params: dict, timeout: float = DEFAULT_TIMEOUT,
                 startup_timeout: float = 300.0, exclusions: Optional[dict[str, str]] = None):
        self.worker_script = os.path.abspath(worker_script)
        self.params = dict(params)
        self.timeout = timeout
        self.startup_timeout = startup_timeout
        self.exclusions = exclusions or {}
        self.proc: Optional[subprocess.Popen] = None
        self.log = None
        self.crashes = 0

    def _start(self) -> None:
        self.log = tempfile.TemporaryFile(mode="w+b")
        env = dict(os.environ)
        env["PYTHONPATH"] = REPO_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("PYTHONFAULTHANDLER", "1")
        self.proc = subprocess.Popen(
            [sys.executable, self.worker_script, "--worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env, cwd=REPO_ROOT,
        )
        line = self._readline(self.startup_timeout)
        if line is None or not json.loads(line).get("ready"):
            tail = self._log_tail(0)
            self.close()
            raise RuntimeError(f"the test worker ({os.path.basename(self.worker_script)}) did not start:\n{tail}")

    def _readline(self, timeout: float) -> Optional[str]:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        buf = b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None  # EOF: the worker died
            buf += chunk
            if buf.endswith(b"\n"):
                return buf.decode()

    def _log_tail(self, since: int, limit: int = 4000) -> str:
        if self.log is None:
            return ""
        self.log.flush()
        self.log.seek(since)
        text = self.log.read().decode(errors="replace")
        self.log.seek(0, os.SEEK_END)
        return text[-limit:]

    def run(self, case_id: str, **params: Any) -> CaseResult:
        """Runs one case with the runner's params, updated by ``params``."""
        if case_id in self.exclusions:
            return CaseResult(case_id, "excluded", self.exclusions[case_id])
        if self.proc is None:
            self._start()
        assert self.proc is not None and self.proc.stdin is not None and self.log is not None
        self.log.seek(0, os.SEEK_END)
        since = self.log.tell()
        start = time.perf_counter()
        request = {"case": case_id, "params": {**self.params, **params}}
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
            line = self._readline(self.timeout)
        except TimeoutError:
            tail = self._log_tail(since)
            self.close(kill=True)
            return CaseResult(case_id, "timeout", f"no result after {self.timeout:.0f}s; worker killed\n{tail}",
                              seconds=time.perf_counter() - start)
        except BrokenPipeError:
            line = None
        if line is None:
            rc = self.proc.wait()
            tail = self._log_tail(since)
            self.close()
            self.crashes += 1
            if rc < 0:
                try:
                    how = f"killed by {signal.Signals(-rc).name}"
                except ValueError:
                    how = f"killed by signal {-rc}"
            else:
                how = f"exited with status {rc}"
            return CaseResult(case_id, "crashed", f"the worker process {how}\n{tail}",
                              seconds=time.perf_counter() - start)
        return CaseResult(**json.loads(line))

    def close(self, kill: bool = False) -> None:
        if self.proc is not None:
            try:
                if kill:
                    self.proc.kill()
                elif self.proc.stdin:
                    self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except Exception:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        if self.log is not None:
            self.log.close()
            self.log = None


class InProcessRunner:
    """The same interface, running cases in this process (``NEURON_TEST_INPROCESS=1``)."""

    def __init__(self, run_case: RunCase, params: dict, exclusions: Optional[dict[str, str]] = None):
        self.run_case = run_case
        self.params = dict(params)
        self.exclusions = exclusions or {}

    def run(self, case_id: str, **params: Any) -> CaseResult:
        if case_id in self.exclusions:
            return CaseResult(case_id, "excluded", self.exclusions[case_id])
        return self.run_case(case_id, {**self.params, **params})

    def close(self, kill: bool = False) -> None:
        pass


def make_runner(worker_script: str, run_case: RunCase, params: dict, exclusions: Optional[dict[str, str]] = None,
                timeout: Optional[float] = None):
    """A :class:`CaseRunner`, or an :class:`InProcessRunner` when ``NEURON_TEST_INPROCESS=1``
    (or the older ``NEURON_OPINFO_INPROCESS=1``)."""
    if "1" in (os.environ.get("NEURON_TEST_INPROCESS"), os.environ.get("NEURON_OPINFO_INPROCESS")):
        return InProcessRunner(run_case, params, exclusions)
    return CaseRunner(worker_script, params, timeout if timeout is not None else timeout_from_env(),
                      exclusions=exclusions)


def assert_passed(result: CaseResult, label: str) -> None:
    """In a pytest test: passes, skips (with the reason) or fails (with every failure) as
    the case did."""
    import pytest

    if result.status == "passed":
        return
    if result.status in ("skipped", "excluded"):
        pytest.skip(f"{label}: {result.message}")
    pytest.fail(f"{label} {result.status.upper()} on neuron:\n{result.message}", pytrace=False)


# ---------------------------------------------------------------------------------
# Sweeps: every case of a suite, a table of failures and the pass rate
# ---------------------------------------------------------------------------------


def sweep(title: str, case_ids: list[str], new_runner: Callable[[], Any], *, jobs: int = 1,
          patterns: Optional[list[str]] = None, verbose: bool = False, threshold: float = 99.0,
          json_path: Optional[str] = None, extra: Optional[dict] = None) -> int:
    """Runs every case (those matching one of ``patterns``, if given) and prints the cases
    that did not pass, the exclusions, and the pass rate. Returns the exit status: 0 when
    the pass rate reaches ``threshold`` percent, 1 otherwise."""
    if patterns:
        compiled = [re.compile(p) for p in patterns]
        case_ids = [c for c in case_ids if any(p.search(c) for p in compiled)]
    print(f"{title}: {len(case_ids)} cases, {jobs} worker(s)", flush=True)
    results: dict[str, CaseResult] = {}
    queue = list(case_ids)
    lock = threading.Lock()
    start = time.perf_counter()

    def work() -> None:
        runner = new_runner()
        try:
            while True:
                with lock:
                    if not queue:
                        return
                    key = queue.pop(0)
                res = runner.run(key)
                with lock:
                    results[key] = res
                    done = len(results)
                    if res.status not in ("passed", "excluded"):
                        print(f"  [{done}/{len(case_ids)}] {res.status.upper():8} {key}: {res.first_line[:150]}",
                              flush=True)
                    elif done % 50 == 0:
                        print(f"  [{done}/{len(case_ids)}] ... {time.perf_counter() - start:.0f}s", flush=True)
        finally:
            runner.close()

    threads = [threading.Thread(target=work) for _ in range(max(1, jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start

    ordered = [results[i] for i in case_ids]
    by_status: dict[str, list[CaseResult]] = {}
    for r in ordered:
        by_status.setdefault(r.status, []).append(r)
    excluded = by_status.get("excluded", [])
    passed = by_status.get("passed", [])
    skipped = by_status.get("skipped", [])
    applicable = len(ordered) - len(excluded)
    order = ["crashed", "timeout", "error", "failed"]
    bad = sorted((r for r in ordered if r.status in order), key=lambda r: (order.index(r.status), r.case_id))

    if bad:
        width = max(len(r.case_id) for r in bad)
        print(f"\n{'case':{width}}  status    first error")
        print(f"{'-' * width}  --------  {'-' * 60}")
        for r in bad:
            print(f"{r.case_id:{width}}  {r.status:8}  {r.first_line[:200]}")
            if verbose:
                for line in r.message.strip().splitlines()[1:]:
                    print(f"{'':{width}}            {line}")
    if excluded:
        print(f"\nExcluded ({len(excluded)}):")
        for r in excluded:
            print(f"  {r.case_id}: {r.message}")
    if skipped:
        print(f"\nSkipped, not counted as passed ({len(skipped)}):")
        for r in skipped:
            print(f"  {r.case_id}: {r.message}")

    rate = 100.0 * len(passed) / applicable if applicable else 100.0
    counts = ", ".join(f"{k}={len(v)}" for k, v in sorted(by_status.items()))
    print(f"\n{counts}; {elapsed:.0f}s")
    print(f"pass rate: {len(passed)}/{applicable} = {rate:.2f}% (threshold {threshold:g}%)")

    if json_path:
        with open(json_path, "w") as f:
            json.dump({**(extra or {}), "seconds": elapsed, "pass_rate": rate,
                       "results": [asdict(r) for r in ordered]}, f, indent=1)
    return 0 if rate >= threshold else 1
