"""The ``neuron`` torch.compile backend.

``torch.compile(model, backend="neuron")`` (or ``torch.compiler.set_default_backend("neuron")``
then ``model.compile()``): Dynamo captures the graph and AOTAutograd splits it into a
forward and a backward graph. Each graph then runs in one of two ways:

* ``async`` (the default): the graph's ATen ops run through adaptive eager and are
  launched together on the neuron stream when the graph ends, without waiting; the host
  runs ahead (the loss, the backward's bookkeeping, the optimizer's Python) while the
  device computes, as on real hardware. The graphs share adaptive eager's cache,
  counters, profiler records and explain() causes, and once hot they are compiled by
  TorchInductor in the background and run as compiled code where that is measured
  faster than replay.
* ``inline``: TorchInductor compiles the graph *for the host* (the emulated NeuronCore
  computes on the host CPU) when it is first traced, and each call is one inline launch:
  it waits for the launches producing its inputs, then runs the compiled code over the
  device memory itself (CPU aliases, no copies), its results adopted as neuron tensors.
  Chosen with ``options={"neuron.launch": "inline"}``, and implied by TorchInductor
  options or a ``mode`` that sets some (they configure that compile).

Every graph build and recompile is logged with its cause and line
(``neuron_lab.explain``). Graphs with symbolic shapes (``dynamic=True``, or Dynamo's
automatic dynamic shapes after a shape change) and graphs spanning several cores
always run the async way.
"""

from __future__ import annotations

import concurrent.futures
import copy
import functools
import itertools
import threading
import time
from typing import Any, Callable, Optional, Sequence

import torch
import torch.fx

from neuron_lab import adaptive_eager, files
from neuron_lab.compile.flex_host import prepare_flex_attention_for_host
from neuron_lab.device import host_kernels as _kernels
from neuron_lab.device import trace
from neuron_lab.device.trace import Reason

__all__ = ["neuron_backend", "compiled_graphs"]

_graph_ids = itertools.count(1)
_lock = threading.Lock()
# Example input shapes of the last compile of each Dynamo frame: a recompile's cause.
_last_inputs: dict[int, list[str]] = {}
_graphs: list[dict] = []


def compiled_graphs() -> list[dict]:
    """Every graph the backend compiled: id, kind (forward / backward / inference), tier
    (``async`` or ``inline``), compile seconds (inline), launches, Inductor options."""
    with _lock:
        return [dict(g) for g in _graphs]


def _describe(value: torch.Tensor) -> str:
    dtype = str(value.dtype).removeprefix("torch.")
    return f"{dtype}[{', '.join(str(s) for s in value.shape)}] on {value.device}"


def _log(kind: str, what: str, detail: str, duration_s: float = 0.0, graph_id: int = -1) -> None:
    trace.log_event(kind, what, detail, int(duration_s * 1e9), graph_id, -1)


def _note_frame(example_inputs: Sequence[Any]) -> tuple[str, str]:
    """(kind, cause) of this Dynamo compile: a first compile or a recompile, and why."""
    from torch._guards import CompileContext

    compile_id = CompileContext.current_compile_id()
    frame = compile_id.frame_id if compile_id is not None else -1
    shapes = [_describe(x) for x in example_inputs if isinstance(x, torch.Tensor)]
    with _lock:
        previous = _last_inputs.get(frame)
        _last_inputs[frame] = shapes
    first = compile_id is None or compile_id.frame_compile_id == 0  # frame ids restart after dynamo.reset()
    if previous is None or first:
        return "new_graph", "torch.compile: the first compile of this function"
    for i, (now, then) in enumerate(zip(shapes, previous)):
        if now != then:
            dynamic = " (dynamic: Dynamo marked the changed size symbolic)" if "s" in now.split("[")[1] else ""
            return "recompile", (f"torch.compile: Dynamo's guards failed: tensor input {i} is {now}{dynamic}; "
                                 f"the cached graph was compiled for {then}")
    if len(shapes) != len(previous):
        return "recompile", f"torch.compile: {len(shapes)} tensor inputs now, {len(previous)} before"
    return "recompile", "torch.compile: a guard on a Python value (not a tensor shape) failed"


def _to_cpu_device(value: Any) -> Any:
    if isinstance(value, torch.device) and value.type == "neuron":
        return torch.device("cpu")
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu_device(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_cpu_device(v) for k, v in value.items()}
    return value


