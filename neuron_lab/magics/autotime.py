"""Per-cell timing: every cell runs inside ``neuron_lab.explain_scope()``.

How a cell is tracked (one ``CellTimer`` per shell):

1. ``pre_run_cell`` enters an explain scope and *arms* the AST transformer.
2. The armed transformer rewrites the cell (once; ``%time``/``%timeit`` bodies and
   nested ``run_cell`` calls are left alone) so that its last statement closes the
   scope from *inside* the cell's execution:

   * a last expression ``expr`` becomes ``finish_cell(token, expr)``, which closes the
     scope and returns the value, so IPython still displays it (``Out[n]``, ``_``);
   * any other last statement gets ``finish_cell(token, None)`` appended (IPython
     displays nothing for ``None``).

   Closing the scope finishes the cell's pending device work, so an asynchronous
   device error raises *there*: IPython shows it as this cell's error, marks the cell
   failed (nbval, ``ExecutionResult.success``) and the kernel stays usable.
3. ``post_run_cell`` closes the scope if the cell never reached its end (an exception,
   a syntax error, an interrupt); an asynchronous error found then is shown as this
   cell's error too and recorded on its ``ExecutionResult``. It then keeps the
   explanation (``%neuron_explain``), prints ``summary_line()`` when the cell used
   the device and printing is on (``%neuron_autotime on|off``), and notifies listeners
   (the dashboards).

Plain-Python twin: ``with neuron_lab.explain_scope() as e: ...`` then ``print(e.summary_line())``.
"""

from __future__ import annotations

import ast
import collections
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Deque, Optional

__all__ = ["CellRecord", "CellTimer", "finish_cell", "timer_for"]

# Every attached timer, by the token its transformer writes into cells.
_TIMERS: dict[int, "CellTimer"] = {}

# What the rewritten cell calls: resolvable from any namespace without adding names to it.
_FINISH_MODULE = __name__
_FINISH_FUNCTION = "finish_cell"


@dataclass(frozen=True)
class CellRecord:
    """What one cell did on the device.

    execution_count: the cell's ``In [n]`` number (None for cells not stored in history).
    explanation: the ``neuron_lab`` Explanation of the cell (``summary_line()``, ``str``, HTML).
    succeeded: False when the cell raised (synchronously or at its final synchronize).
    error: ``"IndexError: ..."`` (first line) for a failed cell.
    """

    execution_count: Optional[int]
    explanation: Any
    succeeded: bool
    error: Optional[str] = None

    @property
    def used_device(self) -> bool:
        """Whether the cell used the device (``Explanation.used_device``: reading memory
        statistics alone, as ``%neuron_memory`` does, does not count)."""
        return bool(getattr(self.explanation, "used_device", False))

    @property
    def label(self) -> str:
        return "In [?]" if self.execution_count is None else f"In [{self.execution_count}]"

    @property
    def interrupted(self) -> bool:
        """The cell was stopped by the user (Kernel > Interrupt: KeyboardInterrupt)."""
        return bool(self.error) and self.error.startswith("KeyboardInterrupt")


def finish_cell(token: int, value: Any = None) -> Any:
    """Called by the last statement of a tracked cell: closes the cell's explain scope
    (finishing its device work, which raises the cell's asynchronous errors) and returns
    ``value`` unchanged so that IPython displays it."""
    timer = _TIMERS.get(token)
    error = timer._close_scope_in_cell() if timer is not None else None
    if error is not None:
        # Device work this cell queued failed asynchronously: its error is this cell's error,
        # raised at the cell's end (the message names the failing op and the line that queued it).
        raise error.with_traceback(None)
    return value


def timer_for(shell: Any) -> Optional["CellTimer"]:
    """The timer attached to ``shell``, if any."""
    for timer in _TIMERS.values():
        if timer.shell is shell:
            return timer
    return None


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


