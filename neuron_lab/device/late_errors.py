"""Errors the device raises late, shown at the line that recorded the failing op.

In the asynchronous modes an error that only a kernel detects (an index out of range)
happens when the device runs the op, after its line returned, and is raised at the next
wait: a ``print``, ``.item()``, a synchronize, lines further down. The message names the
op, its inputs and the recording line (the runtime writes it, with the line's text). This
module makes the traceback say the same, for whatever shows the error (IPython's
``showtraceback``, a script's ``sys.excepthook``):

* the frames below the user's line that waited are dropped (torch's printing code, the
  runtime's Python): they say nothing about the error;
* the recording line is added as the innermost frame, so that the error reads as raised
  there: the frame that recorded the op when it is still running (a cell's), else a
  frame made for the line's file and function (Python's tracebacks show file, line and
  text; no frame of ours is shown);
* a note (PEP 678) says where the error was raised and what ran in between: the lines of
  the same code between the two, and the ops recorded after it that never ran.

``rewrite(error)`` does this once per error; ``install_excepthook()`` applies it to a
script's uncaught errors (the IPython extension applies it to a cell's).
"""

from __future__ import annotations

import dis
import functools
import linecache
import os
import sys
import types
from typing import Any, Optional

__all__ = ["failure_of", "rewrite", "install_excepthook", "describe_line", "cell_name"]

_MARK = "_neuron_late_error"  # set on an error once rewritten
_BETWEEN_LINES_SHOWN = 6
_NOT_RUN_SHOWN = 8
_FINISH_CELL = ("finish_cell", os.path.join("neuron_lab", "magics", "autotime.py"))


def failure_of(error: BaseException) -> Optional[dict[str, Any]]:
    """The device's record of the failed op behind ``error``, if ``error`` is a late
    device error (``trace.async_failures()``: op, recording line, ops not run)."""
    from neuron_lab.device import trace

    message = str(error)
    if "failed on neuron:" not in message:
        return None
    for failure in reversed(trace.async_failures()):
        if failure["context"] and failure["context"] in message:
            return failure
    return None


def cell_name(file: str) -> Optional[str]:
    """IPython's name for the cell compiled to ``file`` ("Cell In[7]"), or None outside IPython.

    Kernels compile each cell to a file such as ``/tmp/ipykernel_123/1390148714.py``;
    IPython's compiler maps it back to its execution count, as its tracebacks do."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    format_code_name = getattr(getattr(shell, "compile", None), "format_code_name", None)
    if format_code_name is None:
        return None
    try:
        named = format_code_name(file)
    except Exception:  # noqa: BLE001 - an IPython without the mapping: plain file names
        return None
    return None if named is None else f"{named[0]} {named[1]}"


def describe_line(file: str, line: int, function: str = "<module>") -> str:
    """``Cell In[7], line 4`` (``, in f`` inside a function) for a notebook cell, as IPython
    names it; ``File "/path/x.py", line 4, in f`` otherwise, as Python's tracebacks do."""
    cell = cell_name(file)
    if cell is not None:
        return f"{cell}, line {line}" + ("" if function == "<module>" else f", in {function}")
    return f'File "{file}", line {line}, in {function}'


@functools.lru_cache(maxsize=1)
def _library_prefixes() -> tuple[str, ...]:
    from neuron_lab.device.registration import _library_prefixes as prefixes

    return tuple(prefixes())


def _is_library(frame: types.FrameType, prefixes: tuple[str, ...]) -> bool:
    file = frame.f_code.co_filename
    return file.startswith(prefixes) or file.startswith("<frozen")


def _entries(tb: Optional[types.TracebackType]) -> list[types.TracebackType]:
    out = []
    while tb is not None:
        out.append(tb)
        tb = tb.tb_next
    return out


def _offset_on_line(code: types.CodeType, line: int) -> int:
    """The byte offset of the call (or operator) on ``line`` of ``code``, for the
    traceback's column markers; -1 when the line has no instruction of ``code``."""
    first = -1
    try:
        for instruction in dis.get_instructions(code):
            positions = instruction.positions
            if positions is None or positions.lineno != line:
                continue
            if first < 0:
                first = instruction.offset
            if instruction.opname in ("CALL", "BINARY_OP", "BINARY_SUBSCR", "COMPARE_OP"):
                return instruction.offset
    except Exception:  # noqa: BLE001 - no markers, the line still shows
        return -1
    return first


def _frame_for(file: str, function: str, line: int) -> types.FrameType:
    """A frame whose code names ``file`` and ``function`` and has an instruction on ``line``:
    what a traceback entry for a line of code that has returned stands on (its text comes
    from the file; the entry's offset must lie on its line, or tools that map offsets to
    source, such as IPython's, misread it)."""
    code = compile("\n" * (line - 1) + "frame = __import__('sys')._getframe()", file, "exec")
    if function and function != code.co_name and function.isidentifier():
        code = code.replace(co_name=function, co_qualname=function)
    namespace: dict[str, Any] = {}
    exec(code, namespace)  # noqa: S102 - one fixed statement
    return namespace["frame"]


def _quote(file: str, line: int) -> str:
    return linecache.getline(file, line).strip()


