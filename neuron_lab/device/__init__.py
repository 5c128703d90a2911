"""The ``neuron`` PyTorch device: a PrivateUse1 backend on emulated NeuronCores.

Importing this package (or just ``import torch``, through the ``torch.backends``
entry point in ``_neuron_lab_autoload``) registers the device: ``torch.device("neuron:1")``, ``tensor.neuron()``,
``module.neuron()``, the CUDA-like module ``torch.neuron`` and ``torch.accelerator``
support. The native runtime (allocator, guard, streams, RNG, op fallback) lives in
the C++ extension ``neuron_lab.device._C``; see ``csrc/runtime/runtime.h`` for its layout.
"""

from __future__ import annotations

__all__ = ["register", "backward_on_calling_thread", "is_backward_on_calling_thread"]


from neuron_lab.device.autograd_threads import backward_on_calling_thread, is_backward_on_calling_thread
from neuron_lab.device.registration import register

register()
