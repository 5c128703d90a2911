"""The native half of the fast path: the ``fast_path`` submodule of the device's extension.

The kernels (``neuron_lab/fastpath/csrc``) are compiled into the same shared library as the
device, ``neuron_lab.device._C``, and bound there as ``_C.fast_path``. This module is its one
owner on the Python side; the rest of the package calls ``native.*`` (``tests/package/test_layers.py``
checks it).
"""

from __future__ import annotations

from neuron_lab.device._C import fast_path as native

__all__ = ["native"]