def rewrite(error: BaseException, tb: Optional[types.TracebackType] = None) -> Optional[types.TracebackType]:
    """Makes a late device error read as raised at its recording line (see the module's
    docstring) and returns the traceback to show; None when ``error`` is not one, or was
    rewritten already. ``tb`` defaults to ``error.__traceback__``."""
    if getattr(error, _MARK, False):
        return None
    failure = failure_of(error)
    if failure is None:
        return None
    setattr(error, _MARK, True)
    file, line, function = failure["recorded"]
    entries = _entries(tb if tb is not None else error.__traceback__)
    prefixes = _library_prefixes()
    user = [i for i, entry in enumerate(entries) if not _is_library(entry.tb_frame, prefixes)]
    last = user[-1] if user else -1
    kept = entries[:last + 1]
    dropped = entries[last + 1:]
    # Raised by the extension at a cell's end (finish_cell, which waits for the cell's work):
    # the cell's last line did not raise it.
    at_cell_end = bool(dropped) and dropped[0].tb_frame.f_code.co_name == _FINISH_CELL[0] \
        and dropped[0].tb_frame.f_code.co_filename.endswith(_FINISH_CELL[1])
    raised_at = None if at_cell_end or not kept else kept[-1]
    if at_cell_end and kept:
        kept = kept[:-1]

    recorded_entry = None
    if file and line > 0:
        frame = next((e.tb_frame for e in reversed(kept)
                      if e.tb_frame.f_code.co_filename == file and e.tb_frame.f_code.co_name == function), None)
        offset = _offset_on_line(frame.f_code, line) if frame is not None else -1
        if offset < 0:  # the line's code has returned (a cell compiles statement by statement)
            frame = _frame_for(file, function, line)
            offset = _offset_on_line(frame.f_code, line)
        recorded_entry = types.TracebackType(None, frame, offset, line)

    chain = kept + ([recorded_entry] if recorded_entry is not None else [])
    for outer, inner in zip(chain, chain[1:]):
        outer.tb_next = inner
    if chain:
        chain[-1].tb_next = None
    head = chain[0] if chain else None
    error.__traceback__ = head
    if hasattr(error, "add_note"):
        error.add_note(_note(failure, raised_at, at_cell_end))
    return head


def _note(failure: dict[str, Any], raised_at: Optional[types.TracebackType], at_cell_end: bool) -> str:
    file, line, function = failure["recorded"]
    recorded = describe_line(file, line, function) if file else "an unknown line (autograd's backward pass?)"
    lines = [f"neuron_lab: {failure['op']} was recorded at {recorded} and ran on the device after that line "
             "had returned; its error was raised at the next wait,"]
    if at_cell_end:
        lines[0] += " when the cell ended (neuron_lab waits for a cell's device work there)."
    elif raised_at is not None:
        code = raised_at.tb_frame.f_code
        where = describe_line(code.co_filename, raised_at.tb_lineno, code.co_name)
        text = _quote(code.co_filename, raised_at.tb_lineno)
        lines[0] += f" {where}" + (f": {text}" if text else ".")
        same_code = code.co_filename == file and code.co_name == function
        if same_code and raised_at.tb_lineno > line + 1:
            between = range(line + 1, raised_at.tb_lineno)
            lines.append(f"Between the two, lines {between[0]}-{between[-1]} ran:" if len(between) > 1
                         else f"Between the two, line {between[0]} ran:")
            for n in list(between)[:_BETWEEN_LINES_SHOWN]:
                lines.append(f"  {n:>4} {linecache.getline(file, n).rstrip()}")
            if len(between) > _BETWEEN_LINES_SHOWN:
                lines.append(f"  ... and {len(between) - _BETWEEN_LINES_SHOWN} more lines")
        elif not same_code or raised_at.tb_lineno < line:
            lines.append("Between the two, the program went on from the recording line to the line that waited.")
    else:
        lines[0] += " outside Python code."
    not_run = failure["not_run"]
    if not_run:
        shown = []
        for op, (op_file, op_line, op_function) in not_run[:_NOT_RUN_SHOWN]:
            if not op_file:
                shown.append(op)
            elif op_file == file:
                shown.append(f"{op} (line {op_line})")
            else:
                shown.append(f"{op} ({describe_line(op_file, op_line, op_function)})")
        more = f" and {len(not_run) - _NOT_RUN_SHOWN} more" if len(not_run) > _NOT_RUN_SHOWN else ""
        lines.append(f"Recorded after it in its launch and not run: {', '.join(shown)}{more}; the tensors they "
                     "write hold no values (reading one raises).")
    return "\n".join(lines)


def install_excepthook() -> None:
    """Applies ``rewrite`` to a script's uncaught errors: wraps ``sys.excepthook`` when it
    is Python's own (a hook someone else set is left alone). Idempotent."""
    if sys.excepthook is not sys.__excepthook__:
        return
    previous = sys.excepthook

    def excepthook(etype: type, value: BaseException, tb: Optional[types.TracebackType]) -> None:
        try:
            rewritten = rewrite(value, tb)
        except Exception:  # noqa: BLE001 - showing the error as it came beats losing it
            rewritten = None
        previous(etype, value, rewritten if rewritten is not None else tb)

    excepthook.__wrapped__ = previous  # type: ignore[attr-defined]
    sys.excepthook = excepthook