class _CellFinisher(ast.NodeTransformer):
    """Rewrites an armed cell so that it closes its explain scope as its last action."""

    def __init__(self, timer: "CellTimer") -> None:
        super().__init__()
        self.timer = timer

    def visit(self, node: ast.AST) -> ast.AST:
        # Only the top-level module of the armed cell; never raise (IPython would
        # unregister the transformer).
        if not isinstance(node, ast.Module) or not self.timer._disarm():
            return node
        try:
            # IPython has compiled the cell by now: the device's messages name it "Cell In[n]".
            from neuron_lab.magics.cell_errors import register_cell_sources

            register_cell_sources(self.timer.shell)
        except Exception:  # noqa: BLE001 - messages then name the cell's file
            pass
        try:
            return self._rewrite(node)
        except Exception:  # noqa: BLE001 - fall back to closing the scope in post_run_cell
            return node

    def _call(self, value: ast.expr, where: ast.AST) -> ast.Call:
        module = ast.Call(
            func=ast.Name(id="__import__", ctx=ast.Load()),
            args=[ast.Constant(_FINISH_MODULE)],
            keywords=[ast.keyword(arg="fromlist", value=ast.List(elts=[ast.Constant(_FINISH_FUNCTION)],
                                                                   ctx=ast.Load()))],
        )
        call = ast.Call(
            func=ast.Attribute(value=module, attr=_FINISH_FUNCTION, ctx=ast.Load()),
            args=[ast.Constant(self.timer.token), value],
            keywords=[],
        )
        for n in ast.walk(call):
            ast.copy_location(n, where)
        return call

    def _rewrite(self, module: ast.Module) -> ast.Module:
        body = module.body
        if not body:
            return module
        last = body[-1]
        if isinstance(last, ast.Expr):
            last.value = self._call(last.value, last.value)
            return module
        value: ast.expr = ast.Constant(None)
        interactivity = getattr(self.timer.shell, "ast_node_interactivity", "last_expr")
        if interactivity == "last_expr_or_assign":
            target = _single_name_target(last)
            if target is not None:  # IPython would display the assigned name: keep that
                value = ast.Name(id=target, ctx=ast.Load())
        end = ast.Pass()
        end.lineno = end.end_lineno = getattr(last, "end_lineno", None) or last.lineno
        end.col_offset = end.end_col_offset = 0
        ast.copy_location(value, end)
        statement = ast.Expr(value=self._call(value, end))
        ast.copy_location(statement, end)
        body.append(statement)
        return module


def _single_name_target(node: ast.stmt) -> Optional[str]:
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target = node.targets[0]
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        target = node.target
    else:
        return None
    return target.id if isinstance(target, ast.Name) else None


