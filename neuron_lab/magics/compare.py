"""``%%neuron_compare``: the cell on the device and on a reference, op by op; a thin wrapper
of its plain-Python twin ``neuron_lab.compare`` (``neuron_lab.observability.compare``).
"""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

__all__ = ["CompareMagics"]

_DTYPES = ("bfloat16", "float16")


@magics_class
class CompareMagics(Magics):
    """The comparison magic of neuron_lab (registered by ``%load_ext neuron_lab``)."""

    @magic_arguments()
    @argument("--against", default="cpu", metavar="REFERENCE",
              help="the reference: cpu (default), replay (the compiled tier against replay), float32 (the cell "
                   "under torch.autocast against float32), fastpath-off")
    @argument("--dtype", default="bfloat16", choices=_DTYPES, help="autocast's dtype for --against float32")
    @argument("--rtol", type=float, default=None, help="relative tolerance (default: torch.testing's per dtype)")
    @argument("--atol", type=float, default=None, help="absolute tolerance (default: torch.testing's per dtype)")
    @argument("--seed", type=int, default=0, help="the random seed both runs start from (default: 0)")
    @argument("-o", dest="output", metavar="VAR", help="store the Comparison in the variable VAR")
    @cell_magic
    def neuron_compare(self, line: str, cell: str) -> Any:
        """Runs the cell twice, on the device and on a reference, and names the first op whose
        result leaves the reference's beyond a tolerance: its line in the cell, its shapes and
        the size of the difference, walking the ops (forward and backward) in order.

        The notebook's variables are not changed: each run works on its own copy of the
        variables the cell reads, both from the same random seed. The cell's output shows
        once (the device run's). A result differs when ``max |difference| > atol + rtol *
        max |reference|``.

        Plain-Python twin::

            neuron_lab.compare(fn, *args, against="cpu")     # or a code string, namespace=...

        Example::

            %%neuron_compare --against float32
            loss = model(x).square().mean()
            loss.backward()
        """
        __tracebackhide__ = True  # noqa: F841 - a failing cell shows its own error, not this magic
        from neuron_lab.observability import compare as comparing

        args = parse_argstring(self.neuron_compare, line)
        if args.against not in comparing.AGAINST:
            raise UsageError(f"--against {args.against}: compare against one of {', '.join(comparing.AGAINST)}")
        for name in ("rtol", "atol"):
            value = getattr(args, name)
            if value is not None and not value >= 0:
                raise UsageError(f"--{name} must be a number >= 0, got {value:g}")
        if args.output is not None and not args.output.isidentifier():
            raise UsageError(f"-o needs a variable name, got {args.output!r}")
        if not cell.strip():
            raise UsageError("%%neuron_compare runs the code below it in the cell, and the cell is empty")
        import torch

        shell = self.shell
        source = shell.transform_cell(cell)
        running = getattr(shell.displayhook, "exec_result", None)
        number = getattr(running, "execution_count", None) or shell.execution_count
        header = f"%%neuron_compare {line}".rstrip() + "\n"
        # Cached with its magic line, as IPython caches cells: lines read "Cell In[n], line k".
        filename = shell.compile.cache(header + source, number, raw_code=header + cell)
        try:
            result = comparing.compare(header.replace("%", "#", 2) + source, against=args.against,
                                       namespace=shell.user_ns, rtol=args.rtol, atol=args.atol, seed=args.seed,
                                       dtype=getattr(torch, args.dtype), filename=filename)
        except ValueError as e:
            if "against=" in str(e):
                raise UsageError(str(e)) from None
            raise
        if args.output is not None:
            shell.user_ns[args.output] = result
        return result
