"""The IPython/Jupyter layer of neuron_lab: ``%load_ext neuron_lab``.

=========================  =====================================================  ===========================================
magic                      what it does                                           plain-Python twin
=========================  =====================================================  ===========================================
(per cell, automatic)      one line after each cell that used the device          ``neuron_lab.explain_scope()``
``%neuron_autotime``       that line on/off                                       ``e.summary_line()``
``%%neuron_profile``       op/graph table, timeline, memory, trace, explanation   ``neuron_lab.profiler.profile()``
``%neuron_memory``         memory per core                                        ``neuron_lab.magics.memory_report()``
``%neuron_mode``           show or set the execution mode                         ``neuron_lab.set_mode()`` / ``get_mode()``
``%neuron_status``         devices, streams, queue depths, graph cache, counters  ``neuron_lab.magics.status()``
``%neuron_explain``        diagnosis of the previous cell that used the device    ``neuron_lab.explain_scope()``
``%neuron_dashboard``      live ipywidgets dashboard                              ``neuron_lab.Dashboard()``
``%%neuron_distributed``   the cell on N ranks: output per rank, times, bytes     ``neuron_lab.launch.run_on_ranks()``
``%%neuron_compare``       the first op whose numbers leave a reference           ``neuron_lab.compare()``
=========================  =====================================================  ===========================================

Modules: ``extension`` (load/unload), ``autotime`` (per-cell scope: events and an AST
transformer), ``magics`` (the magics), ``distributed`` (``%%neuron_distributed``),
``compare`` (``%%neuron_compare``), ``cell_errors`` (late device errors at the cell's line),
``display`` (reports with HTML and text, no IPython), ``dashboard`` (ipywidgets).
Importing this package imports neither IPython nor ipywidgets. See ``docs/jupyter.md``.
"""

from __future__ import annotations

from typing import Any

from neuron_lab.magics.display import MemoryReport, StatusReport, memory_report, status
from neuron_lab.magics.extension import load_ipython_extension, unload_ipython_extension

__all__ = [
    "load_ipython_extension",
    "unload_ipython_extension",
    "memory_report",
    "status",
    "MemoryReport",
    "StatusReport",
    "Dashboard",
]


def __getattr__(name: str) -> Any:
    if name == "Dashboard":  # needs ipywidgets: imported on first use
        from neuron_lab.magics.dashboard import Dashboard

        return Dashboard
    raise AttributeError(f"module 'neuron_lab.magics' has no attribute {name!r}")
