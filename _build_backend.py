"""The package's PEP 517 build backend: setuptools', building against the torch it will run with.

The C++ extension runs only with the torch whose headers it was compiled against. An isolated
build (a plain ``pip install .``, ``pip install -e .``, ``python -m build``) would otherwise
install whatever ``torch>=2.13,<2.15`` resolves to (2.14 where 2.13 is installed), and the
device would not load. So the build asks for exactly the torch of the environment being
installed into, when it has one: pip runs these hooks with that environment's interpreter,
``python -m build`` from it (see _frontend_pythons).
Without build isolation, nothing changes (the installed torch is used as it is).
"""

from __future__ import annotations

import os
import subprocess
import sys

from setuptools.build_meta import *  # noqa: F401,F403 - every other hook is setuptools'

TORCH_RANGE = "torch>=2.13,<2.15"  # as in [project.dependencies]


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


# What the build needs besides [build-system] requires. setuptools' own hooks would run
# setup.py to ask, which needs torch before it is installed; the package has no other
# setup-time requirements.
def get_requires_for_build_wheel(config_settings=None):
    return [_target_torch()]


def get_requires_for_build_editable(config_settings=None):
    return [_target_torch()]
