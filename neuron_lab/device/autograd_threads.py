"""Where backward passes run: on the thread that calls ``backward()``, not on a device thread.

PyTorch's autograd engine hands the backward nodes of every non-CPU device to a worker
thread of that device while the calling thread waits. On a real accelerator that thread
only launches kernels. On the emulated NeuronCore the kernels run on host cores, so the
worker is one more thread competing for the same cores: every backward costs two thread
hand-offs, and on small machines the step's working set (weights, activations) moves
between core caches when forward and backward run on different cores. Measured on the
2-core CI machine, an MLP training step under ``torch.compile(backend="neuron")`` went
from 1.6x to 1.1x of CPU ``torch.compile`` with backward on the calling thread.

``register()`` therefore disables autograd's device threads for the thread that loads
the device (and ``%load_ext neuron_lab`` for the notebook's execution thread). PyTorch
keeps this setting per thread (``torch.autograd.set_multithreading_enabled``): other
threads keep the device threads unless they call ``backward_on_calling_thread()``, and
a ``with torch.autograd.set_multithreading_enabled(True):`` block restores them locally.
Semantics do not change: the engine orders work by streams either way; CPU backward
always ran on the calling thread.
"""

from __future__ import annotations

__all__ = ["backward_on_calling_thread", "is_backward_on_calling_thread"]


def backward_on_calling_thread(enabled: bool = True) -> None:
    """Runs this thread's backward passes on this thread (``False``: on autograd's device threads)."""
    import torch  # here, not at the top: `import torch` autoloads the device, which imports this module

    torch._C._set_multithreading_enabled(not enabled)


def is_backward_on_calling_thread() -> bool:
    """Whether this thread's backward passes run on this thread."""
    import torch

    return not torch._C._is_multithreading_enabled()
