"""Late device errors in a notebook: named by cell, shown at the line that recorded them.

Two things, attached by ``%load_ext neuron_lab`` and removed by ``%unload_ext``:

* ``register_cell_sources(shell)`` tells the device how IPython names each cell's file
  (``Cell In[7]``) and gives it the cell's text, so that the runtime's messages say
  "recorded at Cell In[7], line 4: h = emb(ids)" instead of a temporary file name. The
  per-cell timer calls it as each cell starts (its AST transformer runs once IPython has
  compiled the cell).
* ``install(shell)`` routes the shell's tracebacks through
  ``neuron_lab.device.late_errors.rewrite``: a late device error's traceback ends at the
  recording line instead of inside torch's printing code, with a note on what ran between.
"""

from __future__ import annotations

import linecache
import weakref
from typing import Any

__all__ = ["register_cell_sources", "install", "uninstall"]

# shell -> the cell files already named to the device
_REGISTERED: "weakref.WeakKeyDictionary[Any, set[str]]" = weakref.WeakKeyDictionary()
_MARK = "_neuron_lab_late_errors"


def register_cell_sources(shell: Any) -> None:
    """Names every cell file IPython compiled and the device has not been told of yet."""
    from neuron_lab.device import trace

    compiler = getattr(shell, "compile", None)
    mapping = getattr(compiler, "_filename_map", None)  # IPython's own: file -> execution count
    format_code_name = getattr(compiler, "format_code_name", None)
    if not isinstance(mapping, dict) or format_code_name is None:
        return
    try:
        seen = _REGISTERED.setdefault(shell, set())
    except TypeError:  # a shell that takes no weak references: name the files anyway
        seen = set()
    for file in [f for f in list(mapping) if f not in seen]:
        named = format_code_name(file)
        if named is None:
            continue
        trace.set_source_name(file, f"{named[0]} {named[1]}", [line.rstrip("\n") for line in linecache.getlines(file)])
        seen.add(file)


def install(shell: Any) -> None:
    """Routes ``shell.showtraceback`` through ``late_errors.rewrite`` (idempotent)."""
    current = shell.showtraceback
    if getattr(current, _MARK, False):
        return

    def showtraceback(exc_tuple: Any = None, *args: Any, **kwargs: Any) -> Any:
        from neuron_lab.device import late_errors

        try:
            etype, value, tb = shell._get_exc_info(exc_tuple)
            register_cell_sources(shell)  # a %%neuron_profile body's own file, compiled mid-cell
            rewritten = late_errors.rewrite(value, tb)
            if rewritten is not None:
                exc_tuple = (etype, value, rewritten)
        except Exception:  # noqa: BLE001 - no exception to show, or one we cannot read: IPython's way
            pass
        return current(exc_tuple, *args, **kwargs)

    setattr(showtraceback, _MARK, True)
    showtraceback.__wrapped__ = current  # type: ignore[attr-defined]
    shell.showtraceback = showtraceback


def uninstall(shell: Any) -> None:
    """Gives the shell its own ``showtraceback`` back."""
    current = shell.__dict__.get("showtraceback")
    if current is not None and getattr(current, _MARK, False):
        previous = current.__wrapped__
        if getattr(previous, "__self__", None) is shell and previous.__func__ is type(shell).showtraceback:
            del shell.showtraceback
        else:
            shell.showtraceback = previous
