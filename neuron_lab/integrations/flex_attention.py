"""FlexAttention on neuron tensors.

``torch.nn.attention.flex_attention`` checks the device of its inputs against a fixed
list (CUDA, CPU, XPU, HPU, MPS) before anything else. Its eager implementation (the
higher-order op's dense decomposition: scores, ``score_mod`` and ``mask_mod`` through
vmap, softmax, and a dense backward) is written in device-generic ATen ops, so on neuron
it runs as any other ops do, recorded by adaptive eager, with the CPU's numbers, forward
and backward. Under ``torch.compile`` the graph runs through the neuron backend (async
launches, or TorchInductor's C++ template for the host), never Triton.
"""

from __future__ import annotations

from types import ModuleType

__all__ = ["accept_neuron_tensors"]


def accept_neuron_tensors(module: ModuleType) -> None:
    """Makes ``module`` (``torch.nn.attention.flex_attention``) accept neuron inputs."""
    original = module._validate_device
    if getattr(original, "_neuron_lab", False):
        return

    def _validate_device(query, key, value) -> None:  # noqa: ANN001 - FlexAttention's signature
        if query.device.type == "neuron":
            return  # the dense implementation runs on the device, backward included
        original(query, key, value)

    _validate_device._neuron_lab = True  # type: ignore[attr-defined]
    _validate_device.__doc__ = original.__doc__
    module._validate_device = _validate_device
