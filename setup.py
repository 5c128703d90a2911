"""Builds the native runtime of the `neuron` device (neuron_lab.device._C).

Everything else about the package lives in pyproject.toml. The extension needs
torch's headers at build time, and runs only with the torch it was built against: an
isolated build (plain `pip install .`) gets exactly the environment's torch from the
build backend (_build_backend.py); the README's set-up builds without isolation. The
torch version of the build is written to neuron_lab/device/_built_with.py, which the
device checks before it loads the extension.
"""

import os
import sys
from pathlib import Path

# pyproject.toml's requires-python, for builds that do not read it (python setup.py ...):
# the build backend's check, before torch is imported.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _build_backend import unsupported_python  # noqa: E402

_reason = unsupported_python(sys.implementation.name, tuple(sys.version_info))
if _reason is not None:
    sys.exit(f"error: {_reason}")

# Importing torch must not try to load the very extension this script builds.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

import torch  # noqa: E402
from setuptools import setup  # noqa: E402
from torch.utils.cpp_extension import BuildExtension, CppExtension  # noqa: E402

BUILT_WITH = Path("neuron_lab/device/_built_with.py")

# The device runtime, the adaptive-eager recorder and the fast host kernels build into one
# extension. Every .cpp under these folders is a source (the device's csrc has a folder per
# layer); sources include each other from the package root ("device/csrc/runtime/runtime.h").
CSRC_DIRS = [Path("neuron_lab/device/csrc"), Path("neuron_lab/adaptive_eager/csrc"), Path("neuron_lab/fastpath/csrc")]

# kineto's headers (torch ships them): torch.profiler's PrivateUse1 activity profiler
# (neuron_lab/device/csrc/tracing/kineto_plugin.cpp) implements its interface.
KINETO_INCLUDE = Path(torch.__file__).parent / "include" / "kineto"

# Hidden visibility (pybind11's advice for extension modules): the module exports only
# PyInit__C, so calls inside it go straight to their function instead of through the PLT,
# and functions of one file may be inlined into each other. -O2's cost model vectorizes only
# loops needing no scalar remainder, so the fast path's elementwise loops (whose lengths are
# known at run time only) ran one element at a time in their AVX2 and AVX-512 clones; the
# dynamic model vectorizes them. (Vectorizing never reassociates floating-point math without
# -ffast-math, so every element keeps its bits.) -fno-math-errno: without it std::sqrt of a
# negative number must set errno, so a loop over sqrt calls libm once per such element and is
# never vectorized (the fast rsqrt ran at half ATen's speed on inputs with negatives); the
# results are the same bits, and nothing here reads errno after a math function.
EXTENSION = CppExtension(
    name="neuron_lab.device._C",
    sources=sorted(str(p) for d in CSRC_DIRS for p in d.rglob("*.cpp")),
    include_dirs=[str(Path("neuron_lab").resolve()), str(KINETO_INCLUDE)],
    extra_compile_args=["-O2", "-fvect-cost-model=dynamic", "-g0", "-Wno-unused-parameter", "-fvisibility=hidden",
                        "-fno-semantic-interposition", "-fno-math-errno"],
)

# scripts/setup.sh installs the package in editable mode with
# NEURON_LAB_SKIP_EXTENSION=1, then builds the extension in place (incrementally,
# objects kept in build/), so that it is not compiled twice.
building_extension = os.environ.get("NEURON_LAB_SKIP_EXTENSION") != "1"
if building_extension:  # before setup(): build_py then copies it into wheels
    BUILT_WITH.write_text(
        '"""Written by setup.py: the torch the native extension was built against."""\n\n'
        f"TORCH_VERSION = {torch.__version__!r}\n"
    )

setup(
    ext_modules=[EXTENSION] if building_extension else [],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
