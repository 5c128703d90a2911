"""The Binder set-up (binder/), checked without Docker.

repo2docker builds the Binder image from binder/: it installs a Python of runtime.txt's version,
runs ``pip install -r binder/requirements.txt`` from the repository root, then runs
binder/postBuild there. The quick tests check that those files are valid and agree with the
package; the ``binder`` test repeats the build in a fresh virtual environment (a copy of the
repository, requirements installed, postBuild run as it is) and executes every notebook there.

That test is marked ``binder`` (``-m 'not binder'`` deselects it); most of its time is
postBuild compiling the C++ extension from scratch, as Binder does. It installs torch from the
pinned CPU wheel in build/wheels (scripts/setup.sh puts it there; pip's configuration knows
where it lies) and everything else through uv's cache, so it downloads nothing large.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
BINDER = ROOT / "binder"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _requirements() -> tuple[list[str], list[Requirement]]:
    """binder/requirements.txt as (option lines, requirements); comments and blanks dropped."""
    options, requirements = [], []
    for number, raw in enumerate((BINDER / "requirements.txt").read_text().splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            options.append(line)
            continue
        try:
            requirements.append(Requirement(line))
        except InvalidRequirement as e:
            pytest.fail(f"binder/requirements.txt:{number}: {raw!r} is not a requirement: {e}")
    return options, requirements


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _torch_pin() -> Version:
    torch = [r for r in _requirements()[1] if canonicalize_name(r.name) == "torch"]
    assert len(torch) == 1, "binder/requirements.txt must name torch exactly once"
    specs = list(torch[0].specifier)
    assert len(specs) == 1 and specs[0].operator == "==", f"torch must be pinned with ==, got {torch[0]}"
    return Version(specs[0].version)


def _runtime_version() -> str:
    match = re.fullmatch(r"python-(3\.\d+)", (BINDER / "runtime.txt").read_text().strip())
    assert match, "binder/runtime.txt must hold one line such as python-3.11"
    return match.group(1)


# ---- the files ----------------------------------------------------------------------------


def test_requirements_pin_the_cpu_build_of_torch():
    options, _ = _requirements()
    assert options == [f"--extra-index-url {CPU_INDEX}"], (
        f"binder/requirements.txt should have exactly one option, the CPU wheel index; got {options}")
    pin = _torch_pin()
    assert pin.local == "cpu", (
        f"pin torch's CPU build (torch=={pin.public}+cpu): a bare version lets pip fall back to "
        "the multi-GB CUDA build on PyPI if the CPU index is unreachable")
    project_spec = next(Requirement(d) for d in _pyproject()["project"]["dependencies"]
                        if canonicalize_name(Requirement(d).name) == "torch").specifier
    assert project_spec.contains(pin), f"torch {pin} does not satisfy pyproject's torch{project_spec}"
    # TORCH_PIN=${NEURON_LAB_TORCH:-torch==X}: the default when no other torch is asked for.
    setup_pin = re.search(r'^TORCH_PIN=\$\{NEURON_LAB_TORCH:-torch==([^}]+)\}$', (ROOT / "scripts/setup.sh").read_text(),
                          re.M)
    assert setup_pin, "scripts/setup.sh no longer sets its default TORCH_PIN"
    assert Version(setup_pin.group(1)).public == pin.public, (
        f"binder pins torch {pin.public}, scripts/setup.sh {setup_pin.group(1)}: keep them the same")


def test_requirements_cover_the_package_and_the_notebooks():
    """repo2docker installs requirements.txt before postBuild: the package's dependencies must all
    be there (postBuild's pip would otherwise resolve torch on its own), and so must what the
    notebooks and the extension build need."""
    named = {canonicalize_name(r.name) for r in _requirements()[1]}
    needed = {canonicalize_name(Requirement(d).name) for d in _pyproject()["project"]["dependencies"]}
    needed |= {"pandas", "pyarrow", "setuptools", "wheel", "ninja"}
    assert not needed - named, f"binder/requirements.txt lacks {sorted(needed - named)}"


def test_runtime_txt_names_a_supported_python():
    version = _runtime_version()
    requires = SpecifierSet(_pyproject()["project"]["requires-python"])
    assert requires.contains(version + ".0"), f"runtime.txt's Python {version} is outside requires-python {requires}"


def test_postbuild_is_an_executable_strict_bash_script():
    post_build = BINDER / "postBuild"
    assert os.access(post_build, os.X_OK), "binder/postBuild must be executable (chmod +x; git keeps the bit)"
    text = post_build.read_text()
    assert text.startswith("#!/usr/bin/env bash\n"), "postBuild needs a bash shebang"
    assert "set -euo pipefail" in text, "postBuild must stop at the first failing command"
    assert re.search(r"pip install --no-build-isolation -e \.", text), (
        "postBuild must install the package in place against the torch that requirements.txt installed")
    check = subprocess.run(["bash", "-n", str(post_build)], capture_output=True, text=True)
    assert check.returncode == 0, f"bash -n binder/postBuild:\n{check.stderr}"


def test_git_keeps_postbuild_executable():
    """Binder builds from git: the executable bit must be in the index, not only on disk."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(["git", "ls-files", "-s", "binder/postBuild"], cwd=ROOT, capture_output=True, text=True)
    if not listed.stdout.strip():
        pytest.skip("binder/postBuild is not in git's index yet")
    assert listed.stdout.startswith("100755"), f"git has binder/postBuild without its executable bit: {listed.stdout}"


def test_no_apt_txt():
    """The compiler postBuild needs (g++) is in repo2docker's base image (buildpack-deps), so no
    apt.txt; if one is added, it must list plain Debian package names."""
    apt = BINDER / "apt.txt"
    if apt.exists():
        for line in apt.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            assert not line or re.fullmatch(r"[a-z0-9][a-z0-9+.-]+", line), f"apt.txt: {line!r}"


# ---- the build, in a fresh virtual environment ----------------------------------------------


def _run(cmd: list[str], cwd: Path, env: dict, what: str, timeout: float) -> float:
    start = time.monotonic()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    took = time.monotonic() - start
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-6000:]
        pytest.fail(f"{what} failed (exit {done.returncode}) after {took:.0f} s: {' '.join(cmd)}\n{tail}")
    print(f"binder: {what}: {took:.0f} s")
    return took


