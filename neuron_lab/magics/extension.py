"""``%load_ext neuron_lab`` and ``%unload_ext neuron_lab``: what the extension adds and removes.

Loading registers the magics (``neuron_lab.magics.magics``, ``%%neuron_distributed`` of
``neuron_lab.magics.distributed`` and ``%%neuron_compare`` of ``neuron_lab.magics.compare``), attaches the per-cell timer
(``neuron_lab.magics.autotime``: two IPython events and one AST transformer) with its line
on, routes tracebacks through ``neuron_lab.magics.cell_errors`` (late device errors shown at
the cell line that recorded them), and prints one line: devices, memory per core, mode. Loading again is harmless.
Unloading removes every magic, event and transformer it added and stops the dashboards.
"""

from __future__ import annotations

import weakref
from typing import Any

__all__ = ["load_ipython_extension", "unload_ipython_extension", "is_loaded"]

# shell -> its Magics instances (NeuronMagics first), while the extension is loaded in that shell
_LOADED: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def is_loaded(shell: Any) -> bool:
    """Whether the extension is loaded in ``shell``."""
    return shell in _LOADED


def load_ipython_extension(shell: Any) -> None:
    """Registers the neuron magics and per-cell timing in ``shell``; prints one line."""
    import neuron_lab
    from neuron_lab.device.autograd_threads import backward_on_calling_thread
    from neuron_lab.magics import cell_errors
    from neuron_lab.magics.autotime import CellTimer, timer_for
    from neuron_lab.magics.compare import CompareMagics
    from neuron_lab.magics.display import banner
    from neuron_lab.magics.distributed import DistributedMagics
    from neuron_lab.magics.magics import NeuronMagics

    backward_on_calling_thread()  # the thread that runs cells; see neuron_lab.device.autograd_threads
    if shell in _LOADED:
        print(banner(autotime=_LOADED[shell][0].timer.printing))
        return
    if not hasattr(neuron_lab, "explain_scope"):
        raise ImportError("neuron_lab.explain_scope is missing: this neuron_lab has no observability layer")
    timer = timer_for(shell)  # a dashboard may have started one, quietly
    if timer is None:
        timer = CellTimer(shell)
    timer.printing = True
    timer.attach()
    cell_errors.install(shell)  # late device errors: shown at the cell line that recorded them
    registered = [NeuronMagics(shell, timer=timer), DistributedMagics(shell), CompareMagics(shell)]
    for magics in registered:
        shell.register_magics(magics)
    _LOADED[shell] = registered
    print(banner(autotime=True))


def unload_ipython_extension(shell: Any) -> None:
    """Removes every magic, event callback and AST transformer the extension added."""
    from neuron_lab.magics import cell_errors
    from neuron_lab.magics.autotime import timer_for
    from neuron_lab.magics.dashboard import stop_dashboards

    manager = shell.magics_manager
    for magics in _LOADED.pop(shell, []):
        for kind, names in magics.magics.items():
            for name in names:
                manager.magics[kind].pop(name, None)
        if manager.registry.get(type(magics).__name__) is magics:
            del manager.registry[type(magics).__name__]
    stop_dashboards(shell)
    cell_errors.uninstall(shell)
    timer = timer_for(shell)
    if timer is not None:
        timer.detach()  # last: finishing the cell's device work may raise its error
