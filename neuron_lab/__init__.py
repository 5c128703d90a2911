"""neuron_lab: a Jupyter-first research workbench for PyTorch on the ``neuron`` device.

``import neuron_lab`` (or just ``import torch`` once neuron_lab is installed)
registers the ``neuron`` device; see ``neuron_lab.device``.
"""

from __future__ import annotations

from neuron_lab.device import register as _register

_register()

from neuron_lab.adaptive_eager import configure, get_mode, mode, set_mode  # noqa: E402
from neuron_lab import metrics, profiler  # noqa: E402
from neuron_lab.observability import explain, explain_scope  # noqa: E402

__all__ = ["__version__", "set_mode", "get_mode", "mode", "configure", "profiler", "metrics", "explain",
           "explain_scope"]
__version__ = "0.1.0"
