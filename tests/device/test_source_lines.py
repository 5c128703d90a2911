"""Source lines on every supported CPython: the device's frame-stack reader (device/csrc/tracing/source.cpp)
built alone, as a tiny extension, for each interpreter the build accepts, and checked against
Python's own frames in the situations each version lays out differently (inlined
comprehensions, generators, coroutines, C calls into Python, threads).

The whole device is built for one Python per environment (scripts/matrix.py builds each); this
checks the layouts of all of them in seconds, with no torch. An interpreter that is missing is a
skip on a developer's machine and a failure in CI (CI=true), where all of them must be checked.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from _build_backend import SUPPORTED_PYTHONS  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
import matrix  # noqa: E402  (scripts/matrix.py runs without torch; its interpreter finder)

PROBE = Path(__file__).resolve().parents[1] / "source_probe"


def find_python(major: int, minor: int) -> str | None:
    """An interpreter for CPython X.Y that runs: this one, else the matrix script's choice
    (pyenv's newest X.Y, or pythonX.Y on PATH)."""
    if sys.version_info[:2] == (major, minor):
        return sys.executable
    return matrix.find_python(f"{major}.{minor}")


def build_probe(python: str, out: Path) -> None:
    query = "import sysconfig, json; print(json.dumps([sysconfig.get_paths()['include'], sysconfig.get_config_var('EXT_SUFFIX')]))"
    include, suffix = json.loads(subprocess.run([python, "-c", query], capture_output=True, text=True, check=True).stdout)
    compiler = os.environ.get("CXX") or shutil.which("c++") or "g++"
    csrc = ROOT / "neuron_lab" / "device" / "csrc" / "tracing"
    result = subprocess.run(
        [compiler, "-std=c++17", "-O1", "-fPIC", "-shared", f"-I{include}", f"-I{csrc}",
         str(csrc / "source.cpp"), str(PROBE / "probe.cpp"), "-o", str(out / f"source_probe{suffix}")],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, f"source.cpp does not build for {python}:\n{result.stderr[-3000:]}"


@pytest.mark.parametrize("version", SUPPORTED_PYTHONS, ids=lambda v: f"{v[0]}.{v[1]}")
def test_source_lines_match_python_frames(version: tuple[int, int], tmp_path: Path) -> None:
    python = find_python(*version)
    if python is None:
        message = f"no CPython {version[0]}.{version[1]} here (python{version[0]}.{version[1]} or pyenv)"
        if os.environ.get("CI"):
            pytest.fail(message + ": CI must check every supported Python's frame layout")
        pytest.skip(message)
    build_probe(python, tmp_path)
    result = subprocess.run([python, str(PROBE / "cases.py"), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert tuple(report["python"][:2]) == version
    cases = report["cases"]
    assert len(cases) >= 14
    wrong = {name: case for name, case in cases.items() if case["captured"] != case["expected"]}
    assert not wrong, f"CPython {version[0]}.{version[1]}: wrong source lines {json.dumps(wrong, indent=1)}"


def test_the_probe_checks_what_the_build_accepts() -> None:
    """source.cpp's compile-time guard and the build's list name the same versions."""
    text = (ROOT / "neuron_lab" / "device" / "csrc" / "tracing" / "source.cpp").read_text()
    low, high = SUPPORTED_PYTHONS[0], SUPPORTED_PYTHONS[-1]
    assert f"PY_VERSION_HEX < 0x03{low[1]:02X}0000" in text
    assert f"PY_VERSION_HEX >= 0x03{high[1] + 1:02X}0000" in text
