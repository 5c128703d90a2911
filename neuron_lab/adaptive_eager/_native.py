"""The native half of adaptive eager: the ``adaptive`` submodule of the device's extension.

The runtime's C++ code (``neuron_lab/adaptive_eager/csrc``: the recorder, the graph
cache, the compile queue) is compiled into the same shared library as the device,
``neuron_lab.device._C``, and bound there as ``_C.adaptive``. This module is its one
owner on the Python side: ``stats``, ``modes`` and ``compiler`` call ``native.*``,
and the layers above use the public functions of ``neuron_lab.adaptive_eager``,
never the extension itself (``tests/package/test_layers.py`` checks it).
"""

from __future__ import annotations

from neuron_lab.device._C import adaptive as native

__all__ = ["native"]