class CellTimer:
    """Runs every cell of ``shell`` inside an explain scope and keeps the results.

    printing: print the cell's ``summary_line()`` after cells that used the device.
    history: how many ``CellRecord``s to keep (``records``).
    """

    def __init__(self, shell: Any, printing: bool = True, history: int = 200) -> None:
        self.shell = shell
        self.printing = printing
        self.records: Deque[CellRecord] = collections.deque(maxlen=history)
        self.token = id(self)
        self._listeners: list[Callable[[CellRecord], None]] = []
        self._transformer = _CellFinisher(self)
        self._scope: Any = None  # the open explain scope of the tracked cell
        self._explanation: Any = None
        self._scope_error: Optional[BaseException] = None  # raised by the in-cell close
        self._depth = 0  # >1 while a cell runs nested run_cell calls
        self._armed = False
        self._attached = False
        # (label, time.monotonic() at its start) of the cell running now, for live views
        self.running: Optional[tuple[str, float]] = None

    # ---- lifecycle ---------------------------------------------------------------------

    def attach(self) -> "CellTimer":
        """Registers the IPython events and the AST transformer (idempotent)."""
        if self._attached:
            return self
        _TIMERS[self.token] = self
        self.shell.events.register("pre_run_cell", self._pre_run_cell)
        self.shell.events.register("post_run_cell", self._post_run_cell)
        if self._transformer not in self.shell.ast_transformers:
            self.shell.ast_transformers.append(self._transformer)
        self._attached = True
        return self

    def detach(self) -> None:
        """Removes the events and the transformer, and closes a scope still open.

        Pending device work of the current cell is finished; an asynchronous error
        found then is raised (it belongs to the cell that detaches)."""
        if not self._attached:
            return
        self._attached = False
        _TIMERS.pop(self.token, None)
        for event, callback in (("pre_run_cell", self._pre_run_cell), ("post_run_cell", self._post_run_cell)):
            if callback in self.shell.events.callbacks[event]:
                self.shell.events.unregister(event, callback)
        if self._transformer in self.shell.ast_transformers:
            self.shell.ast_transformers.remove(self._transformer)
        self._listeners.clear()
        self._armed = False
        self._depth = 0
        self.running = None
        scope, self._scope = self._scope, None
        if scope is not None:
            scope.__exit__(None, None, None)

    @property
    def attached(self) -> bool:
        return self._attached

    def add_listener(self, callback: Callable[[CellRecord], None]) -> None:
        """Calls ``callback(record)`` after every tracked cell (from ``post_run_cell``)."""
        if callback not in self._listeners:
            self._listeners.append(callback)

    def remove_listener(self, callback: Callable[[CellRecord], None]) -> None:
        if callback in self._listeners:
            self._listeners.remove(callback)

    # ---- what the magics read ------------------------------------------------------------

    @property
    def last(self) -> Optional[CellRecord]:
        """The most recent finished cell."""
        return self.records[-1] if self.records else None

    def last_device_cell(self) -> Optional[CellRecord]:
        """The most recent finished cell that used the device."""
        return next((r for r in reversed(self.records) if r.used_device), None)

    def record_of(self, execution_count: int) -> Optional[CellRecord]:
        """The kept record of ``In [execution_count]``."""
        return next((r for r in reversed(self.records) if r.execution_count == execution_count), None)

    # ---- IPython events ------------------------------------------------------------------

    def _pre_run_cell(self, info: Any = None) -> None:
        if self._depth > 0:  # a run_cell inside a tracked cell belongs to that cell
            self._depth += 1
            return
        import neuron_lab

        self._depth = 1
        self._scope_error = None
        label = self._cell_label(info)
        self.running = (label.removeprefix("cell "), time.monotonic())
        scope = neuron_lab.explain_scope(label=label)
        self._explanation = scope.__enter__()
        self._scope = scope
        self._armed = True

    def _cell_label(self, info: Any) -> str:
        """``cell In [n]``: run_cell has already advanced the counter of a cell kept in history."""
        count = self.shell.execution_count - (1 if getattr(info, "store_history", True) else 0)
        return f"cell In [{count}]"

    def _disarm(self) -> bool:
        """True once per tracked cell: the transformer rewrites only that cell."""
        armed, self._armed = self._armed, False
        return armed

    def end_measurement(self) -> Optional[BaseException]:
        """Ends the running cell's measurement now, inside its execution (``%%neuron_profile``
        calls it when the profiled code is done: the profiler's processing and rendering that
        follow are not billed to the cell's line). Returns the asynchronous error that finishing
        the cell's device work raised, if any, for the caller to raise as the cell's error."""
        return self._close_scope_in_cell()

    def _close_scope_in_cell(self) -> Optional[BaseException]:
        """The cell reached its end: finishes its device work inside its execution and
        returns the asynchronous error that raised, if any (``finish_cell`` raises it)."""
        if self._depth != 1 or self._scope is None:
            return None
        scope, self._scope = self._scope, None
        try:
            scope.__exit__(None, None, None)
        except BaseException as e:  # noqa: BLE001 - handed to the cell
            self._scope_error = e
            return e
        return None

    def _post_run_cell(self, result: Any = None) -> None:
        if self._depth > 1:
            self._depth -= 1
            return
        if self._depth == 0:  # the cell started before this timer was attached
            return
        self._depth = 0
        self._armed = False
        self.running = None
        cell_error = self._cell_error(result)
        if self._scope is not None:  # the cell did not reach its end
            scope, self._scope = self._scope, None
            try:
                # Closed as a region that ended normally (the cell's own error is already
                # shown), so that the scope raises the region's asynchronous error, if any.
                scope.__exit__(None, None, None)
            except BaseException as e:  # noqa: BLE001 - an async error of this cell: show it as such
                self._report_late_error(e, result)
                cell_error = cell_error or e
        explanation, self._explanation = self._explanation, None
        if explanation is None:
            return
        record = CellRecord(
            execution_count=getattr(result, "execution_count", None),
            explanation=explanation,
            succeeded=cell_error is None,
            error=None if cell_error is None else _first_line(cell_error),
        )
        self.records.append(record)
        if self.printing and record.used_device:
            print(explanation.summary_line())
        for listener in list(self._listeners):
            try:
                listener(record)
            except Exception as e:  # noqa: BLE001 - a broken listener never breaks cells
                warnings.warn(f"neuron_lab: a per-cell listener failed and was removed: {_first_line(e)}",
                              stacklevel=1)
                self.remove_listener(listener)

    def _cell_error(self, result: Any) -> Optional[BaseException]:
        if result is None:  # ipykernel passes None when the cell was cancelled
            return self._scope_error
        error = getattr(result, "error_in_exec", None) or getattr(result, "error_before_exec", None)
        if isinstance(error, BaseException):
            return error
        return self._scope_error

    def _report_late_error(self, error: BaseException, result: Any) -> None:
        """An asynchronous error found after the cell stopped early: still this cell's error."""
        note = "neuron_lab: this error comes from device work this cell queued before it stopped"
        if hasattr(error, "add_note"):  # Python >= 3.11: part of the error output itself
            error.add_note(note)
        else:
            print(note, file=sys.stderr)
        self.shell.showtraceback((type(error), error, None))  # the runtime's frames say nothing
        if result is not None and getattr(result, "error_in_exec", None) is None \
                and getattr(result, "error_before_exec", None) is None:
            result.error_in_exec = error
            self.shell.last_execution_succeeded = False
