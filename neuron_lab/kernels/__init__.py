"""Custom kernels for the neuron device, written in Python (see ``docs/kernels.md``).

``kernel(name)`` turns a function over CPU tensors (the host's view of device memory) into a
``torch.library.custom_op`` named ``neuron_lab::<name>``: on neuron tensors it runs as one
inline launch over device memory (a fusion boundary in adaptive mode), on CPU tensors it runs
as is, and ``torch.compile`` traces it through its fake implementation without a graph break.

Examples shipped here, each a fused forward kernel and a fused backward kernel:
``rms_norm(x, weight=None, eps=None)`` and ``softmax_cross_entropy(logits, target)``.
"""

from __future__ import annotations

from neuron_lab.kernels._kernel import NAMESPACE, Kernel, kernel
from neuron_lab.kernels.cross_entropy import (
    softmax_cross_entropy,
    softmax_cross_entropy_backward,
    softmax_cross_entropy_forward,
)
from neuron_lab.kernels.rms_norm import rms_norm, rms_norm_backward, rms_norm_forward

__all__ = [
    "NAMESPACE",
    "Kernel",
    "kernel",
    "rms_norm",
    "rms_norm_forward",
    "rms_norm_backward",
    "softmax_cross_entropy",
    "softmax_cross_entropy_forward",
    "softmax_cross_entropy_backward",
]
