"""The compiled tier: hot graphs compiled with TorchInductor in the background.

The runtime hands over a graph's description once it has run ``compile_after``
times. A daemon thread turns it into an FX graph over the graph's memory (one
input per live storage, a view per tensor, dead intermediates as local
buffers), compiles it with ``torch._inductor.compile_fx`` (functionalized, so
in-place and out= ops become writes into the inputs), and installs it. The
device threads then run it instead of replaying the ops, as long as it is
faster. Inductor's on-disk cache makes the same graph compile quickly in later
processes. A graph that fails to compile is replayed, and counted.
"""

from __future__ import annotations

import functools
import operator
import threading
import time
from typing import Any, Callable, Optional

import torch

from neuron_lab.adaptive_eager._native import native as _native

__all__ = ["wait_for_compiles", "pending_compiles", "build_graph_module", "install", "is_running",
           "set_recording_torch_compile_graph"]

# A hot graph arrives as a typed CompileRequest: its storages (GraphStorage) and its
# recorded ops (RecordedOp), whose tensors are TensorViews of those storages; dtypes,
# layouts and memory formats arrive as torch's own objects.
CompileRequest = _native.CompileRequest
TensorView = _native.TensorView


def _writes(arg: Any) -> bool:
    return arg.alias_info is not None and arg.alias_info.is_write


def _resolve(name: str, overload: str) -> Any:
    namespace, op_name = name.split("::")
    return getattr(getattr(getattr(torch.ops, namespace), op_name), overload or "default")


@functools.lru_cache(maxsize=None)
def _functional_twin(op: Any) -> Any:
    """The overload of an out= op that takes the same inputs and returns the result."""
    schema = op._schema
    inputs = [(a.name, str(a.type)) for a in schema.arguments if not _writes(a)]
    packet = getattr(getattr(torch.ops, schema.name.split("::")[0]), schema.name.split("::")[1])
    for overload in packet.overloads():
        candidate = getattr(packet, overload)
        cs = candidate._schema
        if any(_writes(a) for a in cs.arguments) or any(r.alias_info is not None for r in cs.returns):
            continue
        if [(a.name, str(a.type)) for a in cs.arguments] == inputs and len(cs.returns) == 1:
            return candidate
    return None


def _write_once_storages(ops: list, resolved: list) -> set[int]:
    """Storages used through one view only and written by exactly one op, before any read."""
    views: dict[int, set] = {}
    writes: dict[int, int] = {}
    read_before_write: set[int] = set()

    def visit(value: Any, write: bool) -> None:
        if isinstance(value, TensorView):
            index = value.storage
            views.setdefault(index, set()).add(value.key)
            if write:
                writes[index] = writes.get(index, 0) + 1
            elif writes.get(index, 0) == 0:
                read_before_write.add(index)
        elif isinstance(value, list):
            for v in value:
                visit(v, write)

    for recorded, op in zip(ops, resolved):
        for arg, value in zip(op._schema.arguments, recorded.args):
            if not _writes(arg):
                visit(value, False)
        for arg, value in zip(op._schema.arguments, recorded.args):
            if _writes(arg):
                visit(value, True)
        for out in recorded.outputs:
            visit(out, True)
    return {i for i, v in views.items() if len(v) == 1 and writes.get(i, 0) == 1 and i not in read_before_write}


