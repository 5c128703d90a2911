"""One rank of a cell run on N ranks: ``python -m neuron_lab.launch.rank_main FOLDER``,
started by torchrun from ``neuron_lab.launch.run_on_ranks``.

It sets the rank's device (``neuron:LOCAL_RANK % device_count``), initialises the
``"neuron"`` process group, runs the cell in a fresh ``__main__`` namespace holding the
predefined names and the pushed values, and writes its ``Outcome`` (``job.py``):
the time and collectives of the cell, rank 0's last expression pickled, or the error with
the cell's line. A failed rank exits at once, so that its peers' collectives fail fast
instead of waiting for it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn

from neuron_lab.launch import job as cell_job
from neuron_lab.launch import tied_torchrun

__all__ = ["main"]

_VALUE_REPR_CHARS = 2000
_PR_SET_PDEATHSIG = 1


def main(folder: Path) -> int:
    _die_with_torchrun()
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    cell_job.write_atomically(cell_job.pid_file(folder, rank), str(os.getpid()).encode())
    cell_path = folder / cell_job.CELL_FILE
    outcome = cell_job.Outcome(rank=rank, world_size=world_size, device="?")
    job = cell_job.Job.read(folder)
    try:
        namespace = _set_up(job, folder, rank, world_size, outcome)
    except BaseException as error:  # noqa: BLE001 - reported to the caller, whatever it is
        outcome.error = _describe(error, cell_path, during="setup")
        _fail(folder, outcome)
    cell_job.write_atomically(cell_job.started_file(folder, rank), b"")
    try:
        _run_cell(cell_path, namespace, outcome, profile=job.profile)
    except BaseException as error:  # noqa: BLE001
        outcome.error = _describe(error, cell_path, during="cell")
        _fail(folder, outcome)
    cell_job.write_atomically(cell_job.outcome_file(folder, rank), _pickled(outcome))
    _finish()
    return 0


def _die_with_torchrun() -> None:
    """Asks Linux to SIGKILL this rank when its torchrun dies: torchrun kills its ranks
    when the caller goes, but it may be killed first (``tied_torchrun.py``)."""
    launcher = os.environ.get(tied_torchrun.LAUNCHER_PID_VARIABLE)
    if sys.platform != "linux" or launcher is None:
        return
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != int(launcher):  # torchrun died before the request: nobody is left to ask
        os._exit(1)


def _set_up(job: cell_job.Job, folder: Path, rank: int, world_size: int, outcome: cell_job.Outcome) -> dict:
    """The device, the process group and the cell's namespace."""
    import pickle
    import types

    import torch
    import torch.distributed as dist

    import neuron_lab

    neuron_lab.set_mode(job.mode)
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    device = torch.device("neuron", local_rank % torch.neuron.device_count())
    torch.neuron.set_device(device)
    outcome.device = str(device)
    dist.init_process_group("neuron")
    pushed = pickle.loads(job.push)
    # The cell is the main module of this process, as a notebook cell is of its kernel:
    # classes and functions it defines pickle by reference to __main__.
    main_module = types.ModuleType("__main__")
    main_module.__dict__.update(torch=torch, dist=dist, rank=rank, world_size=world_size, local_rank=local_rank,
                                device=device)
    main_module.__dict__.update(pushed)
    main_module.__file__ = str(folder / cell_job.CELL_FILE)
    sys.modules["__main__"] = main_module
    sys.argv = [main_module.__file__]
    return main_module.__dict__


def _run_cell(cell_path: Path, namespace: dict, outcome: cell_job.Outcome, *, profile: bool) -> None:
    """Runs the cell as IPython does (its last expression is its value) and measures it."""
    import ast
    import contextlib

    import neuron_lab
    from neuron_lab.distributed import collective_totals

    source = cell_path.read_text()
    tree = ast.parse(source, filename=str(cell_path))
    # As in IPython: a last expression is the cell's value, unless a ';' ends the cell.
    valued = bool(tree.body) and isinstance(tree.body[-1], ast.Expr) and not source.rstrip().endswith(";")
    last = tree.body.pop() if valued else None
    body = compile(tree, str(cell_path), "exec")
    expression = compile(ast.Expression(last.value), str(cell_path), "eval") if last is not None else None

    totals_before = collective_totals()  # counts and bytes: unbounded, unlike the record ring
    profiler = neuron_lab.profiler.profile(label=f"rank {outcome.rank}") if profile else contextlib.nullcontext()
    with profiler as prof, neuron_lab.explain_scope(label=f"rank {outcome.rank}") as explanation:
        exec(body, namespace)
        value = eval(expression, namespace) if expression is not None else None
    outcome.wall_s = explanation.wall_s
    outcome.device_s = explanation.device_s
    outcome.collectives = _difference(collective_totals(), totals_before)
    outcome.collective_s = explanation.collective_s
    outcome.profile = prof if profile else None
    if outcome.rank == 0 and expression is not None:
        _keep_value(value, outcome)


