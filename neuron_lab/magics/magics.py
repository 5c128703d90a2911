"""The IPython magics of neuron_lab: ``%%neuron_profile``, ``%neuron_memory``, ``%neuron_mode``,
``%neuron_status``, ``%neuron_explain``, ``%neuron_autotime`` and ``%neuron_dashboard``.

Each magic's docstring is its help (``%neuron_profile?``) and names its plain-Python twin.
Bad options raise ``UsageError``: IPython shows one line, never a traceback.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from typing import Any, Optional

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from neuron_lab.adaptive_eager import MODES
from neuron_lab.magics.autotime import CellTimer
from neuron_lab.magics.display import CellExplanation, FigureDisplay, MemoryReport, StatusReport, parse_device
from neuron_lab.observability.table import SORT_KEYS

__all__ = ["NeuronMagics"]


def _check_output_path(option: str, path: Optional[str]) -> Optional[str]:
    """Expands ``~`` and refuses what cannot be a file, before any profiled code runs
    (missing folders are created by the export)."""
    if path is None:
        return None
    path = os.path.expanduser(path.strip())
    if not path or os.path.isdir(path):
        raise UsageError(f"{option} needs a file path, got {path!r}")
    if os.path.islink(path):
        raise UsageError(f"{option}: {path} is a symbolic link (to {os.readlink(path)}); neuron_lab does not write "
                         "through links, which would overwrite their targets: remove it or choose another path")
    return path


@magics_class
class NeuronMagics(Magics):
    """Magics of the neuron device (registered by ``%load_ext neuron_lab``)."""

    def __init__(self, shell: Any, timer: CellTimer) -> None:
        super().__init__(shell)
        self.timer = timer

    # ---- %%neuron_profile ---------------------------------------------------------------

    @magic_arguments()
    @argument("--sort", choices=SORT_KEYS, default="device_time",
              help="order of the op/graph table (default: device_time)")
    @argument("--top", type=int, default=20, metavar="N", help="rows of the table (default: 20)")
    @argument("--timeline", action="store_true",
              help="show the interactive timeline (host, each stream, collectives, memory; zoom, pan, hover)")
    @argument("--memory", action="store_true", help="show device memory over time")
    @argument("--trace", metavar="PATH",
              help="also run torch.profiler and write its Chrome trace with the device's lanes "
                   "(ui.perfetto.dev, TensorBoard, Holistic Trace Analysis)")
    @argument("--parquet", metavar="PATH", help="write every launch record as Parquet (needs pyarrow)")
    @argument("--explain", action="store_true",
              help="explain the cell: new graphs, recompiles, syncs and inline ops, with their lines")
    @argument("-o", dest="output", metavar="VAR", help="store the Profile object in the variable VAR")
    @cell_magic
    def neuron_profile(self, line: str, cell: str) -> Any:
        """Profiles the cell on the neuron device and shows the op/graph table.

        The cell runs in the notebook's namespace; its last expression is still
        displayed. Then come the table (HTML in notebooks, text in terminals) with the
        emulated and the modelled NeuronCore time, the interactive timeline and the memory
        figure when asked, and the explanation with --explain. The cell's per-cell line ends
        with the profiled code: the profiler's own work and the rendering are not billed to it.

        Plain-Python twin::

            with neuron_lab.profiler.profile(torch_profiler=bool(path)) as prof:
                ...
            prof.table(sort_by="device_time", top=20); prof.timeline(); prof.explain()
            prof.export_chrome_trace(path); prof.export_parquet(path)

        Examples::

            %%neuron_profile --sort host_time --top 10 --timeline --explain -o prof
            loss = model(x).sum(); loss.backward()
        """
        __tracebackhide__ = True  # noqa: F841 - a failing cell's traceback goes from its magic line to its code
        args = parse_argstring(self.neuron_profile, line)
        if args.top < 1:
            raise UsageError(f"--top must be at least 1, got {args.top}")
        if args.output is not None and not args.output.isidentifier():
            raise UsageError(f"-o needs a variable name, got {args.output!r}")
        trace = _check_output_path("--trace", args.trace)
        parquet = _check_output_path("--parquet", args.parquet)
        if parquet is not None and importlib.util.find_spec("pyarrow") is None:
            raise UsageError("--parquet needs pyarrow: pip install pyarrow (or use -o VAR and prof.export_csv)")
        if not cell.strip():
            raise UsageError("%%neuron_profile profiles the code below it in the cell, and the cell is empty")

        import neuron_lab.profiler as profiler

        prof = None
        late_error: Optional[BaseException] = None
        try:
            with profiler.profile(torch_profiler=trace is not None) as prof:
                try:
                    value = self._run_body(line, cell)
                finally:
                    # The cell's line ends with the profiled code: what follows (the profiler's
                    # processing, the tables and pictures) is not the cell's.
                    late_error = self.timer.end_measurement()
        finally:
            if args.output is not None and prof is not None:  # kept when the cell fails, too
                self.shell.user_ns[args.output] = prof
        if late_error is not None:  # the cell's device work failed: its error, after the profile is kept
            raise late_error.with_traceback(None)
        display(prof.table(sort_by=args.sort, top=args.top))
        if args.timeline:
            display(prof.timeline())
        if args.memory:
            display(self._figure(prof.memory_timeline(), "neuron memory timeline"))
        if args.explain:
            display(prof.explain())
        if trace is not None:
            written = prof.export_chrome_trace(trace) or trace
            print(f"Chrome trace written to {written} (open it in https://ui.perfetto.dev or chrome://tracing)")
        if parquet is not None:
            try:
                written = prof.export_parquet(parquet) or (parquet,)
            except ImportError as e:
                raise UsageError(str(e)) from None
            print("Parquet written to " + " and ".join(str(p) for p in written))
        return value

    def _run_body(self, line: str, cell: str) -> Any:
        """Runs the cell body in the user namespace as IPython would, returning the value of
        a last expression (so ``%%neuron_profile`` cells still display it)."""
        __tracebackhide__ = True  # noqa: F841
        shell = self.shell
        source = shell.transform_cell(cell)  # magics and !commands inside the cell
        running = getattr(shell.displayhook, "exec_result", None)  # the cell's own In [n] number
        number = getattr(running, "execution_count", None) or shell.execution_count
        # Cached with its %%neuron_profile line so that tracebacks and the runtime's
        # "recorded at" name the cell's own line numbers.
        header = f"%%neuron_profile {line}".rstrip() + "\n"
        filename = shell.compile.cache(header + source, number, raw_code=header + cell)
        tree = shell.compile.ast_parse(source, filename=filename)
        ast.increment_lineno(tree, 1)
        tree = shell.transform_ast(tree)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        namespace = (shell.user_global_ns, shell.user_ns)
        if tree.body:
            exec(shell.compile(tree, filename, "exec"), *namespace)
        if last is None:
            return None
        expression = ast.Expression(last.value)
        return eval(shell.compile(expression, filename, "eval"), *namespace)

    @staticmethod
    def _figure(figure: Any, description: str) -> FigureDisplay:
        """Wraps a figure for display and keeps pyplot from showing it a second time."""
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is not None:
            pyplot.close(figure)
        return FigureDisplay(figure, description)

    # ---- line magics ---------------------------------------------------------------------

    @magic_arguments()
    @argument("device", nargs="?", default=None,
              help="a core: 1, neuron:1 or neuron (the current one); default: every core")
    @line_magic
    def neuron_memory(self, line: str) -> MemoryReport:
        """Memory of each neuron core: allocated, reserved, peak and capacity; with DEVICE,
        that core's full allocator summary too.

        Plain-Python twin: ``neuron_lab.magics.memory_report(device=None)`` (or
        ``torch.neuron.memory_summary(device)``).
        """
        args = parse_argstring(self.neuron_memory, line)
        try:
            device = parse_device(args.device)
        except ValueError as e:
            raise UsageError(str(e)) from None
        return MemoryReport(device)

    @magic_arguments()
    @argument("mode", nargs="?", choices=MODES, default=None,
              help="the execution mode to set; without it, shows the current one")
    @line_magic
    def neuron_mode(self, line: str) -> None:
        """Shows or sets the execution mode: eager, adaptive or blocking.

        adaptive fuses ops into cached graphs, eager launches op by op, blocking runs
        each op at once so errors raise at the failing line (for debugging).

        Plain-Python twin: ``neuron_lab.get_mode()``, ``neuron_lab.set_mode(name)``,
        ``with neuron_lab.mode(name): ...``.
        """
        import neuron_lab

        args = parse_argstring(self.neuron_mode, line)
        previous = neuron_lab.get_mode()
        if args.mode is None:
            print(f"neuron mode: {previous}")
            return
        neuron_lab.set_mode(args.mode)
        print(f"neuron mode: {args.mode}" + ("" if previous == args.mode else f" (was {previous})"))

    @line_magic
    def neuron_status(self, line: str) -> StatusReport:
        """Devices and mode, memory per core, streams with their queue depth, the graph
        cache and the runtime counters.

        Plain-Python twin: ``neuron_lab.magics.status()`` (and
        ``neuron_lab.adaptive_eager.counters()``, ``graphs()``, ``queue_depth()``).
        """
        if line.strip():
            raise UsageError(f"%neuron_status takes no arguments, got {line.strip()!r}")
        return StatusReport()

    @magic_arguments()
    @argument("cell", nargs="?", type=int, default=None, metavar="N",
              help="the In [N] number of a cell; default: the last cell that used the device")
    @line_magic
    def neuron_explain(self, line: str) -> Optional[CellExplanation]:
        """Diagnoses the previous cell that used the device: its new graphs and recompiles
        (with their cause and line), syncs (with their trigger and line) and inline ops.

        The per-cell hook keeps these explanations even with ``%neuron_autotime off``.

        Plain-Python twin: ``with neuron_lab.explain_scope() as e: ...`` then ``e``
        (or ``print(e)``).
        """
        args = parse_argstring(self.neuron_explain, line)
        if args.cell is not None:
            record = self.timer.record_of(args.cell)
            if record is None:
                raise UsageError(f"no explanation kept for In [{args.cell}]: the last "
                                 f"{self.timer.records.maxlen} cells run since %load_ext neuron_lab are kept")
        else:
            record = self.timer.last_device_cell()
            if record is None:
                print("No cell has used the neuron device since %load_ext neuron_lab.")
                return None
        return CellExplanation(record)

    @magic_arguments()
    @argument("state", nargs="?", choices=("on", "off"), default=None,
              help="print the per-cell line or not; without it, shows the current setting")
    @line_magic
    def neuron_autotime(self, line: str) -> None:
        """Turns the per-cell line (wall time split into recording, waiting and other, device
        busy and compile time, launches, syncs, peak memory; ``%neuron_status`` defines each
        part) on or off. It is on after ``%load_ext neuron_lab``. Cells are
        still measured and explained when it is off (``%neuron_explain``, dashboards).

        Plain-Python twin: ``with neuron_lab.explain_scope() as e: ...`` then
        ``print(e.summary_line())``.
        """
        args = parse_argstring(self.neuron_autotime, line)
        if args.state is not None:
            self.timer.printing = args.state == "on"
        print(f"neuron per-cell timing: {'on' if self.timer.printing else 'off'}")

    @magic_arguments()
    @argument("--cells", type=int, default=20, metavar="N", help="cells in the timing chart (default: 20)")
    @argument("--interval", type=float, default=0.5, metavar="SECONDS",
              help="seconds between live updates while cells run (default: 0.5; 0: only after cells)")
    @line_magic
    def neuron_dashboard(self, line: str) -> None:
        """Shows a live dashboard: memory per core over the last minute, each core's busy
        share and its streams' queues, launches and host waits per second, the graph cache,
        and a chart of the last cells (failed and interrupted ones too). It updates twice a
        second while cells run, and after every cell.

        To keep it in view in JupyterLab, right-click it, choose "Create New View for Cell
        Output" and drag the new tab to the right edge: it stays beside the notebook and
        updates there.

        Plain-Python twin: ``neuron_lab.Dashboard(cells=20)`` (display it, or call
        ``.update()``).
        """
        args = parse_argstring(self.neuron_dashboard, line)
        if args.cells < 1:
            raise UsageError(f"--cells must be at least 1, got {args.cells}")
        if args.interval < 0:
            raise UsageError(f"--interval must be >= 0 seconds (0: only after cells), got {args.interval:g}")
        from neuron_lab.magics.dashboard import Dashboard

        display(Dashboard(cells=args.cells, shell=self.shell, interval=args.interval))
