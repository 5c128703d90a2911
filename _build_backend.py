"""The package's PEP 517 build backend: setuptools', building against the torch it will run with.

The C++ extension runs only with the torch whose headers it was compiled against. An isolated
build (a plain ``pip install .``, ``pip install -e .``, ``python -m build``) would otherwise
install whatever ``torch>=2.13,<2.15`` resolves to (2.14 where 2.13 is installed), and the
device would not load. So the build asks for exactly the torch of the environment being
installed into, when it has one: pip runs these hooks with that environment's interpreter.
Without build isolation, nothing changes (the installed torch is used as it is).
"""

from __future__ import annotations

import subprocess
import sys

from setuptools.build_meta import *  # noqa: F401,F403 - every other hook is setuptools'

TORCH_RANGE = "torch>=2.13,<2.15"  # as in [project.dependencies]


def _target_torch() -> str:
    """``torch==<version>`` of the environment that runs this build, else the supported range."""
    # -I: isolated mode, so the interpreter sees its own site-packages, not the build's overlay.
    probe = "import importlib.metadata as m; print(m.version('torch'))"
    try:
        found = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return TORCH_RANGE
    version = found.stdout.strip()
    return f"torch=={version}" if found.returncode == 0 and version else TORCH_RANGE


# What the build needs besides [build-system] requires. setuptools' own hooks would run
# setup.py to ask, which needs torch before it is installed; the package has no other
# setup-time requirements.
def get_requires_for_build_wheel(config_settings=None):
    return [_target_torch()]


def get_requires_for_build_editable(config_settings=None):
    return [_target_torch()]
