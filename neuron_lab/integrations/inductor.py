"""torch.compile's default backend on neuron tensors.

TorchInductor generates code per device type and has no generator for ``neuron``: a
graph over neuron tensors failed deep inside it (``KeyError: 'neuron'``). The emulated
NeuronCore computes on the host, so such a graph is what the ``neuron`` backend's inline
launch kind already compiles: its devices retargeted to the CPU, TorchInductor's C++ code
for the host, each call one inline launch over device memory with its results adopted as
neuron tensors. ``torch.compile(fn)`` and ``torch.compile(fn, mode=..., options=...)`` on
neuron inputs take that path with the same mode and options; graphs without neuron
tensors are TorchInductor's as before.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

import torch

__all__ = ["compile_neuron_graphs_for_the_host", "uses_neuron"]

# What torch.compile passes to compile_fx besides the graph and its inputs.
_DYNAMO_KWARGS = {"config_patches", "compile_region_name"}


def _is_neuron(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.device.type == "neuron"
    if isinstance(value, torch.device):
        return value.type == "neuron"
    if isinstance(value, (list, tuple)):
        return any(_is_neuron(v) for v in value)
    if isinstance(value, dict):
        return any(_is_neuron(v) for v in value.values())
    return False


def uses_neuron(gm: torch.fx.GraphModule, example_inputs: Any) -> bool:
    """Whether a graph touches the neuron device: an input, a device argument (a factory
    call such as ``arange(device="neuron")``) or a traced value lives there."""
    if _is_neuron(list(example_inputs)):
        return True
    for node in gm.graph.nodes:
        if _is_neuron(node.args) or _is_neuron(node.kwargs) or _is_neuron(node.meta.get("val")):
            return True
    return False


def compile_neuron_graphs_for_the_host(module: ModuleType) -> None:
    """Wraps ``module.compile_fx`` (``torch._inductor.compile_fx``) once."""
    original = module.compile_fx
    if getattr(original, "_neuron_lab", False):
        return

    @functools.wraps(original)
    def compile_fx(model_: Any, example_inputs_: Any, *args: Any, **kwargs: Any) -> Any:
        # Only Dynamo's own call (a graph, its inputs, the torch.compile options) is
        # routed; AOTInductor, custom inner compilers and CPU graphs are Inductor's.
        if args or set(kwargs) - _DYNAMO_KWARGS or not isinstance(model_, torch.fx.GraphModule) \
                or not uses_neuron(model_, example_inputs_):
            return original(model_, example_inputs_, *args, **kwargs)
        from neuron_lab.compile.backend import LAUNCH_OPTION, neuron_backend

        options = {**(kwargs.get("config_patches") or {}), LAUNCH_OPTION: "inline"}
        return neuron_backend(model_, example_inputs_, options=options)

    compile_fx._neuron_lab = True  # type: ignore[attr-defined]
    module.compile_fx = compile_fx
