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

CSRC = Path("neuron_lab/device/csrc")

EXTENSION = CppExtension(
    name="neuron_lab.device._C",
    sources=sorted(str(p) for p in CSRC.glob("*.cpp")),
    extra_compile_args=["-O2", "-g0", "-Wno-unused-parameter"],
)

# scripts/setup.sh installs the package in editable mode with
# NEURON_LAB_SKIP_EXTENSION=1, then builds the extension in place (incrementally,
# objects kept in build/), so that it is not compiled twice.
setup(
    ext_modules=[] if os.environ.get("NEURON_LAB_SKIP_EXTENSION") == "1" else [EXTENSION],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