def _retarget_to_host(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of the graph with every ``device=neuron`` argument on the CPU (the host
    runs it); the original stays as it is, for the async tier if Inductor fails."""
    gm = copy.deepcopy(gm)
    for node in gm.graph.nodes:
        node.args = _to_cpu_device(node.args)
        node.kwargs = _to_cpu_device(node.kwargs)
        # Fake values of the trace are neuron tensors: Inductor traces the host graph again.
        for key in ("val", "example_value", "tensor_meta"):
            node.meta.pop(key, None)
    gm.recompile()
    return gm


def _is_symbolic(x: Any) -> bool:
    if isinstance(x, torch.SymInt):
        return True
    if isinstance(x, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in (*x.shape, *x.stride()))
    return False


def _host_example(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype, device="cpu")
    return x


_pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="neuron-compile")


def _inductor_config(mode: Optional[str] = None, options: Optional[dict] = None) -> dict:
    """TorchInductor config patches for ``torch.compile(..., backend="neuron", mode=, options=)``.

    ``mode`` takes Inductor's modes (``torch._inductor.list_mode_options()``) less CUDA
    graphs, which do not apply: the neuron stream already runs a compiled graph as one
    launch. ``options`` are Inductor config names (``torch._inductor.list_options()``),
    for example ``{"cpp_wrapper": True}``: a C++ wrapper that runs the graph without
    Python (slower to compile, faster per launch)."""
    import torch._inductor

    patches: dict = {}
    if mode is not None and mode != "default":
        try:
            patches.update(torch._inductor.list_mode_options(mode))
        except RuntimeError as e:
            raise ValueError(f"torch.compile(backend='neuron'): {e}") from None
    patches.pop("triton.cudagraphs", None)
    if options:
        options = {str(k).replace("-", "_"): v for k, v in options.items()}  # as torch.compile's inductor
        known = set(torch._inductor.list_options())
        unknown = sorted(k for k in options if k not in known)
        if unknown:
            raise ValueError(f"torch.compile(backend='neuron'): {', '.join(map(repr, unknown))} "
                             f"{'is not a TorchInductor option' if len(unknown) == 1 else 'are not TorchInductor options'}; "
                             "the names are listed by torch._inductor.list_options()")
        patches.update(options)
    return patches


LAUNCH_OPTION = "neuron.launch"
LAUNCH_KINDS = ("async", "inline")


def _launch_and_config(mode: Optional[str], options: Optional[dict]) -> tuple[str, dict]:
    """How graphs launch (async or inline, see the module docstring) and the Inductor
    config patches for inline graphs."""
    options = dict(options or {})
    launch = options.pop(LAUNCH_OPTION, None)
    patches = _inductor_config(mode, options)
    if launch is None:
        return ("inline" if patches else "async"), patches
    if launch not in LAUNCH_KINDS:
        raise ValueError(f"torch.compile(backend='neuron'): options[{LAUNCH_OPTION!r}] is {launch!r}; "
                         f"use one of {', '.join(map(repr, LAUNCH_KINDS))}")
    if launch == "async" and patches:
        raise ValueError(f"torch.compile(backend='neuron'): TorchInductor options {sorted(patches)} configure "
                         f"the inline launch's compile; drop them or set options[{LAUNCH_OPTION!r}] = 'inline'")
    return launch, patches


def _inductor_compile(gm: torch.fx.GraphModule, examples: list, config_patches: dict) -> Callable:
    """TorchInductor's host code for a copy of a neuron graph (``gm`` keeps its trace's
    values, which the FlexAttention rewrite reads; ``examples`` are host tensors)."""
    # A fresh thread: none of Dynamo's tracing state (fake mode, tracing context) of
    # the caller leaks into Inductor's own compile of this host graph.
    def work() -> Callable:
        from torch._inductor.compile_fx import compile_fx
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        prepared = copy.deepcopy(gm)
        prepare_flex_attention_for_host(prepared)
        host_gm = _retarget_to_host(prepared)

        # Fake examples with a ShapeEnv: Inductor's and AOTAutograd's on-disk caches
        # need one ("No shape env" bypasses them), so a kernel restart recompiles fast.
        fake_mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)
        fakes = [fake_mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in examples]
        with torch.no_grad():
            return compile_fx(host_gm, fakes, config_patches={**files.INDUCTOR_PATCHES, **config_patches})

    return _pool.submit(work).result()


def _neuron_indices(value: Any) -> set[int]:
    if isinstance(value, torch.Tensor):
        return {value.device.index or 0} if value.device.type == "neuron" else set()
    if isinstance(value, torch.device):
        return {value.index or 0} if value.type == "neuron" else set()
    if isinstance(value, (list, tuple)):
        return set().union(*(_neuron_indices(v) for v in value))
    if isinstance(value, dict):
        return _neuron_indices(list(value.values()))
    return set()


def _devices_of(gm: torch.fx.GraphModule, examples: Sequence[Any]) -> set[int]:
    """The neuron cores a graph uses: those of its inputs and of its factory calls
    (``arange(device="neuron")`` in a graph without tensor inputs)."""
    devices = _neuron_indices(list(examples))
    for node in gm.graph.nodes:
        if node.op == "call_function":
            devices |= _neuron_indices(node.args) | _neuron_indices(node.kwargs)
    return devices


def _outputs_on_neuron(gm: torch.fx.GraphModule) -> Optional[list[bool]]:
    """Per flat output of the graph, whether the trace put it on neuron (None: unknown)."""
    output = next((n for n in gm.graph.nodes if n.op == "output"), None)
    if output is None:
        return None
    flat = torch.utils._pytree.tree_leaves(output.args[0])
    vals = [n.meta.get("val") if isinstance(n, torch.fx.Node) else n for n in flat]
    if any(isinstance(n, torch.fx.Node) and "val" not in n.meta for n in flat):
        return None
    return [isinstance(v, torch.Tensor) and v.device.type == "neuron" for v in vals]


def _run_async(gm: torch.fx.GraphModule, record: dict, devices: set[int]) -> Callable:
    """The graph's ATen ops, recorded by adaptive eager and launched together on each
    core's stream when the graph ends (boxed: AOTAutograd's arguments are freed early)."""

    def run(args: list) -> Any:
        items = list(args)
        args.clear()
        previous = adaptive_eager.set_recording_torch_compile_graph(True)  # its graphs may compile
        try:
            outputs = gm(*items)
        finally:
            adaptive_eager.set_recording_torch_compile_graph(previous)
        del items
        for device in devices:
            adaptive_eager.flush(device, Reason.COMPILED_GRAPH_END)
        record["launches"] += 1
        return outputs

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def _adopt(outputs: Any, on_neuron: Optional[list[bool]], device: int, host_inputs: list,
           inputs: list) -> list:
    """The host code's outputs as the graph's: neuron tensors where the trace had them on
    neuron (adopted without copies where possible), the others as they are."""
    flat = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    if on_neuron is None or len(on_neuron) != len(flat):
        return _kernels.adopt(flat, device, host_inputs, inputs)
    adopted = iter(_kernels.adopt([v for v, dev in zip(flat, on_neuron) if dev], device, host_inputs, inputs))
    return [next(adopted) if dev else v for v, dev in zip(flat, on_neuron)]


def _compile_graph(kind: str, launch_kind: str, config_patches: dict, gm: torch.fx.GraphModule,
                   example_inputs: Sequence[Any]) -> Callable:
    graph_id = next(_graph_ids)
    name = f"compiled {kind} graph {graph_id}"
    devices = _devices_of(gm, example_inputs)
    record = {"id": graph_id, "kind": kind, "tier": launch_kind, "compile_s": 0.0, "launches": 0,
              "ops": sum(1 for n in gm.graph.nodes if n.op == "call_function"),
              "inductor_options": dict(config_patches)}
    async_reason = None
    if any(_is_symbolic(x) for x in example_inputs):
        async_reason = "its shapes are symbolic (dynamic shapes): it runs as async launches through adaptive eager"
    elif len(devices) > 1:
        async_reason = f"it uses several cores ({sorted(devices)}): it runs as async launches through adaptive eager"
    elif launch_kind == "async":
        async_reason = (f"its {record['ops']} ops run as async launches through adaptive eager (compiled by "
                        f"TorchInductor in the background once hot); options={{'{LAUNCH_OPTION}': 'inline'}} "
                        "compiles it with Inductor now and runs it inline")
    if async_reason is not None:
        record["tier"] = "async"
        with _lock:
            _graphs.append(record)
        _log("compile", name, async_reason, 0.0, graph_id)
        return _run_async(gm, record, devices)

    start = time.perf_counter()
    on_neuron = _outputs_on_neuron(gm)  # before the host copy drops the trace's values
    try:
        compiled = _inductor_compile(gm, [_host_example(x) for x in example_inputs], config_patches)
    except Exception as e:
        _log("compile_failed", name, f"Inductor failed ({type(e).__name__}: {e}); it runs as async launches "
             "through adaptive eager", time.perf_counter() - start, graph_id)
        record["tier"] = "async (inline compile failed)"
        with _lock:
            _graphs.append(record)
        return _run_async(gm, record, devices)
    seconds = time.perf_counter() - start
    record["compile_s"] = seconds
    with _lock:
        _graphs.append(record)
    _log("compile", name, f"TorchInductor compiled {record['ops']} ops for the host", seconds, graph_id)
    if not devices:
        return compiled  # a graph over CPU tensors only

    device = devices.pop()

    def launch(*args: Any) -> Any:
        tensors = [a for a in args if isinstance(a, torch.Tensor) and a.device.type == "neuron"]
        _kernels.prepare_host_access(tensors, [], name, reason=Reason.COMPILED_GRAPH)
        # Inductor's code allocates its results with the CPU allocator: inside the launch
        # those allocations take device memory, and adopt() keeps them without copies.
        with _kernels.InlineLaunch(device, name, device_memory=True):
            host_args = [_kernels.host_alias(a) if isinstance(a, torch.Tensor) else a for a in args]
            host_inputs = [h for a, h in zip(args, host_args)
                           if isinstance(a, torch.Tensor) and a.device.type == "neuron"]
            outputs = compiled(*host_args)
            results = _adopt(outputs, on_neuron, device, host_inputs, tensors)
        record["launches"] += 1
        return type(outputs)(results) if isinstance(outputs, tuple) else results

    launch._boxed_call = getattr(compiled, "_boxed_call", False)  # type: ignore[attr-defined]
    if launch._boxed_call:  # Inductor's boxed convention: one list argument, cleared by the callee
        def boxed(args: list) -> Any:
            items = list(args)
            args.clear()
            return launch(*items)

        boxed._boxed_call = True  # type: ignore[attr-defined]
        return boxed
    return launch


def neuron_backend(gm: torch.fx.GraphModule, example_inputs: list, mode: Optional[str] = None,
                   options: Optional[dict] = None) -> Callable:
    """The Dynamo backend registered as ``"neuron"``. ``mode`` and ``options`` are
    torch.compile's: ``options["neuron.launch"]`` is ``"async"`` or ``"inline"`` (see the
    module docstring); the other options and the mode configure TorchInductor's compile
    of inline graphs (see ``_inductor_config``)."""
    from torch._dynamo.backends.common import aot_autograd

    from neuron_lab.adaptive_eager import compiler
    from neuron_lab.compile import device_interface

    device_interface.register()
    compiler.install()  # its async graphs compile in the background once hot
    launch_kind, config_patches = _launch_and_config(mode, options)
    kind, cause = _note_frame(example_inputs)
    _log(kind, f"torch.compile graph ({sum(1 for n in gm.graph.nodes if n.op == 'call_function')} ops)", cause)
    return aot_autograd(
        fw_compiler=functools.partial(_compile_graph, "forward", launch_kind, config_patches),
        bw_compiler=functools.partial(_compile_graph, "backward", launch_kind, config_patches),
        inference_compiler=functools.partial(_compile_graph, "inference", launch_kind, config_patches),
        partition_fn=_partition_for(launch_kind),
        keep_inference_input_mutations=True,
    )(gm, example_inputs)


def _partition_for(launch_kind: str) -> Callable:
    """How AOTAutograd splits a training graph into forward and backward.

    Async graphs run their ATen ops as eager mode would, so they keep what eager's autograd
    keeps: the forward saves the values the backward needs (``default_partition``), with no
    recomputation. Inductor's min-cut partition pays off when Inductor fuses the recomputed
    ops (inline graphs); for async graphs it would add ops to the backward, and its CSE pass
    imports much of Inductor: 0.6 s more on the first step of a tiny Llama (benchmarks/
    bench_first_minute.py, row compile), before any op runs."""
    from torch._functorch import partitioners

    if launch_kind == "inline":
        return partitioners.min_cut_rematerialization_partition
    return partitioners.default_partition