def build_graph_module(request: CompileRequest) -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    """An FX graph that does what the recorded ops do, and example inputs for it."""
    storages, ops = request.storages, request.ops
    graph = torch.fx.Graph()
    bases: dict[int, torch.fx.Node] = {}
    examples: list[torch.Tensor] = []
    for index, storage in enumerate(storages):
        if storage.dead:
            bases[index] = graph.call_function(
                torch.ops.aten.empty.memory_format, ([storage.numel],),
                {"dtype": storage.dtype, "device": torch.device("cpu")},
            )
        else:
            bases[index] = graph.placeholder(f"memory{index}")
            examples.append(torch.empty(storage.numel, dtype=storage.dtype))
    views: dict[tuple, torch.fx.Node] = {}

    def view(key: tuple) -> torch.fx.Node:
        if key not in views:
            index, sizes, strides, offset = key
            views[key] = graph.call_function(
                torch.ops.aten.as_strided.default, (bases[index], list(sizes), list(strides), offset)
            )
        return views[key]

    def convert(value: Any) -> Any:
        if isinstance(value, TensorView):
            return view(value.key)
        if isinstance(value, list):
            return [convert(v) for v in value]
        if isinstance(value, torch.device):
            return torch.device("cpu")
        return value

    resolved = [_resolve(recorded.name, recorded.overload) for recorded in ops]
    simple = _write_once_storages(ops, resolved)
    results: dict[tuple, torch.fx.Node] = {}  # results of write-once storages, by view

    def convert_arg(value: Any) -> Any:
        if isinstance(value, TensorView):
            return results[value.key] if value.key in results else view(value.key)
        if isinstance(value, list):
            return [convert_arg(v) for v in value]
        return convert(value)

    for recorded, op in zip(ops, resolved):
        args, outputs = recorded.args, recorded.outputs
        schema = op._schema
        out_args = [(a, v) for a, v in zip(schema.arguments, args) if _writes(a) and a.kwarg_only]
        twin = _functional_twin(op) if len(out_args) == 1 else None
        if twin is not None and isinstance(out_args[0][1], TensorView) and out_args[0][1].storage in simple:
            # An out= op whose output memory is written once: its functional twin,
            # so that Inductor keeps the intermediate in registers.
            positional, keywords = [], {}
            for arg, value in zip(schema.arguments, args):
                if _writes(arg):
                    continue
                converted = convert_arg(value)
                if arg.kwarg_only:
                    keywords[arg.name] = converted
                else:
                    positional.append(converted)
            results[out_args[0][1].key] = graph.call_function(twin, tuple(positional), keywords)
            continue
        positional, keywords = [], {}
        for arg, value in zip(schema.arguments, args):
            converted = convert_arg(value)
            if arg.kwarg_only:
                keywords[arg.name] = converted
            else:
                positional.append(converted)
        node = graph.call_function(op, tuple(positional), keywords)
        if outputs:
            fresh = [r for r in schema.returns if r.alias_info is None]
            rets = [node] if len(schema.returns) == 1 else [
                graph.call_function(operator.getitem, (node, i)) for i in range(len(schema.returns))
            ]
            flat: list[torch.fx.Node] = []
            for ret, result in zip(schema.returns, rets):
                if ret.alias_info is not None:
                    continue
                if "[]" in str(ret.type):
                    count = len(outputs) - len(flat) - (len(fresh) - 1 - len(flat))
                    flat.extend(graph.call_function(operator.getitem, (result, i)) for i in range(count))
                else:
                    flat.append(result)
            for out, result in zip(outputs, flat):
                if out.storage in simple:
                    results[out.key] = result
                else:
                    graph.call_function(torch.ops.aten.copy_.default, (view(out.key), result))
    # Write-once results that outlive the graph go to their memory.
    for key, result in results.items():
        if not storages[key[0]].dead:
            graph.call_function(torch.ops.aten.copy_.default, (view(key), result))
    # AOTAutograd expects at least one output; the effects are the writes into the inputs.
    token = graph.call_function(torch.ops.aten.empty.memory_format, ([0],), {"device": torch.device("cpu")})
    graph.output((token,))
    return torch.fx.GraphModule(torch.nn.Module(), graph), examples


def _compile(request: CompileRequest) -> Callable[[list], Any]:
    from torch._inductor.compile_fx import compile_fx

    module, examples = build_graph_module(request)
    with torch.no_grad():
        compiled = compile_fx(module, examples)

    def run(inputs: list) -> Any:
        return compiled(*inputs)

    return run


