"""The compile worker: a separate Python process that compiles hot graphs with TorchInductor.

Compiling in the user's process shared its state with the user's program: FX marks
"symbolic tracing in progress" and patches ``torch.nn.Module.__call__`` process-wide while
it traces, so a background trace made the user's ``torch.compile``'d calls fail ("Detected
that you are using FX to symbolically trace a dynamo-optimized function"), and Inductor's
Python held the user's GIL and cores. Here the worker receives a graph as plain data
(``fx_graph.GraphDescription``), builds its FX graph, compiles it with
``torch._inductor.standalone_compile`` and saves the artifact into the private cache
(``neuron_lab.files``); the parent loads it with ``CompiledArtifact.load``, which runs no
FX tracing.

The worker is a fresh interpreter (``python -m neuron_lab.adaptive_eager.compile_worker``)
with the parent's Python, torch and neuron_lab, started once, when the compiled tier is
first needed, and never forked from the parent (whose device threads run). It computes
nothing on the device. It talks over one socket pair; it exits when the parent closes
its end (or dies). The same Inductor settings as the parent's (its config, threads and
matmul precision) go with each graph, so the code is what an in-process compile made.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection, Pipe
from pathlib import Path
from typing import Any, Callable, Optional

__all__ = ["CompileWorker", "CompileWorkerDied", "main"]

# The worker lowers its priority: a compile must not slow the user's steps, and takes
# the cores whenever the user's process waits.
WORKER_NICENESS = 10


class CompileWorkerDied(RuntimeError):
    """The worker process exited while it had a graph (crash, kill, out of memory)."""


def _inductor_settings() -> dict:
    """What decides the code Inductor generates, besides the graph, as the parent has it."""
    import torch

    settings: dict[str, Any] = {"threads": torch.get_num_threads(),
                                "matmul_precision": torch.get_float32_matmul_precision(),
                                "inductor_config": None}
    config = sys.modules.get("torch._inductor.config")  # changed only if the user imported it
    if config is not None:
        if config.cpp.threads >= 1:
            settings["threads"] = config.cpp.threads
        try:
            settings["inductor_config"] = config.save_config()
        except Exception:  # noqa: BLE001 - unpicklable user passes: the worker keeps its defaults
            pass
    return settings


def _signal_name(returncode: Optional[int]) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


class CompileWorker:
    """The parent's end: starts the worker on first use and compiles graphs through it.

    ``compile(description)`` returns the loaded compiled code (a callable over the
    graph's live storages) or raises: ``CompileWorkerDied`` if the process died (it is
    started again for the next graph, at most ``max_starts`` times in all), any other
    exception for a graph Inductor could not compile. One graph at a time."""

    def __init__(self, artifact_dir: Callable[[], Path], inductor_cache_dir: Callable[[], Path],
                 temporary_dir: Callable[[], Path], log_path: Callable[[], Path], max_starts: int = 4) -> None:
        self._artifact_dir = artifact_dir
        self._temporary_dir = temporary_dir
        self._inductor_cache_dir = inductor_cache_dir
        self._log_path = log_path
        self.max_starts = max_starts
        self.starts = 0
        self._process: Optional[subprocess.Popen] = None
        self._conn: Optional[Connection] = None
        self._lock = threading.Lock()  # one graph at a time; close() waits for none
        self._requests = 0

    @property
    def pid(self) -> Optional[int]:
        """The worker's process id while it runs."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    def _start(self) -> None:
        if self.starts >= self.max_starts:
            raise CompileWorkerDied(f"the compile worker died {self.starts} times; the compiled tier is off for "
                                    f"this process (its log: {self._log_path()})")
        import neuron_lab
        import torch

        from neuron_lab import files

        parent_end, child_end = Pipe(duplex=True)
        env = dict(os.environ)
        # The same neuron_lab and torch as this process, however this process found them.
        roots = [str(Path(module.__file__).resolve().parent.parent) for module in (neuron_lab, torch)]
        inherited = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(roots + inherited))
        env["TORCHINDUCTOR_CACHE_DIR"] = str(self._inductor_cache_dir())
        # Inductor keeps precompiled C++ headers in its *default* directory whatever the
        # variable says (/tmp/torchinductor_<user>, from the temporary directory): the
        # worker's temporary directory is private, so they are too.
        env["TMPDIR"] = str(self._temporary_dir())
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # the worker never uses the device
        env["NEURON_LAB_COMPILE"] = "0"  # and starts no compiler of its own
        log = files.open_private_log(self._log_path(), append=self.starts > 0)  # keeps a dead worker's last words
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "neuron_lab.adaptive_eager.compile_worker", str(child_end.fileno()),
                 str(os.getpid())],
                pass_fds=(child_end.fileno(),), stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                start_new_session=True,  # Ctrl-C in a terminal interrupts the user's program, not a compile
            )
        finally:
            log.close()
            child_end.close()
        self._conn = parent_end
        self.starts += 1

    def _receive(self) -> Any:
        conn, process = self._conn, self._process
        assert conn is not None and process is not None
        try:
            return conn.recv()
        except (EOFError, OSError):
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            self._discard()
            raise CompileWorkerDied(f"the compile worker died ({_signal_name(process.returncode)}); "
                                    f"its log: {self._log_path()}") from None

    def _discard(self) -> None:
        conn, process = self._conn, self._process
        self._conn, self._process = None, None
        if conn is not None:
            conn.close()
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def compile(self, description: Any) -> Callable[..., Any]:
        """The compiled code of one graph (see the class docstring)."""
        from torch._inductor import CompiledArtifact

        with self._lock:
            if self._process is None or self._process.poll() is not None:
                self._discard()
                self._start()
            assert self._conn is not None
            self._requests += 1
            path = self._artifact_dir() / f"graph{description.graph_id}-{os.getpid()}-{self._requests}.bin"
            try:
                self._conn.send((description, str(path), _inductor_settings()))
            except OSError:
                pass  # a dead worker: _receive says how it died
            status, detail = self._receive()
        if status != "ok":
            raise RuntimeError(detail)
        import torch._inductor.config as inductor_config

        from neuron_lab import files

        try:
            with inductor_config.patch(files.INDUCTOR_PATCHES):  # loading builds any kernel not cached
                return CompiledArtifact.load(path=str(path), format="binary")
        finally:
            path.unlink(missing_ok=True)

    def close(self) -> None:
        """Ends the worker (at exit). Idle, its socket is closed, which ends its loop; in
        the middle of a compile it is killed, and the thread waiting for it gets the
        failure (and closes the socket itself)."""
        if self._lock.acquire(timeout=0.1):
            try:
                self._discard()
            finally:
                self._lock.release()
            return
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()

    def forget_after_fork(self) -> None:
        """In a forked child: the worker and its socket are the parent's; drop this copy of
        the socket, touch nothing else, and start a worker of its own if it ever needs one."""
        self._lock = threading.Lock()  # a compile thread's hold did not survive the fork
        conn, self._conn, self._process, self.starts = self._conn, None, None, 0
        if conn is not None:
            conn.close()  # the child's copy of the descriptor only


