#!/usr/bin/env python3
"""Runs the supported matrix: each CPython x torch in a fresh virtual environment.

For each combination, in a copy of this working tree (the extension is built in place, one per
tree): ``scripts/setup.sh`` with that Python and torch (a fresh venv, torch, the package with
its test extras, the C++ extension), the core suite (the files tests/core.txt lists; ``--suite
full`` for the whole suite) and one notebook under nbval; then a table of what each cost and counted.

    python3 scripts/matrix.py                                   # 3.11-3.13 x torch 2.13.0, 2.14.1
    python3 scripts/matrix.py --pythons 3.12 --torches 2.14.1 --suite full --keep
    python3 scripts/matrix.py --pythons 3.11 --torches 2.14.1 --suite ci --no-download   # CI's second

``--suite ci`` is the core suite less its two slowest files (``MAIN_COMBINATION_ONLY``) plus TorchTitan's
end-to-end test (tests/distributed/test_torchtitan.py),
with TorchTitan installed into the venv after set-up (``TORCHTITAN``, timed apart).

Each environment with a CUDA build of torch (every one but Python 3.11 with torch 2.13.0,
which is a CPU build) takes about 5.5 GB; a copy is deleted once measured unless ``--keep``.
torch's wheels are downloaded once per Python and torch into ``--wheels`` (pip's own
download, timed apart from the install), which pip then installs from.
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Result", "core_tests", "find_python", "run_combination", "parse_args", "main"]

ROOT = Path(__file__).resolve().parent.parent
PYTHONS = ("3.11", "3.12", "3.13")
TORCHES = ("2.13.0", "2.14.1")
NOTEBOOK = "notebooks/1_quickstart.ipynb"
TORCHTITAN = ("torchtitan==0.3.0",)  # triton, which it imports, comes with the CUDA build of torch
TITAN_TESTS = "tests/distributed/test_torchtitan.py"
# The two slowest core files (about 60% of the core suite's time) run in the main combination
# only, so that CI's second combination fits CI's 40 minutes.
MAIN_COMBINATION_ONLY = ("tests/device/test_device.py", "tests/runtime/test_compile.py")


@dataclass
class Result:
    python: str
    torch: str
    download_s: float = 0.0
    install_s: float = 0.0
    extras_s: float = 0.0
    titan_s: float = 0.0
    suite: dict[str, int] = field(default_factory=dict)
    suite_s: float = 0.0
    notebook: str = "-"
    notebook_s: float = 0.0
    note: str = ""

    def row(self) -> list[str]:
        s = self.suite
        counts = (
            f"{s['passed']} passed, {s['failed']} failed, {s['errors']} errors, {s['skipped']} skipped"
            if s
            else "-"
        )
        return [
            self.python,
            self.torch,
            f"{self.download_s:.0f}",
            f"{self.install_s:.0f}",
            f"{self.extras_s:.0f}",
            counts,
            f"{self.suite_s:.0f}",
            f"{self.titan_s:.0f}",
            f"{self.notebook} ({self.notebook_s:.0f} s)",
            self.note,
        ]


def find_python(version: str) -> str | None:
    """An interpreter for ``version`` that runs: pyenv's newest 3.X, else python3.X on PATH (which
    may be a pyenv shim that fails where that version is not selected)."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = sorted(
        pyenv.glob(f"{version}.*/bin/python{version}"),
        key=lambda p: [int(x) if x.isdigit() else -1 for x in p.parts[-3].split(".")],
        reverse=True,
    )
    on_path = shutil.which(f"python{version}")
    for candidate in [*map(str, candidates), *([on_path] if on_path else [])]:
        if subprocess.run([candidate, "-c", ""], capture_output=True, timeout=60).returncode == 0:
            return candidate
    return None


def core_tests(root: Path = ROOT) -> list[str]:
    """The core suite's test files (tests/core.txt)."""
    lines = (root / "tests" / "core.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def fastpath_validated(root: Path = ROOT) -> tuple[str, ...]:
    """The torch release series the fast path was validated on (``VALIDATED_TORCH``), read
    from its source: this script runs without torch."""
    source = (root / "neuron_lab" / "fastpath" / "__init__.py").read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "VALIDATED_TORCH":
            return tuple(ast.literal_eval(node.value))
    raise RuntimeError("neuron_lab/fastpath/__init__.py no longer sets VALIDATED_TORCH")


def copy_tree(dest: Path) -> None:
    """The working tree as git sees it (tracked and untracked, not ignored files)."""
    files = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "-co", "--exclude-standard"],
        capture_output=True, check=True,
    ).stdout.split(b"\0")
    for name in filter(None, files):
        src = ROOT / os.fsdecode(name)
        if src.is_file():
            target = dest / os.fsdecode(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)


def junit_seconds(path: Path, test_file: str) -> float:
    """The time the tests of ``test_file`` took, by the junit report."""
    module = Path(test_file).stem
    return sum(float(case.get("time", 0)) for case in ET.parse(path).getroot().iter("testcase")
               if case.get("classname", "").split(".")[-1] == module or f".{module}." in case.get("classname", ""))


def junit_counts(path: Path) -> dict[str, int]:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    return {
        "passed": total["tests"] - total["failures"] - total["errors"] - total["skipped"],
        "failed": total["failures"],
        "errors": total["errors"],
        "skipped": total["skipped"],
    }