class _ExclusiveWithDynamo:
    """FX and Inductor keep process-wide state (the FX tracing flag, traceback levels):
    a background compile overlapping a torch.compile on another thread breaks the
    latter. The background compiler holds this lock per graph; Dynamo's compile
    callbacks take it for each torch.compile compile."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.compiling_thread: Optional[int] = None  # the background compiler, while it compiles
        self._dynamo_holds = False

    def _start(self, _args: Any) -> None:
        self.lock.acquire()
        self._dynamo_holds = True

    def _end(self, _args: Any) -> None:
        if self._dynamo_holds:  # a compile that began before registration holds nothing
            self._dynamo_holds = False
            self.lock.release()

    def register(self) -> None:
        """Hooks into Dynamo (imported here, in the background, on first use). The hooks
        survive ``torch._dynamo.reset()``, which clears Dynamo's compile callbacks: a
        reset while a background compile runs would otherwise let the next torch.compile
        overlap it."""
        from torch._dynamo.callback import callback_handler

        def add_hooks() -> None:
            callback_handler.register_start_callback(self._start)
            callback_handler.register_end_callback(self._end)

        if self._start in callback_handler.start_callbacks:
            return
        add_hooks()
        if not getattr(callback_handler.clear, "_neuron_lab", False):
            clear = callback_handler.clear

            def clear_keeping_the_lock() -> None:
                clear()
                add_hooks()

            clear_keeping_the_lock._neuron_lab = True  # type: ignore[attr-defined]
            callback_handler.clear = clear_keeping_the_lock
        # A torch.compile already under way did not take the lock: let it finish first.
        pending = "_CompilationCallbackHandler__pending_callbacks_counter"
        while getattr(callback_handler, pending, 0) > 0 and not self._dynamo_holds:
            time.sleep(0.05)


_exclusive = _ExclusiveWithDynamo()


def _install_fx_tracing_check() -> None:
    """FX marks "symbolic tracing in progress" in one process-wide flag, and every call
    of a torch.compile'd function checks it: while the background compiler traces, a
    compiled function called on the user's thread would refuse to run. The check
    Dynamo uses is made to ignore the flag on other threads while the background
    compiler is the one tracing. (Compiling in a subprocess would remove the need.)"""
    import torch.fx._symbolic_trace as symbolic_trace

    original = symbolic_trace.is_fx_symbolic_tracing
    if getattr(original, "_neuron_lab", False):
        return

    def is_fx_symbolic_tracing() -> bool:
        tracer = _exclusive.compiling_thread
        if tracer is not None and tracer != threading.get_ident():
            return False  # the flag is the background compiler's
        return original()

    is_fx_symbolic_tracing._neuron_lab = True  # type: ignore[attr-defined]
    symbolic_trace.is_fx_symbolic_tracing = is_fx_symbolic_tracing


def _only_on_thread(thread: int, new_fn: Callable, orig_fn: Callable) -> Callable:
    @functools.wraps(new_fn)
    def dispatch(*args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == thread:
            return new_fn(*args, **kwargs)
        return orig_fn(*args, **kwargs)

    return dispatch


def _install_thread_local_fx_patches() -> None:
    """While FX traces, it patches process-wide functions (``torch.nn.Module.__call__``
    and ``__getattr__``, autowrapped globals of the modules it meets). A background
    trace made every module call on the user's thread go through the tracer's wrapper:
    a torch.compile'd model then compiled a second time, under the tracer's node-meta
    state, and failed. Patches the background compiler's traces make apply to its own
    thread only; other threads keep the original functions."""
    import builtins

    from torch.fx import _symbolic_trace as symbolic_trace

    patcher = symbolic_trace._Patcher
    if getattr(patcher.patch, "_neuron_lab", False):
        return
    original_patch, original_patch_method = patcher.patch, patcher.patch_method

    def patch(self: Any, frame_dict: dict, name: str, new_fn: Callable, deduplicate: bool = True) -> None:
        tracer = _exclusive.compiling_thread
        orig_fn = frame_dict.get(name, getattr(builtins, name, None))
        if tracer == threading.get_ident() and callable(orig_fn):
            new_fn = _only_on_thread(tracer, new_fn, orig_fn)
        original_patch(self, frame_dict, name, new_fn, deduplicate)

    def patch_method(self: Any, cls: type, name: str, new_fn: Callable, deduplicate: bool = True) -> None:
        tracer = _exclusive.compiling_thread
        if tracer == threading.get_ident():
            new_fn = _only_on_thread(tracer, new_fn, getattr(cls, name))
        original_patch_method(self, cls, name, new_fn, deduplicate)

    patch._neuron_lab = True  # type: ignore[attr-defined]
    patcher.patch = patch
    patcher.patch_method = patch_method


def _compile_forever() -> None:
    """The compiler thread: takes hot graphs from the runtime, one at a time."""
    while not _native.compiler_stopping():
        request = _native.next_compile_request(1.0)
        if request is None:
            continue
        graph_id = request.graph_id
        start = time.perf_counter()
        try:
            _exclusive.register()
            with _exclusive.lock:
                _exclusive.compiling_thread = threading.get_ident()
                try:
                    fn = _compile(request)
                finally:
                    _exclusive.compiling_thread = None
        except Exception as e:  # noqa: BLE001 - any failure means: keep replaying
            _native.install_compiled(graph_id, None, f"{type(e).__name__}: {e}"[:500], time.perf_counter() - start)
        else:
            _native.install_compiled(graph_id, fn, "", time.perf_counter() - start)


_thread: Optional[threading.Thread] = None
_thread_lock = threading.Lock()


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
    """Starts the compiler thread (once per process), and makes FX's process-wide
    tracing state safe for it (see the two ``_install_*`` functions): only once
    something may compile."""
    global _thread
    with _thread_lock:
        if _thread is None or not _thread.is_alive():
            _install_fx_tracing_check()
            _install_thread_local_fx_patches()
            _thread = threading.Thread(target=_compile_forever, name="neuron-compiler", daemon=True)
            _thread.start()


def is_running() -> bool:
    """Whether the compiler thread has started."""
    return _thread is not None and _thread.is_alive()


def stop() -> None:
    """Ends the compiler thread (at exit, before Python stops running threads)."""
    _native.stop_compiler()
    if _thread is not None:
        _thread.join(timeout=30)
