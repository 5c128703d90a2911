"""The package's PEP 517 build backend: setuptools', for a supported Python, against the torch it will run with.

Two things a plain setuptools build gets wrong here:

* **The Python.** The extension reads CPython's private frame structs, laid out anew in each
  minor version (neuron_lab/device/csrc/tracing/source.cpp): it builds for CPython 3.11 to 3.13 only.
  pip checks ``requires-python`` only after the build requirements (setuptools, then torch,
  hundreds of MB) are installed into the build environment. So ``[build-system] requires`` is
  empty, and the first hook pip calls (``get_requires_for_build_*``) refuses any other Python
  before anything is downloaded, with the reason and the fix; setuptools and torch are asked
  for only once the Python is known to be one the extension builds for.
* **The torch.** The C++ extension runs only with the torch whose headers it was compiled
  against. An isolated build (a plain ``pip install .``, ``pip install -e .``, ``python -m
  build``) would otherwise install whatever ``torch>=2.13,<2.15`` resolves to (2.14 where 2.13
  is installed), and the device would not load. So the build asks for exactly the torch of the
  environment being installed into, when it has one: pip runs these hooks with that
  environment's interpreter, ``python -m build`` from it (see _frontend_pythons). Without build
  isolation, the installed torch is used as it is.

Every other hook is setuptools', imported only when called.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

__all__ = [
    "SUPPORTED_PYTHONS",
    "unsupported_python",
    "get_requires_for_build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "prepare_metadata_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "build_wheel",
    "build_editable",
    "build_sdist",
]

# The CPython minor versions whose frame layout source.cpp knows; pyproject.toml's
# requires-python says the same (tests/device/test_device.py checks that they agree).
SUPPORTED_PYTHONS = ((3, 11), (3, 12), (3, 13))
TORCH_RANGE = "torch>=2.13,<2.15"  # as in [project.dependencies]
SETUPTOOLS_REQUIRES = ["setuptools>=64", "wheel", "ninja"]


def unsupported_python(implementation: str, version: tuple[int, ...]) -> str | None:
    """Why this interpreter cannot build the package, with the fix; None when it can."""
    if implementation == "cpython" and tuple(version[:2]) in SUPPORTED_PYTHONS:
        return None
    names = ", ".join(f"{major}.{minor}" for major, minor in SUPPORTED_PYTHONS)
    found = f"{'CPython' if implementation == 'cpython' else implementation} {version[0]}.{version[1]}"
    newest = "{}.{}".format(*SUPPORTED_PYTHONS[-1])
    return (
        f"neuron_lab builds for CPython {names} only, not {found}: its device reads each op's source "
        "line from CPython's own frame structs, whose layout changes with every minor version. "
        f"Create the environment with one of those, e.g. `python{newest} -m venv .venv` "
        f"(or `uv venv --python {newest}`), and install there."
    )


def _refuse_unsupported_python() -> None:
    reason = unsupported_python(sys.implementation.name, tuple(sys.version_info))
    if reason is not None:
        # SystemExit: pip shows the message as the hook's output, with no traceback.
        raise SystemExit(f"error: {reason}")


def _torch_of(python: str) -> str:
    """The torch version installed for this interpreter ("" when none)."""
    # -I: isolated mode, so the interpreter sees its own site-packages, not the build's overlay.
    probe = "import importlib.metadata as m; print(m.version('torch'))"
    try:
        found = subprocess.run([python, "-I", "-c", probe], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return found.stdout.strip() if found.returncode == 0 else ""


def _frontend_pythons() -> list[str]:
    """The interpreters of the processes that started this build, nearest first (Linux).

    pip runs the hooks with the target environment's interpreter, but ``python -m build``
    runs them in a fresh virtual environment of its own; the environment the user built
    from is then the one that ran the frontend."""
    pythons, pid = [], os.getppid()
    for _ in range(4):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv0 = f.read().split(b"\0", 1)[0].decode()
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        if os.path.basename(argv0).startswith("python") and os.path.isabs(argv0):
            pythons.append(argv0)
        if pid <= 1:
            break
    return pythons


def _target_torch() -> str:
    """``torch==<version>`` of the environment being built for, else the supported range."""
    for python in [sys.executable, *_frontend_pythons()]:
        version = _torch_of(python)
        if version:
            return f"torch=={version}"
    return TORCH_RANGE


def _setuptools() -> Any:
    import setuptools.build_meta

    return setuptools.build_meta


# What the build needs. setuptools' own hooks would run setup.py to ask, which needs torch
# before it is installed; the package has no other setup-time requirements.
def get_requires_for_build_wheel(config_settings: dict | None = None) -> list[str]:
    _refuse_unsupported_python()
    return [*SETUPTOOLS_REQUIRES, _target_torch()]


def get_requires_for_build_editable(config_settings: dict | None = None) -> list[str]:
    _refuse_unsupported_python()
    return [*SETUPTOOLS_REQUIRES, _target_torch()]


def get_requires_for_build_sdist(config_settings: dict | None = None) -> list[str]:
    return ["setuptools>=64"]  # an sdist compiles nothing: any Python may make one


# Without build isolation (pip --no-build-isolation, uv's as well) the get_requires hooks are
# not called: the metadata and build hooks refuse too, before setup.py imports torch.
def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: dict | None = None) -> str:
    _refuse_unsupported_python()
    return _setuptools().prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def prepare_metadata_for_build_editable(metadata_directory: str, config_settings: dict | None = None) -> str:
    _refuse_unsupported_python()
    return _setuptools().prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_wheel(wheel_directory: str, config_settings: dict | None = None, metadata_directory: str | None = None) -> str:
    _refuse_unsupported_python()
    return _setuptools().build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(
    wheel_directory: str, config_settings: dict | None = None, metadata_directory: str | None = None
) -> str:
    _refuse_unsupported_python()
    return _setuptools().build_editable(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory: str, config_settings: dict | None = None) -> str:
    return _setuptools().build_sdist(sdist_directory, config_settings)

