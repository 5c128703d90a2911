"""``%%neuron_distributed``: runs the cell on N ranks, a thin wrapper of its plain-Python
twin ``neuron_lab.launch.run_on_ranks`` (which does all the work; this module reads
options and the notebook's variables to push, and displays the result).
"""

from __future__ import annotations

import html
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from neuron_lab.launch import runner as launcher
from neuron_lab.magics.display import FigureDisplay

__all__ = ["DistributedMagics", "StartupProgress", "ProgressLine"]


class ProgressLine:
    """One line saying what the launch is doing (HTML in notebooks, text elsewhere)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"%%neuron_distributed: {self.text}"

    def _repr_html_(self) -> str:
        return (f"<div class='neuron-distributed-progress' style='font-family:monospace;font-size:12px;"
                f"color:#555'>%%neuron_distributed: {html.escape(self.text)}</div>")


class StartupProgress:
    """``run_on_ranks``'s ``progress``: one output that changes in place while the ranks start
    (launching, rendezvous, the cell running, first output), then keeps the summary."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._handle: Any = None

    def __call__(self, text: str) -> None:
        self.lines.append(text)
        if self._handle is None:
            self._handle = display(ProgressLine(text), display_id=True)
        else:
            self._handle.update(ProgressLine(text))


@magics_class
class DistributedMagics(Magics):
    """The distributed magic of neuron_lab (registered by ``%load_ext neuron_lab``)."""

    @magic_arguments()
    @argument("-n", "--nproc", type=int, default=2, metavar="N", help="number of ranks (default: 2)")
    @argument("--timeout", type=float, default=launcher.DEFAULT_TIMEOUT_S, metavar="SECONDS",
              help=f"seconds the cell may run once the ranks are up; then every rank is killed "
                   f"(default: {launcher.DEFAULT_TIMEOUT_S:g}; 0: no limit)")
    @argument("--push", default="", metavar="NAMES",
              help="notebook variables to define on every rank (picklable values), comma-separated: --push lr,steps")
    @argument("--profile", action="store_true",
              help="profile the cell on each rank and show the ranks' timelines one above the other")
    @argument("-o", dest="output", metavar="VAR", help="store the RanksResult in the variable VAR")
    @cell_magic
    def neuron_distributed(self, line: str, cell: str) -> Any:
        """Runs the cell on N ranks, each a fresh process on its own neuron core, with the
        ``"neuron"`` process group initialised, and shows what each rank did.

        While the ranks start (some seconds: each process imports torch, then they meet), a
        line above the output says what is happening: launching, rendezvous, the cell
        running, the first output; then how long each part of the start-up took.

        Each rank finds ``torch``, ``dist`` (torch.distributed), ``rank``, ``world_size``,
        ``local_rank`` and ``device`` defined. The notebook's variables are not there (fresh
        processes): name them with ``--push`` to send their values. Output comes as it is
        printed, each line labelled ``[rank N]``. Then a table: per rank, wall time, device
        busy time, time in collectives, collectives and bytes moved, and the slowest rank;
        with ``--profile`` the ranks' timelines. The cell's value is rank 0's last
        expression. An error on any rank fails the cell, naming the rank and the line.

        Plain-Python twin::

            result = neuron_lab.launch.run_on_ranks(code, nproc=2, push={"lr": lr}, timeout=600,
                                                         profile=False)
            result.value; result.ranks; result.slowest_rank; result.timeline()

        Examples::

            %%neuron_distributed -n 2 --push lr --profile -o run
            model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1).to(device))
            ...
        """
        __tracebackhide__ = True  # noqa: F841 - a failing cell shows the ranks' error, not this magic
        args = parse_argstring(self.neuron_distributed, line)
        if args.nproc < 1:
            raise UsageError(f"-n/--nproc must be at least 1, got {args.nproc}")
        if args.timeout < 0:
            raise UsageError(f"--timeout must be a number of seconds >= 0 (0: no limit), got {args.timeout:g}")
        if args.output is not None and not args.output.isidentifier():
            raise UsageError(f"-o needs a variable name, got {args.output!r}")
        if not cell.strip():
            raise UsageError("%%neuron_distributed runs the code below it in the cell, and the cell is empty")
        self._refuse_ipython_syntax(cell)
        push = self._pushed(args.push)
        try:
            result = launcher.run_on_ranks(cell, args.nproc, push=push, timeout=args.timeout or None,
                                           profile=args.profile, first_line=2, progress=StartupProgress())
        except ValueError as e:  # bad input to the twin (a push value that cannot travel): one line
            raise UsageError(str(e)) from None
        if args.output is not None:
            self.shell.user_ns[args.output] = result
        display(result)
        if args.profile:
            display(FigureDisplay(result.timeline(), "neuron launch timelines of the ranks"))
        try:
            return result.value
        except ValueError:  # the result's table says why the value stayed in the ranks
            return None

    def _pushed(self, names: str) -> dict[str, Any]:
        """The notebook variables named by --push, with their values."""
        pushed = {}
        for name in (n.strip() for n in names.split(",")):
            if not name:
                continue
            if not name.isidentifier():
                raise UsageError(f"--push takes variable names separated by commas (--push lr,steps), got {name!r}")
            if name not in self.shell.user_ns:
                raise UsageError(f"--push {name}: the notebook has no variable {name!r}")
            pushed[name] = self.shell.user_ns[name]
        return pushed

    def _refuse_ipython_syntax(self, cell: str) -> None:
        """The ranks run plain Python: a magic or ``!command`` line would fail there, late."""
        transformed = self.shell.transform_cell(cell).splitlines()
        for number, (mine, python) in enumerate(zip(cell.splitlines(), transformed), start=2):
            if mine.rstrip() != python.rstrip():
                raise UsageError(f"line {number} of the cell uses IPython syntax ({mine.strip()!r}), which the ranks "
                                 f"cannot run: they run plain Python")
