"""The ``neuron`` PyTorch device: a PrivateUse1 backend on emulated NeuronCores.

Importing this package (or just ``import torch``, through the ``torch.backends``
entry point) registers the device: ``torch.device("neuron:1")``, ``tensor.neuron()``,
``module.neuron()``, the CUDA-like module ``torch.neuron`` and ``torch.accelerator``
support. The native runtime (allocator, guard, streams, RNG, op fallback) lives in
the C++ extension ``neuron_lab.device._C``; see ``csrc/runtime.h`` for its map.
"""

from __future__ import annotations

__all__ = ["register"]


def _autoload() -> None:
    """Entry point of the ``torch.backends`` group: called by ``import torch``.

    A device that cannot load (extension not built, bad NEURON_LAB_* variable)
    must not break ``import torch``: it warns, and ``import neuron_lab`` raises.
    """
    try:
        register()
    except (ImportError, ValueError) as e:
        import warnings

        warnings.warn(f"the neuron device was not loaded: {e}", RuntimeWarning, stacklevel=2)


from neuron_lab.device.registration import register  # noqa: E402  (after _autoload: see registration)

register()
