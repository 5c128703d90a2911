"""torch.compile for the neuron device: the ``"neuron"`` Dynamo backend and
Dynamo's device interface for ``neuron``.

The backend is found by name through the ``torch_dynamo_backends`` entry point,
so ``import torch`` stays fast: ``torch.compile(fn, backend="neuron")``,
``torch.compiler.set_default_backend("neuron")``, ``torch.compiler.list_backends()``.
"""

from neuron_lab.compile.backend import compiled_graphs, neuron_backend

__all__ = ["neuron_backend", "compiled_graphs"]
