"""Builds the native runtime of the `neuron` device (neuron_lab.device._C).

Everything else about the package lives in pyproject.toml. The extension needs
torch's headers at build time, so install with `--no-build-isolation` after
torch itself (the README's set-up commands do this).
"""

from pathlib import Path

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

CSRC = Path("neuron_lab/device/csrc")

setup(
    ext_modules=[
        CppExtension(
            name="neuron_lab.device._C",
            sources=sorted(str(p) for p in CSRC.glob("*.cpp")),
            extra_compile_args=["-O2", "-g0", "-Wno-unused-parameter"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
