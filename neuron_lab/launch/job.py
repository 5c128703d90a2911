"""What a cell run on N ranks shares between the caller and its ranks: one folder.

The caller (``runner.py``) writes the cell's code and a ``Job``; each rank
(``rank_main.py``) writes its process id when it starts, a marker once the process group
is up, and one ``Outcome`` when the cell finished or failed. Plain files and pickle: the
ranks are fresh processes started by torchrun, with nothing else shared.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["PREDEFINED", "CELL_FILE", "Job", "Outcome", "CellError", "pid_file", "started_file", "outcome_file",
           "write_atomically", "read_outcome"]

# The names every cell finds defined in its ranks (documented in run_on_ranks).
PREDEFINED = ("torch", "dist", "rank", "world_size", "local_rank", "device")
CELL_FILE = "cell.py"   # the cell's code, padded so that its line numbers are the cell's own
JOB_FILE = "job.pkl"


@dataclass(frozen=True)
class Job:
    """What every rank runs: the cell (in ``CELL_FILE``), the values pushed in (a pickle of a
    dict, unpickled in the rank), whether to profile, and the caller's execution mode."""

    push: bytes
    profile: bool
    mode: str

    def write(self, folder: Path) -> None:
        write_atomically(folder / JOB_FILE, pickle.dumps(self))

    @staticmethod
    def read(folder: Path) -> "Job":
        return pickle.loads((folder / JOB_FILE).read_bytes())


@dataclass(frozen=True)
class CellError:
    """An exception a rank raised, as text (its class may not exist in the caller)."""

    type_name: str       # "NameError", "torch.distributed.DistBackendError"
    message: str
    line: int | None     # the cell's line it was raised from (None: outside the cell's code)
    code: str            # that line's text
    traceback: str       # from the cell's frame on
    name: str | None = None      # NameError's missing name
    transport: bool = False      # a collective failed because a peer went away (a consequence)
    during: str = "cell"         # "cell" or "setup" (before the cell ran: the pushed values, the group)


@dataclass
class Outcome:
    """What one rank reports: its timings and collectives, rank 0's value, or its error."""

    rank: int
    world_size: int
    device: str
    error: CellError | None = None
    value: bytes | None = None          # rank 0: the pickled value of the cell's last expression
    has_value: bool = False             # the cell ended in an expression
    value_repr: str = ""
    value_error: str = ""               # why the value could not be pickled
    wall_s: float = 0.0
    device_s: float = 0.0
    collective_s: float = 0.0
    collectives: dict[str, dict[str, int]] = field(default_factory=dict)  # name -> count, bytes_moved
    profile: Any = None                 # a neuron_lab Profile when asked for


def pid_file(folder: Path, rank: int) -> Path:
    return folder / f"rank{rank}.pid"


def started_file(folder: Path, rank: int) -> Path:
    return folder / f"rank{rank}.started"


def outcome_file(folder: Path, rank: int) -> Path:
    return folder / f"rank{rank}.outcome"


def write_atomically(path: Path, data: bytes) -> None:
    """Writes ``data`` so that a reader sees all of it or no file (a rank killed midway
    leaves no half file)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def read_outcome(folder: Path, rank: int) -> Outcome | None:
    """A rank's outcome, or None when it wrote none (it was killed, or crashed)."""
    path = outcome_file(folder, rank)
    return pickle.loads(path.read_bytes()) if path.exists() else None