def _torch_wheel(pin: Version, python: str) -> Path:
    """The pinned CPU wheel in build/wheels, fetched as scripts/setup.sh does when missing."""
    tag = "cp" + python.replace(".", "")
    pattern = f"torch-{pin}-{tag}-{tag}-*.whl"
    wheels = ROOT / "build" / "wheels"
    found = sorted(wheels.glob(pattern))
    if not found:
        wheels.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", python, "-d", str(wheels), f"torch=={pin}"], check=True)
        found = sorted(wheels.glob(pattern))
    assert found, f"no {pattern} in build/wheels (scripts/setup.sh downloads it)"
    return found[-1]


def _copy_repository(dest: Path) -> None:
    """The files repo2docker would see: tracked ones plus new ones git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=True)
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = ROOT / name
        if source.is_file():  # listed but deleted in the work tree: skip
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


@pytest.mark.binder
@pytest.mark.timeout(1800)
def test_notebooks_run_in_a_fresh_binder_environment(tmp_path):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout to know which files Binder would see")
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        pytest.skip("needs uv (scripts/setup.sh installs it in .venv)")
    python = _runtime_version()
    options, _ = _requirements()
    wheel = _torch_wheel(_torch_pin(), python)

    repo, venv, home = tmp_path / "repo", tmp_path / "venv", tmp_path / "jupyter"
    _copy_repository(repo)
    assert not list(repo.rglob("_C*.so")), "the copy must not carry a built extension"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NEURON_LAB_", "PYTHON", "VIRTUAL_ENV", "CONDA", "JUPYTER", "TORCH_"))}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv),
               UV_PYTHON_DOWNLOADS="never", JUPYTER_CONFIG_DIR=str(home / "config"),
               JUPYTER_DATA_DIR=str(home / "data"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               IPYTHONDIR=str(home / "ipython"), MPLCONFIGDIR=str(home / "matplotlib"))
    timings = {}
    try:
        _build_and_run(uv, python, options, wheel, repo, venv, env, timings, tmp_path)
    finally:
        shutil.rmtree(venv, ignore_errors=True)  # over 1 GB; the copy and executed notebooks stay
    print("binder: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()))


def _build_and_run(uv: str, python: str, options: list[str], wheel: Path, repo: Path, venv: Path, env: dict,
                   timings: dict, tmp_path: Path) -> None:
    # repo2docker: a Python of runtime.txt's version, then pip install -r binder/requirements.txt.
    # Offline-friendly: the CPU index's torch comes from the wheel in build/wheels instead.
    timings["venv"] = _run([uv, "venv", "-q", "--seed", "--python", python, str(venv)], repo, env,
                           f"uv venv (Python {python})", 120)
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("".join(line + "\n" for line in
                                    (BINDER / "requirements.txt").read_text().splitlines()
                                    if line.strip() not in options))
    timings["requirements"] = _run(
        [uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), "--find-links", str(wheel.parent),
         "-r", str(requirements)], repo, env, "install binder/requirements.txt", 900)
    installed = subprocess.run([uv, "pip", "list", "--python", str(venv / "bin" / "python")],
                               capture_output=True, text=True, env=env, check=True).stdout
    assert re.search(rf"^torch\s+{re.escape(str(_torch_pin()))}\s*$", installed, re.M), installed
    assert not re.search(r"^nvidia-", installed, re.M), "a CUDA package was installed:\n" + installed

    # repo2docker: postBuild, from the repository root, with the environment's python first on PATH.
    timings["postBuild"] = _run(["bash", "binder/postBuild"], repo, env, "binder/postBuild", 1500)
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import neuron_lab; print(neuron_lab.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(repo), f"the fresh environment imports neuron_lab from {where}"

    # Every notebook, top to bottom, in that environment's kernel.
    out = tmp_path / "executed"
    for notebook in sorted((repo / "notebooks").glob("*.ipynb")):
        timings[notebook.name] = _run(
            [str(venv / "bin" / "jupyter"), "nbconvert", "--to", "notebook", "--execute",
             "--ExecutePreprocessor.timeout=300", "--ExecutePreprocessor.kernel_name=python3",
             "--output-dir", str(out), str(notebook.relative_to(repo))],
            repo, env, f"run {notebook.name}", 600)
    assert sorted(p.name for p in out.glob("*.ipynb")) == [p.name for p in NOTEBOOKS]
