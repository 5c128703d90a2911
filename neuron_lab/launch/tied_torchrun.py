"""torchrun tied to the process that started it, with its stores on the loopback interface.

``python tied_torchrun.py --tie FD --folder DIR -- TORCHRUN_ARGS...`` runs torchrun's own
``main`` in this process (``runner.py`` starts it by path: it imports torch, not
neuron_lab). Two things are added:

- **Tied to its caller.** ``FD`` is the read end of a pipe whose write end only the caller
  (the notebook kernel) holds. When the caller is gone, however it went (an interrupt, a
  restart or shutdown of the kernel, SIGKILL included: the kernel needs to do nothing), the
  pipe reads end-of-file; this process then kills every process below it (the ranks and
  whatever they started: it is their *subreaper*, so orphans come back to it rather than
  to init), removes the cell's folder ``DIR`` and exits. A byte ``k`` from the caller
  (a timeout, an interrupt) kills every process below it and keeps the folder, which the
  caller still reads. Once torchrun's ``main`` returns, this process closes its output
  (the caller's readers see the end) and waits for the caller to let go, so that whoever
  of the two lives longer removes the folder. Each rank also asks the kernel to kill it
  when this process dies (``rank_main.py``), in case this one is killed first.
- **Stores on 127.0.0.1.** torch 2.13's ``TCPStore`` server listens on every interface
  whatever host name it is given (the rendezvous store of ``--standalone`` or
  ``--rdzv-endpoint``, and the workers' bootstrap store of ``--local-addr``), and its
  protocol has no authentication. Here every server store of this process listens on
  a socket bound to 127.0.0.1 and handed over with ``master_listen_fd``, its one way to
  choose the address.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path

__all__ = ["LAUNCHER_PID_VARIABLE", "LOOPBACK", "STOP", "descendants", "main"]

LOOPBACK = "127.0.0.1"
LAUNCHER_PID_VARIABLE = "NEURON_LAB_LAUNCHER_PID"  # the ranks' parent, for their death signal
STOP = b"k"
_KILL_ROUNDS = 50  # kills of what is left below this process, 20 ms apart (new children, reparented orphans)
_PR_SET_CHILD_SUBREAPER = 36
_exit_code = [1]  # torchrun's, once its main returned: this process's when the caller lets go


def descendants(pid: int) -> list[int]:
    """The live (not zombie) processes below ``pid``, from /proc (Linux); [] elsewhere."""
    children: dict[int, list[int]] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()  # after "pid (comm)": state, ppid, ...
        if fields[0] in ("Z", "X"):
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, []))
    return found


def _kill_everything_below() -> None:
    """SIGKILLs every process below this one until none is left (a rank's own children
    come back to this subreaper when their parent dies, and are killed in the next round)."""
    for _ in range(_KILL_ROUNDS):
        below = descendants(os.getpid())
        if not below:
            return
        for pid in below:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)


def _watch(tie: int, folder: Path) -> None:
    """The tie's thread: ``k`` kills what is below (and goes on watching); end-of-file
    kills what is below, removes the folder and ends this process."""
    while True:
        try:
            data = os.read(tie, 1)
        except InterruptedError:
            continue
        except OSError:
            data = b""
        if data == STOP:
            _kill_everything_below()
            continue
        _kill_everything_below()
        shutil.rmtree(folder, ignore_errors=True)
        os._exit(_exit_code[0])


class _LoopbackTCPStore:
    """Placeholder replaced by ``_loopback_store_class()`` (torch is imported lazily)."""


def _loopback_store_class() -> type:
    import torch.distributed as dist

    class LoopbackTCPStore(dist.TCPStore):
        """A ``TCPStore`` whose server listens on 127.0.0.1 only (see the module docstring)."""

        def __init__(self, host_name: str, port: int = 0, world_size: int | None = None, is_master: bool = False,
                     *args: object, master_listen_fd: int | None = None, **kwargs: object) -> None:
            if is_master and master_listen_fd is None:
                listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind((LOOPBACK, port))
                listener.listen(socket.SOMAXCONN)
                port, master_listen_fd = listener.getsockname()[1], listener.detach()
            super().__init__(host_name, port, world_size, is_master, *args, master_listen_fd=master_listen_fd,
                             **kwargs)

    return LoopbackTCPStore


def _stores_on_loopback() -> None:
    """Every ``TCPStore`` server torchrun makes in this process listens on 127.0.0.1."""
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend, static_tcp_rendezvous

    store = _loopback_store_class()
    dist.TCPStore = store  # dynamic_rendezvous's bootstrap store server, elastic.utils
    c10d_rendezvous_backend.TCPStore = store  # imported by name there
    static_tcp_rendezvous.TCPStore = store


def _set_subreaper() -> None:
    if sys.platform != "linux":
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tie", type=int, required=True, help="read end of the caller's pipe")
    parser.add_argument("--folder", type=Path, required=True, help="the cell's folder, removed when the caller is gone")
    parser.add_argument("torchrun", nargs=argparse.REMAINDER, help="-- then torchrun's arguments")
    args = parser.parse_args(argv)
    torchrun_args = args.torchrun[1:] if args.torchrun[:1] == ["--"] else args.torchrun
    _set_subreaper()
    os.environ[LAUNCHER_PID_VARIABLE] = str(os.getpid())
    threading.Thread(target=_watch, args=(args.tie, args.folder), daemon=True, name="neuron-tie").start()
    code = 0
    try:
        _stores_on_loopback()
        from torch.distributed.run import main as torchrun

        torchrun(torchrun_args)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - torchrun's failure summary, as its own command prints it
        traceback.print_exc()
        code = 1
    _exit_code[0] = code
    _kill_everything_below()  # a rank's stray children
    sys.stdout.flush()
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # the caller's readers see the end of the output now
    os.dup2(devnull, 2)
    threading.Event().wait()  # the tie's thread ends this process when the caller lets go
    return code  # not reached


if __name__ == "__main__":
    sys.exit(main())
