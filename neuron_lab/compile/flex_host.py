"""FlexAttention in graphs that TorchInductor compiles for the host (inline launches).

TorchInductor lowers ``flex_attention`` on the CPU to a C++ template that does inference
only: it refuses the log-sum-exp output (which FlexAttention asks for on every device
but the CPU whenever grad mode is on) and has no lowering of ``flex_attention_backward``.
Before such a graph goes to Inductor:

* a forward op whose log-sum-exp nothing reads is told not to produce it, and keeps the
  fused C++ template;
* any other FlexAttention op (training graphs, ``return_lse``, the backward) becomes its
  dense decomposition, PyTorch's own eager implementation (``sdpa_dense``,
  ``sdpa_dense_backward``) traced to ATen ops, which Inductor fuses like any others.
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import torch
import torch.fx
from torch.utils import _pytree as pytree

__all__ = ["prepare_flex_attention_for_host"]


def _hops() -> tuple[Any, Any, Callable, Callable]:
    from torch._higher_order_ops.flex_attention import (
        flex_attention,
        flex_attention_backward,
        sdpa_dense,
        sdpa_dense_backward,
    )

    return flex_attention, flex_attention_backward, sdpa_dense, sdpa_dense_backward


def _output_read(node: torch.fx.Node, index: int) -> bool:
    """Whether anything reads output ``index`` of a node that returns a tuple."""
    for user in node.users:
        if user.target is operator.getitem and user.args[1] != index:
            continue
        return True
    return False


def _example(value: Any) -> Any:
    """A host tensor shaped like a traced value (the decomposition is traced on the host)."""
    return torch.empty_strided(tuple(value.shape), tuple(value.stride()), dtype=value.dtype, device="cpu")


def _inline_dense(gm: torch.fx.GraphModule, node: torch.fx.Node, impl: Callable) -> None:
    """Replaces ``node`` (a FlexAttention op) by ``impl`` traced to ATen ops."""
    from torch.fx.experimental.proxy_tensor import make_fx

    leaves, spec = pytree.tree_flatten(node.args)
    tensor_nodes: list[torch.fx.Node] = []
    concrete: list[Any] = []
    for leaf in leaves:
        if isinstance(leaf, torch.fx.Node) and leaf.op == "get_attr":
            concrete.append(gm.get_submodule(leaf.target) if isinstance(leaf.target, str) else leaf.target)
        elif isinstance(leaf, torch.fx.Node):
            tensor_nodes.append(leaf)
            concrete.append(None)
        else:
            concrete.append(leaf)
    slots = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.fx.Node) and leaf.op != "get_attr"]

    def dense(*tensors: torch.Tensor) -> Any:
        filled = list(concrete)
        for slot, tensor in zip(slots, tensors):
            filled[slot] = tensor
        return impl(*pytree.tree_unflatten(filled, spec))

    traced = make_fx(dense, tracing_mode="fake")(*[_example(n.meta["val"]) for n in tensor_nodes])
    env: dict[torch.fx.Node, Any] = {}
    inputs = iter(tensor_nodes)
    result: Any = None
    with gm.graph.inserting_before(node):
        for sub in traced.graph.nodes:
            if sub.op == "placeholder":
                env[sub] = next(inputs)
            elif sub.op == "output":
                result = torch.fx.map_arg(sub.args[0], lambda n: env[n])
            elif sub.op == "get_attr":
                name = f"_flex_dense_{node.name}_{sub.target}"
                value = getattr(traced, sub.target)
                if isinstance(value, torch.Tensor):
                    gm.register_buffer(name, value)
                else:
                    setattr(gm, name, value)
                env[sub] = gm.graph.get_attr(name)
            else:
                env[sub] = gm.graph.node_copy(sub, lambda n: env[n])
    for user in list(node.users):
        if user.target is operator.getitem:
            user.replace_all_uses_with(result[user.args[1]])
            gm.graph.erase_node(user)
    if node.users:
        node.replace_all_uses_with(gm.graph.call_function(tuple, (list(result),)))
    gm.graph.erase_node(node)


def prepare_flex_attention_for_host(gm: torch.fx.GraphModule) -> int:
    """Rewrites the FlexAttention ops of a neuron graph (with its trace's values) that
    Inductor's host template cannot take; returns how many were decomposed."""
    if not any(n.op == "call_function" and "flex_attention" in str(n.target) for n in gm.graph.nodes):
        return 0
    forward, backward, dense_forward, dense_backward = _hops()
    decomposed = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in (forward, backward):
            continue
        if node.target is forward:
            options = dict(node.args[6])
            if options.get("OUTPUT_LOGSUMEXP") and not options.get("OUTPUT_MAX") and not _output_read(node, 1):
                options["OUTPUT_LOGSUMEXP"] = False  # inference: the fused template serves
                node.args = (*node.args[:6], options, *node.args[7:])
                continue
            if not options.get("OUTPUT_LOGSUMEXP") and not options.get("OUTPUT_MAX"):
                continue
        _inline_dense(gm, node, dense_forward if node.target is forward else dense_backward)
        decomposed += 1
    gm.graph.lint()
    gm.recompile()
    return decomposed
