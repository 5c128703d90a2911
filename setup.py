"""Builds the native runtime of the `neuron` device (neuron_lab.device._C).

Everything else about the package lives in pyproject.toml. The extension needs
torch's headers at build time, so install with `--no-build-isolation` after
torch itself (the README's set-up commands do this).
"""

import os
from pathlib import Path

# Importing torch must not try to load the very extension this script builds.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

from setuptools import setup  # noqa: E402
from torch.utils.cpp_extension import BuildExtension, CppExtension  # noqa: E402

# The device runtime and the adaptive-eager recorder build into one extension.
CSRC_DIRS = [Path("neuron_lab/device/csrc"), Path("neuron_lab/adaptive_eager/csrc")]

EXTENSION = CppExtension(
    name="neuron_lab.device._C",
    sources=sorted(str(p) for d in CSRC_DIRS for p in d.glob("*.cpp")),
    extra_compile_args=["-O2", "-g0", "-Wno-unused-parameter"],
)

# scripts/setup.sh installs the package in editable mode with
# NEURON_LAB_SKIP_EXTENSION=1, then builds the extension in place (incrementally,
# objects kept in build/), so that it is not compiled twice.
setup(
    ext_modules=[] if os.environ.get("NEURON_LAB_SKIP_EXTENSION") == "1" else [EXTENSION],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
