"""Registers the native runtime with PyTorch under the name ``neuron``."""

from __future__ import annotations

import threading

from neuron_lab.device import config

__all__ = ["register", "is_registered"]

BACKEND_NAME = "neuron"
# Re-entrant: `import torch` inside register() may autoload the device, which
# calls register() again on the same thread before the outer call continues.
_lock = threading.RLock()
_registered = False


def is_registered() -> bool:
    """Whether ``register()`` has run in this process."""
    return _registered


def _load_extension():
    """Loading the extension registers the allocator, guard, hooks and kernels."""
    try:
        from neuron_lab.device import _C
    except ImportError as e:
        raise ImportError(
            "neuron_lab's native runtime (neuron_lab.device._C) is not built, or was built for "
            f"another torch ({e}). Build it with `bash scripts/setup.sh` from the neuron_lab "
            "checkout (or `pip install --no-build-isolation -e .`)."
        ) from e
    return _C


def register() -> None:
    """Makes the ``neuron`` device available to PyTorch. Safe to call more than once."""
    global _registered
    with _lock:
        if _registered:
            return
        settings = config.from_environment()
        import torch

        if _registered:  # torch's autoload registered the device while importing
            return
        _C = _load_extension()

        _C.configure(settings.num_cores, settings.core_memory)
        torch.utils.rename_privateuse1_backend(BACKEND_NAME)

        from neuron_lab.device import api

        torch._register_device_module(BACKEND_NAME, api)
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
        )
        _registered = True

        from neuron_lab.device.autograd_threads import backward_on_calling_thread

        backward_on_calling_thread()

        from neuron_lab import adaptive_eager

        adaptive_eager.start()
