"""Registers the native runtime with PyTorch under the name ``neuron``.

``register()`` runs at ``import torch`` and does only what ``torch.device("neuron")``
needs. What may wait until the device is really used (the layers above, integrations
with other libraries) registers with ``on_first_use``: PyTorch calls
``torch.neuron._lazy_init()`` when the first neuron tensor is made, as it does for CUDA.
"""

from __future__ import annotations

import atexit
import threading
from typing import Callable

from neuron_lab.device import config, launches

__all__ = ["register", "is_registered", "on_first_use", "first_use"]

BACKEND_NAME = "neuron"
# Re-entrant: `import torch` inside register() may autoload the device, which
# calls register() again on the same thread before the outer call continues.
_lock = threading.RLock()
_registered = False


_first_use_lock = threading.RLock()
_first_use_callbacks: list[Callable[[], None]] = []
_first_use_done = False


def on_first_use(callback: Callable[[], None]) -> None:
    """Calls ``callback()`` when the device is first used, or now if it already was."""
    with _first_use_lock:
        if not _first_use_done:
            _first_use_callbacks.append(callback)
            return
    callback()


def first_use() -> None:
    """Runs the ``on_first_use`` callbacks, once (``torch.neuron._lazy_init``)."""
    global _first_use_done
    with _first_use_lock:
        if _first_use_done:
            return
        _first_use_done = True
        callbacks, _first_use_callbacks[:] = list(_first_use_callbacks), []
    for callback in callbacks:
        callback()


def is_registered() -> bool:
    """Whether ``register()`` has run in this process."""
    return _registered


def _library_prefixes() -> list[str]:
    """Where library code lives (torch, neuron_lab, the standard library, and the notebook's
    machinery: IPython, ipykernel): the user's line of an op, a launch or a wait is the first
    frame outside them (never IPython's run_cell_magic)."""
    import importlib.util
    import os
    import sysconfig

    import torch

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # neuron_lab/
    prefixes = [os.path.dirname(torch.__file__) + os.sep, package + os.sep, sysconfig.get_paths()["stdlib"] + os.sep]
    for name in ("IPython", "ipykernel"):  # found without importing them
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            prefixes.append(os.path.dirname(spec.origin) + os.sep)
    return prefixes


def _check_torch_version() -> None:
    """The extension runs only with the torch it was built against: say so, with both
    versions, before loading it fails with an undefined C++ symbol."""
    try:
        from neuron_lab.device._built_with import TORCH_VERSION as built_with
    except ImportError:  # not built yet: loading the extension says so
        return
    import torch

    if built_with != torch.__version__:
        raise ImportError(
            f"neuron_lab's native runtime was built against torch {built_with}, but this is torch "
            f"{torch.__version__}. Rebuild it against this torch: `pip install .` (or `pip install -e .`) "
            "in the neuron_lab checkout builds it against the torch of the environment it installs into; "
            "in a source checkout, `python setup.py build_ext --inplace` (or `bash scripts/setup.sh`). "
            f"Or install torch {built_with}."
        )


def _load_extension():
    """Loading the extension registers the allocator, guard, hooks and kernels."""
    _check_torch_version()
    try:
        from neuron_lab.device import _C
    except ImportError as e:
        raise ImportError(
            "neuron_lab's native runtime (neuron_lab.device._C) is not built, or was built for "
            f"another torch ({e}). Build it from the neuron_lab checkout: `pip install .` (or "
            "`pip install -e .`), `python setup.py build_ext --inplace` in place, or `bash scripts/setup.sh`."
        ) from e
    return _C


def _initialize_vector_math() -> None:
    """Makes this thread the first in the process to call MKL's vector math (VML).

    torch's CPU build computes tanh, exp, log, sin and more with MKL's VML, which sets
    itself up at its first call. When that first call is made by two OpenMP threads at
    once (a parallel tanh of a large tensor, the first VML op of a process), the worker
    thread's part comes out at VML's low-accuracy setting: tanh up to 5.2e-5 off, in
    about 1 of 4 fresh processes on a 2-core machine (MKL 2024.2, torch 2.13). The
    device's host kernels and a user's CPU reference are both such calls, so either
    could be wrong. One call on one element, here, sets VML up first (~0.5 ms, which the
    process's first VML op would otherwise pay)."""
    import torch

    torch.tanh(torch.zeros(1))


def register() -> None:
    """Makes the ``neuron`` device available to PyTorch. Safe to call more than once."""
    global _registered
    with _lock:
        if _registered:
            return
        settings = config.from_environment()
        runner = launches.from_environment()
        import torch

        if _registered:  # torch's autoload registered the device while importing
            return
        _C = _load_extension()
        _initialize_vector_math()

        _C.configure(settings.num_cores, settings.core_memory)
        _C.set_launch_runner(runner.value)
        _C.trace.set_library_prefixes(_library_prefixes())
        torch.utils.rename_privateuse1_backend(BACKEND_NAME)

        from neuron_lab.device import api

        torch._register_device_module(BACKEND_NAME, api)
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
        )
        _registered = True

        from neuron_lab.device.autograd_threads import backward_on_calling_thread, drain_device_threads

        # The thread that first uses the device runs its backward passes (see autograd_threads).
        on_first_use(backward_on_calling_thread)
        # Other threads' passes run on autograd's device threads, which must let go of them
        # before the interpreter finalizes (see drain_device_threads).
        on_first_use(lambda: atexit.register(drain_device_threads))
        # The current core's device thread starts with the first tensor, and sets itself up
        # while the host goes on, not when the first launch waits for it.
        on_first_use(lambda: _C.start_device_thread(int(torch.neuron.current_device())))
        from neuron_lab.device import late_errors, serialization, sharing, tensor_repr

        # A script's uncaught late device error is shown at the line that recorded its op.
        on_first_use(late_errors.install_excepthook)

        on_first_use(serialization.install)
        on_first_use(sharing.install)
        on_first_use(tensor_repr.install)