def run(cmd: list[str], log: Path, env: dict[str, str], cwd: Path, timeout: float) -> tuple[int, float]:
    started = time.monotonic()
    with log.open("ab") as out:
        try:
            rc = subprocess.run(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = -1
    return rc, time.monotonic() - started


def run_combination(python: str, torch: str, work: Path, wheels: Path, suite: str, jobs: str,
                    download: bool = True) -> Result:
    result = Result(python, torch)
    interpreter = find_python(python)
    if interpreter is None:
        result.note = f"no python{python} found"
        return result
    tree = work / f"py{python}-torch{torch}"
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir(parents=True)
    copy_tree(tree)
    log = tree / "matrix.log"
    env = {**os.environ, "PYTHON": interpreter, "NEURON_LAB_TORCH": f"torch=={torch}",
           "NEURON_LAB_SKIP_CHROMIUM": "1", "MAX_JOBS": jobs}
    env.pop("PYTHONPATH", None)
    # On a torch the fast path was not validated on, it turns itself off with a warning at
    # import (neuron_lab/fastpath); saying "off" is the same state without the warning, which
    # the tests of a clean first import would otherwise see.
    if ".".join(torch.split(".")[:2]) not in fastpath_validated(tree):
        env.setdefault("NEURON_LAB_FASTPATH", "off")

    # torch's wheels, once per Python and torch: what a new machine downloads. Without
    # (--no-download) pip installs torch straight from its configured indexes.
    if download:
        wheels.mkdir(parents=True, exist_ok=True)
        rc, result.download_s = run(
            [interpreter, "-m", "pip", "download", "-q", "--disable-pip-version-check", "-d", str(wheels), f"torch=={torch}"],
            log, env, tree, 3600,
        )
        if rc != 0:
            result.note = f"download failed ({log})"
            return result
        env["PIP_FIND_LINKS"] = " ".join(filter(None, [os.environ.get("PIP_FIND_LINKS", ""), str(wheels)]))

    rc, result.install_s = run(["bash", "scripts/setup.sh"], log, env, tree, 3600)
    if rc != 0:
        result.note = f"set-up failed ({log})"
        return result

    venv_python = str(tree / ".venv" / "bin" / "python")
    if suite == "ci":
        rc, result.extras_s = run(
            [venv_python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *TORCHTITAN], log, env, tree, 1800,
        )
        if rc != 0:
            result.note = f"installing {' '.join(TORCHTITAN)} failed ({log})"
            return result
    # The Binder test builds its own environment from binder/ (Python 3.11, torch 2.13.0),
    # whatever the combination: it runs in the main combination's suite.
    ci_tests = [t for t in core_tests(tree) if t not in MAIN_COMBINATION_ONLY]
    selection = {"core": core_tests(tree), "ci": [*ci_tests, TITAN_TESTS],
                 "full": ["tests", "-m", "not binder"]}[suite]
    junit = tree / "suite.xml"
    rc, result.suite_s = run(
        [venv_python, "-m", "pytest", *selection, "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"],
        log, env, tree, 7200,
    )
    if junit.exists():
        result.suite = junit_counts(junit)
        result.titan_s = junit_seconds(junit, TITAN_TESTS)
    if rc not in (0, 1):
        result.note = f"pytest exit {rc} ({log})"

    rc, result.notebook_s = run(
        [venv_python, "-m", "pytest", NOTEBOOK, "-q", "-p", "no:cacheprovider"], log, env, tree, 1800,
    )
    result.notebook = f"{Path(NOTEBOOK).name} {'passed' if rc == 0 else 'FAILED'}"
    return result


def table(results: list[Result]) -> str:
    head = ["Python", "torch", "download s", "install s", "torchtitan install s", "suite", "suite s",
            "of which TorchTitan s", "notebook", "note"]
    rows = [head, ["---"] * len(head), *(r.row() for r in results)]
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with --work and --wheels made absolute (each combination's commands run
    inside its copy of the tree, where a relative path would point elsewhere)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pythons", default=",".join(PYTHONS), help="comma-separated, e.g. 3.11,3.12")
    parser.add_argument("--torches", default=",".join(TORCHES), help="comma-separated, e.g. 2.13.0,2.14.1")
    parser.add_argument("--suite", choices=("core", "ci", "full"), default="core",
                        help="core: the files tests/core.txt lists; ci: those less MAIN_COMBINATION_ONLY, plus TorchTitan's end-to-end test "
                             "(what CI runs on its second combination); full: every test")
    parser.add_argument("--no-download", dest="download", action="store_false",
                        help="let pip install torch from its configured indexes (no separate, timed download)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/neuron_lab-matrix"), help="where the copies and venvs go")
    parser.add_argument("--wheels", type=Path, default=None, help="torch's wheels, shared by the runs (default: WORK/wheels)")
    parser.add_argument("--jobs", default=os.environ.get("MAX_JOBS", str(os.cpu_count() or 1)), help="compile jobs (MAX_JOBS)")
    parser.add_argument("--keep", action="store_true", help="keep each copy and its venv (about 5.5 GB each)")
    args = parser.parse_args(argv)
    args.work = args.work.resolve()
    args.wheels = args.wheels.resolve() if args.wheels else None
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    results = []
    for python in args.pythons.split(","):
        for torch in args.torches.split(","):
            print(f"== CPython {python}, torch {torch}", flush=True)
            result = run_combination(python, torch, args.work, args.wheels or args.work / "wheels", args.suite, args.jobs,
                                     args.download)
            results.append(result)
            print(table([result]).splitlines()[-1], flush=True)
            if not args.keep:
                shutil.rmtree(args.work / f"py{python}-torch{torch}" / ".venv", ignore_errors=True)
    print()
    print(table(results))
    bad = [r for r in results if r.note or not r.suite or r.suite["failed"] or r.suite["errors"] or "FAILED" in r.notebook]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
