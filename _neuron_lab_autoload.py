"""Loads the neuron device when ``import torch`` runs (the ``torch.backends`` entry point).

It lives outside the ``neuron_lab`` package on purpose: importing anything inside the
package runs the package's own registration, and a device that cannot load (C++
extension not built, a bad ``NEURON_LAB_*`` variable) must never break ``import torch``.
Here that becomes a warning; ``import neuron_lab`` raises the error itself.
Set ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` to skip loading altogether.
"""

from __future__ import annotations

import warnings


def autoload() -> None:
    """Registers the ``neuron`` device, or warns why it cannot."""
    try:
        from neuron_lab.device.registration import register

        register()
    except Exception as e:  # noqa: BLE001 - whatever fails, `import torch` must not
        warnings.warn(f"the neuron device was not loaded: {e}", RuntimeWarning, stacklevel=2)
