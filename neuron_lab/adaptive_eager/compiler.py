"""The compiled tier: hot graphs compiled with TorchInductor, out of the user's process.

The runtime hands over a graph's description once it has run ``compile_after`` times.
A daemon thread (the background compiler) turns it into plain data (``fx_graph``) and
sends it to the compile worker, a separate Python process (``compile_worker``), which
builds an FX graph over the graph's memory (one input per live storage, a view per
tensor, dead intermediates as local buffers), compiles it with TorchInductor
(functionalized, so in-place and out= ops become writes into the inputs) and saves the
artifact into the private cache (``neuron_lab.files``). The thread loads it, which traces
nothing, and installs it; the device threads then run it instead of replaying the ops, as
long as it is faster. Nothing of FX's or Inductor's process-wide tracing state is touched
in the user's process, so the user's own ``torch.compile`` and ``torch.fx`` work as
without neuron_lab. Inductor's on-disk cache makes the same graph compile quickly in later
processes. A graph that fails to compile, or whose compile the worker dies in, is
replayed, and counted.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from neuron_lab import files
from neuron_lab.adaptive_eager import fx_graph
from neuron_lab.adaptive_eager._native import native as _native
from neuron_lab.adaptive_eager.fx_graph import GraphDescription, Op, Storage, View

if TYPE_CHECKING:
    from neuron_lab.adaptive_eager.compile_worker import CompileWorker

__all__ = ["damaged_cache_file", "wait_for_compiles", "pending_compiles", "build_graph_module", "describe", "install",
           "is_running", "compile_worker_pid", "set_recording_torch_compile_graph"]

# A hot graph arrives as a typed CompileRequest: its storages (GraphStorage) and its
# recorded ops (RecordedOp), whose tensors are TensorViews of those storages; dtypes,
# layouts and memory formats arrive as torch's own objects.
CompileRequest = _native.CompileRequest
TensorView = _native.TensorView


def _plain(value: Any) -> Any:
    """An argument as plain data: TensorViews become fx_graph.Views, lists stay lists."""
    if isinstance(value, TensorView):
        return View(value.storage, tuple(value.sizes), tuple(value.strides), value.offset)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def describe(request: CompileRequest) -> GraphDescription:
    """The request as plain data that pickles (for the compile worker process)."""
    return GraphDescription(
        graph_id=request.graph_id,
        storages=tuple(Storage(s.numel, s.dtype, s.dead) for s in request.storages),
        ops=tuple(Op(op.name, op.overload, tuple(_plain(a) for a in op.args),
                     tuple(_plain(o) for o in op.outputs)) for op in request.ops),
    )


def build_graph_module(request: CompileRequest) -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    """An FX graph that does what the recorded ops do, and example inputs for it."""
    return fx_graph.build_graph_module(describe(request))


def _worker() -> "CompileWorker":
    global _compile_worker
    # Imported here: ``python -m neuron_lab.adaptive_eager.compile_worker`` imports this
    # package before it runs the module as the worker's main.
    from neuron_lab.adaptive_eager.compile_worker import CompileWorker

    with _thread_lock:
        if _compile_worker is None:
            _compile_worker = CompileWorker(
                artifact_dir=lambda: files.cache_subdir("compiled"),
                inductor_cache_dir=files.inductor_cache_dir,
                temporary_dir=lambda: files.cache_subdir("tmp"),
                log_path=lambda: files.cache_dir() / "compile_worker.log",
            )
        return _compile_worker


# The loader's words for a shared library that was cut short or never finished.
_DAMAGED_LIBRARY = re.compile(r"(/\S+\.so): (?:file too short|invalid ELF header|file format not recognized)")


def damaged_cache_file(error: BaseException) -> Optional[Path]:
    """The compiled library in neuron_lab's cache that ``error`` failed to load because it is
    incomplete (a compile killed while writing it: a kernel restart kills the worker), or None.
    Inductor finds such a file by name and would load it again at every later compile."""
    match = _DAMAGED_LIBRARY.search(str(error))
    if match is None:
        return None
    path = Path(match.group(1)).resolve()
    return path if path.is_relative_to(files.cache_dir().resolve()) else None


def _compile(request: CompileRequest) -> Callable[[list], Any]:
    """The graph's compiled code, compiled by the worker process and loaded here. A damaged
    library in the cache is removed and the graph compiled once more."""
    try:
        compiled = _worker().compile(describe(request))
    except Exception as e:  # noqa: BLE001 - anything but a damaged cached library is the caller's
        damaged = damaged_cache_file(e)
        if damaged is None:
            raise
        damaged.unlink(missing_ok=True)
        compiled = _worker().compile(describe(request))

    def run(inputs: list) -> Any:
        return compiled(*inputs)

    return run


def _compile_forever() -> None:
    """The compiler thread: takes hot graphs from the runtime, one at a time, and has the
    compile worker compile them."""
    while not _native.compiler_stopping():
        request = _native.next_compile_request(1.0)
        if request is None:
            continue
        graph_id = request.graph_id
        start = time.perf_counter()
        try:
            fn = _compile(request)
        except Exception as e:  # noqa: BLE001 - any failure means: keep replaying
            _native.install_compiled(graph_id, None, f"{type(e).__name__}: {e}"[:500], time.perf_counter() - start)
        else:
            _native.install_compiled(graph_id, fn, "", time.perf_counter() - start)


_thread: Optional[threading.Thread] = None
_thread_lock = threading.Lock()
_compile_worker: Optional["CompileWorker"] = None


def _after_fork_in_child() -> None:
    global _thread, _thread_lock
    _thread, _thread_lock = None, threading.Lock()  # threads do not survive a fork
    if _compile_worker is not None:
        _compile_worker.forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


def compile_worker_pid() -> Optional[int]:
    """The compile worker process's id while it runs (None before the first hot graph)."""
    worker = _compile_worker
    return worker.pid if worker is not None else None


def wait_for_compiles(timeout: Optional[float] = None) -> bool:
    """Blocks until every requested compile has finished; False on timeout."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while _native.pending_compiles() > 0:
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def pending_compiles() -> int:
    """Compiles requested and not finished yet."""
    return int(_native.pending_compiles())


def set_recording_torch_compile_graph(on: bool) -> bool:
    """Marks the ops this thread records from now on as a torch.compile graph's (the neuron
    backend's async graphs: their fused graphs may compile); returns the previous value, to
    restore it."""
    return bool(_native.set_recording_torch_compile_graph(bool(on)))


def install() -> None:
    """Starts the compiler thread (once per process), only once something may compile;
    Inductor's cache moves to the private cache directory first (``neuron_lab.files``),
    which raises if that directory is unsafe."""
    global _thread
    files.use_private_inductor_cache()
    with _thread_lock:
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_compile_forever, name="neuron-compiler", daemon=True)
            _thread.start()


def is_running() -> bool:
    """Whether the compiler thread has started."""
    return _thread is not None and _thread.is_alive()


def stop() -> None:
    """Ends the compiler thread and the compile worker (at exit, before Python stops
    running threads)."""
    _native.stop_compiler()
    if _compile_worker is not None:
        _compile_worker.close()
    if _thread is not None:
        _thread.join(timeout=30)
