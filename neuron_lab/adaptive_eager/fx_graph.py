"""A hot graph as plain data, and the FX graph that does what it describes.

The runtime hands a hot graph over as a ``CompileRequest`` (C++ objects). ``describe``
in ``compiler.py`` turns it into the plain values here (op names, overloads, numbers,
dtypes, views of the graph's storages), which pickle: the compile worker process
receives them, and ``build_graph_module`` builds the FX graph there. This module needs
torch only, so that the worker builds graphs without the device.

The FX graph runs over the graph's memory: one input per live storage (flat, of the
storage's dtype), a view per tensor, dead intermediates as local buffers. Out= ops whose
output memory is written once become their functional twins, so that TorchInductor
keeps those intermediates in registers; in-place and out= writes into live memory become
``copy_`` into the inputs (functionalized by Inductor into writes).
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["View", "Storage", "Op", "GraphDescription", "build_graph_module"]


@dataclass(frozen=True)
class View:
    """A tensor of the graph: a view of storage ``storage``."""

    storage: int
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int

    @property
    def key(self) -> tuple:
        """Equal for the same view."""
        return (self.storage, self.sizes, self.strides, self.offset)


@dataclass(frozen=True)
class Storage:
    """One memory of the graph: live ones are the compiled code's inputs, in order."""

    numel: int
    dtype: torch.dtype
    dead: bool  # an intermediate nothing outside the graph holds


@dataclass(frozen=True)
class Op:
    """One recorded op: its schema's name and overload, its arguments (per schema argument:
    a View, a plain value or a list of them) and its fresh results."""

    name: str
    overload: str
    args: tuple
    outputs: tuple[View, ...]


@dataclass(frozen=True)
class GraphDescription:
    """What the compile worker needs to build and compile one hot graph."""

    graph_id: int
    storages: tuple[Storage, ...]
    ops: tuple[Op, ...]


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


def _write_once_storages(ops: tuple[Op, ...], resolved: list) -> set[int]:
    """Storages used through one view only and written by exactly one op, before any read."""
    views: dict[int, set] = {}
    writes: dict[int, int] = {}
    read_before_write: set[int] = set()

    def visit(value: Any, write: bool) -> None:
        if isinstance(value, View):
            index = value.storage
            views.setdefault(index, set()).add(value.key)
            if write:
                writes[index] = writes.get(index, 0) + 1
            elif writes.get(index, 0) == 0:
                read_before_write.add(index)
        elif isinstance(value, (list, tuple)):
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


def build_graph_module(description: GraphDescription) -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    """An FX graph that does what the recorded ops do, and example inputs for it (host
    tensors, one per live storage). The graph is built node by node: nothing is traced."""
    storages, ops = description.storages, description.ops
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
        if isinstance(value, View):
            return view(value.key)
        if isinstance(value, (list, tuple)):
            return [convert(v) for v in value]
        if isinstance(value, torch.device):
            return torch.device("cpu")
        return value

    resolved = [_resolve(recorded.name, recorded.overload) for recorded in ops]
    simple = _write_once_storages(ops, resolved)
    results: dict[tuple, torch.fx.Node] = {}  # results of write-once storages, by view

    def convert_arg(value: Any) -> Any:
        if isinstance(value, View):
            return results[value.key] if value.key in results else view(value.key)
        if isinstance(value, (list, tuple)):
            return [convert_arg(v) for v in value]
        return convert(value)

    for recorded, op in zip(ops, resolved):
        args, outputs = recorded.args, recorded.outputs
        schema = op._schema
        out_args = [(a, v) for a, v in zip(schema.arguments, args) if _writes(a) and a.kwarg_only]
        twin = _functional_twin(op) if len(out_args) == 1 else None
        if twin is not None and isinstance(out_args[0][1], View) and out_args[0][1].storage in simple:
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
