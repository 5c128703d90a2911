"""neuron_lab: a Jupyter-first research workbench for PyTorch on the ``neuron`` device.

``import neuron_lab`` (or just ``import torch`` once neuron_lab is installed)
registers the ``neuron`` device; see ``neuron_lab.device``.
"""

from __future__ import annotations

from neuron_lab.device import register as _register

__all__ = ["__version__"]
__version__ = "0.1.0"

_register()
