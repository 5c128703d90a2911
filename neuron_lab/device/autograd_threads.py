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

__all__ = ["backward_on_calling_thread", "is_backward_on_calling_thread", "drain_device_threads"]


def backward_on_calling_thread(enabled: bool = True) -> None:
    """Runs this thread's backward passes on this thread (``False``: on autograd's device threads)."""
    import torch  # here, not at the top: `import torch` autoloads the device, which imports this module

    torch._C._set_multithreading_enabled(not enabled)


def is_backward_on_calling_thread() -> bool:
    """Whether this thread's backward passes run on this thread."""
    import torch

    return not torch._C._is_multithreading_enabled()


def drain_device_threads() -> None:
    """Lets autograd's neuron device threads finish what they still hold (at exit).

    torch 2.13's ``backward()`` stashes a ``contextvars`` context (a Python object) in the
    thread-local state that each backward pass copies. A device thread drops its
    reference to a finished pass after the caller has returned; when that is the last
    reference and the interpreter is already finalizing, the drop takes the GIL, Python
    ends the thread with ``pthread_exit``, and the unwinding through a ``noexcept``
    destructor aborts the process ("terminate called without an active exception",
    about 1 exit in 12 of four threads training). Running one more pass on each device
    thread waits until every earlier pass is dropped (the engine's thread takes a task only
    after it has let go of the one before); that pass is made in C++, with no Python
    object for the device thread to let go of in turn. Called at exit, before
    finalization starts."""
    import torch

    if not torch.neuron.is_initialized() or not _autograd_device_threads_started():
        return  # starting them now, while Python finalizes, would itself abort
    from neuron_lab.device import _C

    _C.drain_autograd_device_threads()


def _autograd_device_threads_started() -> bool:
    """Whether autograd has started its device threads in this process (they are named
    ``pt_autograd_<n>``; Linux lists each thread's name under /proc/self/task)."""
    import os

    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/comm") as comm:
                if comm.read().startswith("pt_autograd_"):
                    return True
    except OSError:
        return True  # cannot tell: drain them, as if they ran
    return False
