"""Building the package: which Pythons it builds for, and that any other is refused at once.

The extension reads CPython's private frame structs (device/csrc/tracing/source.cpp), laid out anew in
each minor version, so the build must refuse a Python it has no layout for, with the reason and
the fix, before pip downloads anything (pip itself checks requires-python only after installing
the build requirements, torch among them: hundreds of MB).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import tomllib
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import _build_backend  # noqa: E402

OUTSIDE = [(3, 10), (3, 14)]  # the neighbours of the supported range


def test_requires_python_and_the_build_backend_name_the_same_versions() -> None:
    declared = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    assert _build_backend.SUPPORTED_PYTHONS == ((3, 11), (3, 12), (3, 13))
    for major, minor in _build_backend.SUPPORTED_PYTHONS:
        assert f"{major}.{minor}.0" in declared and f"{major}.{minor}.9" in declared
    for major, minor in OUTSIDE:
        assert f"{major}.{minor}.0" not in declared
    assert sys.version_info[:2] in _build_backend.SUPPORTED_PYTHONS  # the suite runs on one of them


@pytest.mark.parametrize("version", OUTSIDE)
def test_the_check_names_the_python_the_supported_ones_and_the_fix(version: tuple[int, int]) -> None:
    reason = _build_backend.unsupported_python("cpython", (*version, 0, "final", 0))
    assert reason is not None
    assert f"not CPython {version[0]}.{version[1]}" in reason
    assert "3.11, 3.12, 3.13" in reason and "python3.13 -m venv" in reason
    assert "frame" in reason  # the reason, not only the verdict
    assert _build_backend.unsupported_python("pypy", (3, 11, 0)) is not None
    for supported in _build_backend.SUPPORTED_PYTHONS:
        assert _build_backend.unsupported_python("cpython", (*supported, 4)) is None


@pytest.mark.parametrize("version", OUTSIDE)
def test_setup_py_refuses_another_python_before_importing_torch(version: tuple[int, int]) -> None:
    code = f"""
        import runpy, sys
        sys.version_info = ({version[0]}, {version[1]}, 0, "final", 0)
        sys.argv = ["setup.py", "--version"]
        try:
            runpy.run_path({str(ROOT / "setup.py")!r}, run_name="__main__")
        finally:
            print("torch imported:", "torch" in sys.modules)
    """
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert f"not CPython {version[0]}.{version[1]}" in result.stderr and "-m venv" in result.stderr, result.stderr
    assert "torch imported: False" in result.stdout


def test_pip_refuses_an_unsupported_python_before_installing_anything(tmp_path: Path) -> None:
    """A real ``pip install .`` by a Python the build does not support. The Python running the
    suite is supported, so the copy of the tree built here supports every version but this one;
    with no package index, anything pip tried to install first would fail with another error."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "_build_backend.py", "README.md", "MANIFEST.in", "_neuron_lab_autoload.py"):
        shutil.copy2(ROOT / name, source / name)
    (source / "neuron_lab").mkdir()
    (source / "neuron_lab" / "__init__.py").write_text("")
    backend = source / "_build_backend.py"
    this = sys.version_info[:2]
    others = tuple(v for v in [(3, 11), (3, 12), (3, 13), (3, 14)] if v != this)
    text, count = re.subn(r"SUPPORTED_PYTHONS = \(.*\)\n", f"SUPPORTED_PYTHONS = {others!r}\n", backend.read_text())
    assert count == 1
    backend.write_text(text)

    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # no index, no find-links, no constraints of this machine
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--disable-pip-version-check", str(source)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    took = time.monotonic() - started
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert f"not CPython {this[0]}.{this[1]}" in output and "-m venv" in output, output
    assert "Collecting" not in output and "No matching distribution" not in output, output
    assert took < 60, f"pip took {took:.0f} s to refuse"


# CPython's private names (a leading underscore) change or vanish between minor versions
# (_Py_IsFinalizing is gone in 3.13): only the files that select them per version may use them.
FILES_THAT_VERSION_CPYTHON_INTERNALS = {
    "neuron_lab/device/csrc/tracing/source.cpp",  # frame layouts of 3.11, 3.12 and 3.13
    "neuron_lab/device/csrc/python/interpreter.h",  # whether the interpreter can still run code
}


def test_private_cpython_names_stay_in_the_files_that_version_them() -> None:
    private_name = re.compile(r"\b_Py\w+")
    offenders = []
    for path in sorted((ROOT / "neuron_lab").rglob("*")):
        if path.suffix not in {".cpp", ".h"}:
            continue
        relative = path.relative_to(ROOT).as_posix()
        if relative in FILES_THAT_VERSION_CPYTHON_INTERNALS:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            offenders += [f"{relative}:{number}: {name}" for name in private_name.findall(line)]
    assert not offenders, (
        "private CPython names outside the files that select them per Python version (they break "
        "the build on another CPython; ask neuron::python_can_run() or extend those files):\n"
        + "\n".join(offenders)
    )


def test_the_matrix_resolves_its_work_folder_before_running_inside_a_tree_copy(monkeypatch) -> None:
    """CI passes ``--work build/matrix``; each combination's commands run with the copy of the tree
    as their working folder, so a relative path must be made absolute first."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import matrix
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    monkeypatch.chdir(ROOT)
    args = matrix.parse_args(["--work", "build/matrix", "--wheels", "build/wheels"])
    assert args.work == ROOT / "build" / "matrix" and args.wheels == ROOT / "build" / "wheels"