def _difference(after: dict[str, dict[str, int]], before: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """The collectives of the cell: per name, count and bytes moved."""
    out = {}
    for name, now in after.items():
        was = before.get(name, {"count": 0, "bytes_moved": 0})
        if now["count"] > was["count"]:
            out[name] = {"count": now["count"] - was["count"], "bytes_moved": now["bytes_moved"] - was["bytes_moved"]}
    return out


def _keep_value(value: object, outcome: cell_job.Outcome) -> None:
    import pickle

    outcome.has_value = True
    try:
        text = repr(value)
    except Exception as e:  # noqa: BLE001 - a broken __repr__ must not lose the run
        text = f"<{type(value).__name__} whose repr failed: {e}>"
    outcome.value_repr = text if len(text) <= _VALUE_REPR_CHARS else text[:_VALUE_REPR_CHARS] + " ..."
    try:
        outcome.value = pickle.dumps(value)
    except Exception as e:  # noqa: BLE001
        outcome.value_error = f"{type(e).__name__}: {e}"


def _describe(error: BaseException, cell_path: Path, during: str) -> cell_job.CellError:
    """The error as text, with the cell's line it came from (the last frame in the cell)."""
    import traceback

    line = None
    frames = traceback.extract_tb(error.__traceback__)
    in_cell = [i for i, f in enumerate(frames) if f.filename == str(cell_path)]
    if in_cell:
        line = frames[in_cell[-1]].lineno
    elif isinstance(error, SyntaxError) and error.filename == str(cell_path):
        line = error.lineno
    code = ""
    if line is not None:
        lines = cell_path.read_text().splitlines()
        code = lines[line - 1].strip() if 0 < line <= len(lines) else ""
    shown = traceback.TracebackException.from_exception(error)
    if in_cell:  # from the cell's first frame on: the rank's own machinery is not the user's business
        shown.stack = traceback.StackSummary.from_list(frames[in_cell[0]:])
    kind = type(error)
    type_name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return cell_job.CellError(
        type_name=type_name, message=str(error), line=line, code=code,
        traceback="".join(shown.format()).rstrip(), name=getattr(error, "name", None) if isinstance(error, NameError)
        else None, transport=_is_transport(error), during=during)


def _is_transport(error: BaseException) -> bool:
    """A collective failed because another rank went away: a consequence of its failure."""
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return isinstance(error, dist.DistBackendError)


def _pickled(outcome: cell_job.Outcome) -> bytes:
    import pickle

    try:
        return pickle.dumps(outcome)
    except Exception as e:  # noqa: BLE001 - e.g. a profile that does not pickle: the rest still reaches the caller
        outcome.profile = None
        outcome.value_error = outcome.value_error or f"{type(e).__name__}: {e}"
        return pickle.dumps(outcome)


def _fail(folder: Path, outcome: cell_job.Outcome) -> NoReturn:
    """Reports the error and leaves at once: peers waiting in a collective then fail fast."""
    cell_job.write_atomically(cell_job.outcome_file(folder, outcome.rank), _pickled(outcome))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def _finish() -> None:
    """Waits for every rank to finish the cell, then closes the process group."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    try:
        dist.barrier(device_ids=[torch.neuron.current_device()])
    except dist.DistBackendError:  # a peer failed after this rank finished: it reports the failure
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m neuron_lab.launch.rank_main FOLDER (started by neuron_lab.launch."
                 "run_on_ranks)")
    sys.exit(main(Path(sys.argv[1])))