# ---- the worker process -------------------------------------------------------------------


def _apply_settings(settings: dict) -> None:
    import torch
    import torch._inductor.config as config

    torch.set_float32_matmul_precision(settings["matmul_precision"])
    if settings["inductor_config"] is not None:
        config.load_config(settings["inductor_config"])
    # Inductor's C++ code splits loops by the thread count. Named in the config, the count
    # is part of every cache key: AOTAutograd's cache leaves the runtime count out, and
    # would hand code built for another count to this one.
    torch.set_num_threads(settings["threads"])
    config.cpp.threads = settings["threads"]


def _compile(description: Any, path: str) -> None:
    import torch
    import torch._inductor
    import torch._inductor.config as inductor_config

    from neuron_lab import files
    from neuron_lab.adaptive_eager.fx_graph import build_graph_module

    module, examples = build_graph_module(description)
    # The parent loads with the same patches: the kernels' cache keys then match.
    with torch.no_grad(), inductor_config.patch(files.INDUCTOR_PATCHES):
        artifact = torch._inductor.standalone_compile(module, examples, dynamic_shapes="from_example_inputs",
                                                      options={}, aot=True)
    artifact.save(path=path, format="binary")


def _die_with_the_parent(parent_pid: int) -> None:
    """On Linux the kernel kills the worker when the parent's thread that started it (the
    compiler thread, which lives as long as the parent) ends: a killed parent does not
    leave a compile running on. Elsewhere the worker ends at its next read of the socket."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before that took effect
        os._exit(0)


def main(argv: list[str]) -> int:
    """The worker's loop: a graph in, ("ok", "") or ("error", message) out, until EOF.
    ``argv``: the socket's descriptor and the parent's process id."""
    conn = Connection(int(argv[0]))
    _die_with_the_parent(int(argv[1]))
    try:
        os.nice(WORKER_NICENESS)
    except OSError:
        pass
    import torch._inductor.standalone_compile  # noqa: F401 - imported before the first graph arrives

    while True:
        try:
            description, path, settings = conn.recv()
        except (EOFError, OSError):
            return 0
        start = time.perf_counter()
        try:
            _apply_settings(settings)
            _compile(description, path)
        except Exception as e:  # noqa: BLE001 - any failure is the graph's: it keeps replaying
            reply = ("error", f"{type(e).__name__}: {e}"[:2000])
        else:
            reply = ("ok", f"{time.perf_counter() - start:.3f}")
        try:
            conn.send(reply)
        except (OSError, pickle.PicklingError):
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
