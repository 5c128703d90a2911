"""neuron_lab: a Jupyter-first research workbench for PyTorch on the ``neuron`` device.

``import neuron_lab`` (or just ``import torch`` once neuron_lab is installed)
registers the ``neuron`` device; see ``neuron_lab.device``.
"""

from __future__ import annotations

from neuron_lab.device import register as _register

_register()

from neuron_lab import adaptive_eager as _adaptive_eager  # noqa: E402
from neuron_lab import distributed as _distributed  # noqa: E402
from neuron_lab import fastpath as _fastpath  # noqa: E402
from neuron_lab import integrations as _integrations  # noqa: E402
from neuron_lab.device.registration import on_first_use as _on_first_use  # noqa: E402

_fastpath.start()  # fast host kernels: NEURON_LAB_FASTPATH, and the torch versions they were validated on
_adaptive_eager.start()  # the runtime that records ops on the device
_distributed.register_backend()  # init_process_group("neuron")
_integrations.install_at_import()
_on_first_use(_integrations.install_on_first_use)

from neuron_lab.adaptive_eager import configure, configured, get_mode, mode, set_mode  # noqa: E402
from neuron_lab import metrics, profiler  # noqa: E402
from neuron_lab.observability import explain, explain_scope  # noqa: E402
from neuron_lab import kernels  # noqa: E402

__all__ = ["__version__", "set_mode", "get_mode", "mode", "configure", "configured", "profiler", "metrics", "explain",
           "explain_scope", "kernels", "compare",
           "load_ipython_extension", "unload_ipython_extension", "Dashboard"]
__version__ = "0.1.0"


def load_ipython_extension(ipython) -> None:  # noqa: ANN001 - an IPython InteractiveShell
    """``%load_ext neuron_lab``: magics, per-cell timing, one status line (see ``neuron_lab.magics``)."""
    from neuron_lab.magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython) -> None:  # noqa: ANN001
    """``%unload_ext neuron_lab``: removes every magic, hook and transformer it added."""
    from neuron_lab.magics import unload_ipython_extension as unload

    unload(ipython)


def __getattr__(name: str):
    if name == "Dashboard":  # ipywidgets only when asked for
        from neuron_lab.magics.dashboard import Dashboard

        return Dashboard
    if name == "compare":  # neuron_lab.observability.compare, imported on first use
        from neuron_lab.observability.compare import compare

        return compare
    raise AttributeError(f"module 'neuron_lab' has no attribute {name!r}")
