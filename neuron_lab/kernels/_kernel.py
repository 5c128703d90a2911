"""``neuron_lab.kernels.kernel``: a custom op whose body runs as one inline launch over device memory.

A kernel is a ``torch.library.custom_op`` in the ``neuron_lab`` namespace with three
implementations:

* CPU: the body itself, on CPU tensors;
* neuron: outputs are allocated on the inputs' neuron device with the metadata the fake
  impl gives, every launch that uses the inputs or outputs is waited for (a fusion boundary
  in adaptive mode), and the body runs on CPU aliases of device memory (no copies) inside
  one inline launch named after the kernel; its results are copied into the outputs;
* fake (Meta, FakeTensor): the user's ``register_fake`` function, after a device check, so
  that ``torch.compile`` traces the kernel into a graph without a break.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Optional, Union

import torch
from torch.utils import _pytree as pytree

__all__ = ["Kernel", "kernel", "NAMESPACE"]

NAMESPACE = "neuron_lab"


def _native():
    """The device's host-kernel API (imported at the first neuron call, not at import)."""
    from neuron_lab.device import host_kernels

    return host_kernels


def _qualname(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"neuron_lab.kernels.kernel: a kernel needs a name such as 'rms_norm', got {name!r}")
    if "::" in name:
        namespace, _, op = name.partition("::")
        if not namespace or not op or "::" in op:
            raise ValueError(f"neuron_lab.kernels.kernel: {name!r} is not a valid name; use 'my_op' "
                             f"(it becomes '{NAMESPACE}::my_op') or 'namespace::my_op'")
        return name
    return f"{NAMESPACE}::{name}"


class Kernel:
    """A neuron kernel: call it like the function it decorates.

    Attributes: ``name`` (``"neuron_lab::<name>"``, also the launch's name in the profiler),
    ``body`` (the CPU function), ``op`` (the ``torch.library.CustomOpDef``), ``opoverload``
    (``torch.ops.neuron_lab.<name>.default``), ``mutates_args``.
    """

    def __init__(self, name: str, body: Callable, *, mutates_args: Union[str, Iterable[str]] = (),
                 schema: Optional[str] = None, fake: Optional[Callable] = None) -> None:
        if not callable(body):
            raise TypeError(f"neuron_lab.kernels.kernel({name!r}): decorate a function, got {body!r}")
        self.name = _qualname(name)
        self.body = body
        self._signature = inspect.signature(body)
        if isinstance(mutates_args, str):
            if mutates_args != "unknown":
                raise ValueError(f"{self.name}: mutates_args is a tuple of argument names (or 'unknown'), "
                                 f"got the string {mutates_args!r}; write ({mutates_args!r},)")
            self.mutates_args: Union[str, tuple[str, ...]] = "unknown"
        else:
            self.mutates_args = tuple(mutates_args)
            unknown = [a for a in self.mutates_args if a not in self._signature.parameters]
            if unknown:
                raise ValueError(f"{self.name}: mutates_args names {unknown}, which are not arguments of "
                                 f"{body.__name__}{self._signature}")
        # A second definition under the same name replaces the first (re-running a notebook cell).
        self.op = torch.library.custom_op(self.name, body, mutates_args=self.mutates_args,
                                          device_types="cpu", schema=schema)
        self.opoverload = self.op._opoverload
        self.op.register_kernel("neuron", self._neuron_impl)
        self._fake: Optional[Callable] = None
        self._has_returns = len(self.opoverload._schema.returns) > 0
        self.op.register_fake(self._checked_fake)  # FakeTensor and Meta: the device check, then the user's
        functools.update_wrapper(self, body)
        if fake is not None:
            self.register_fake(fake)
        elif not self._has_returns:
            # A kernel that only writes into its arguments: nothing to describe.
            self.register_fake(lambda *args, **kwargs: None)

    # ---- registration ---------------------------------------------------------------

    def register_fake(self, fn: Callable, /) -> Callable:
        """Registers the fake (meta) implementation: given inputs that carry no data, return
        outputs with the right shapes, strides and dtypes (``torch.empty_like``,
        ``x.new_empty(...)``). The neuron implementation allocates its outputs from it, and
        ``torch.compile`` traces with it. Use as a decorator; returns ``fn``."""
        if not callable(fn):
            raise TypeError(f"{self.name}.register_fake: expected a function, got {fn!r}")
        self._fake = fn
        return fn

    def _checked_fake(self, *args, **kwargs):
        if self._fake is None:
            raise self._missing_fake_error()
        self._check_devices(self._tensor_args(args, kwargs))
        return self._fake(*args, **kwargs)

    def register_autograd(self, backward: Callable, /, *, setup_context: Optional[Callable] = None) -> None:
        """Registers the backward formula, as ``torch.library.custom_op``'s
        ``register_autograd``: ``setup_context(ctx, inputs, output)`` saves what backward
        needs; ``backward(ctx, *grads)`` returns one gradient (or None) per input. Call other
        kernels in ``backward`` to make the backward pass one launch too."""
        self.op.register_autograd(backward, setup_context=setup_context)

    # ---- calling --------------------------------------------------------------------------

    def __call__(self, *args, **kwargs):
        if self._fake is None and not torch.compiler.is_compiling():  # (torch.compile: the fake impl raises it)
            raise self._missing_fake_error()
        return self.opoverload(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<neuron_lab kernel {self.name}{self._signature}>"

    def _missing_fake_error(self) -> RuntimeError:
        return RuntimeError(
            f"{self.name} has no fake implementation. A kernel needs one to know its outputs' shapes and "
            f"dtypes (the neuron device allocates them from it, torch.compile traces with it). Add:\n"
            f"    @{self.body.__name__}.register_fake\n"
            f"    def _({', '.join(self._signature.parameters)}):\n"
            f"        return torch.empty_like(...)  # outputs with the right shapes, no data\n"
            f"or pass fake=... to neuron_lab.kernels.kernel({self.name.split('::', 1)[1]!r}, ...).")

    # ---- arguments and devices ------------------------------------------------------------

    def _tensor_args(self, args: Sequence[Any], kwargs: dict) -> list[tuple[str, torch.Tensor]]:
        """(argument name, tensor) for every tensor argument, list elements included."""
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError:
            names = [f"arg{i}" for i in range(len(args))] + list(kwargs)
            values = list(args) + list(kwargs.values())
        else:
            names, values = list(bound.arguments), list(bound.arguments.values())
        found = []
        for name, value in zip(names, values):
            if isinstance(value, torch.Tensor):
                found.append((name, value))
            elif isinstance(value, (list, tuple)):
                found.extend((f"{name}[{i}]", v) for i, v in enumerate(value) if isinstance(v, torch.Tensor))
        return found

    def _written_names(self) -> Optional[set]:
        return None if self.mutates_args == "unknown" else set(self.mutates_args)

    def _check_devices(self, tensors: list[tuple[str, torch.Tensor]]) -> Optional[torch.device]:
        """The one device of the tensor arguments (0-dim CPU tensors mix with any device, as
        with CUDA); raises naming both devices otherwise."""
        first: Optional[tuple[str, torch.device]] = None
        for name, t in tensors:
            device = t.device
            if device.type == "cpu" and t.dim() == 0:
                continue
            if first is None:
                first = (name, device)
            elif device != first[1]:
                raise RuntimeError(
                    f"{self.name}: expected all tensors on one device, but '{first[0]}' is on {first[1]} and "
                    f"'{name}' is on {device}. Move them to one device first (e.g. {name}.to('{first[1]}')).")
        return None if first is None else first[1]

    # ---- the neuron implementation ----------------------------------------------------------

    def _neuron_impl(self, *args, **kwargs):
        K = _native()
        if self._fake is None:
            raise self._missing_fake_error()
        tensors = self._tensor_args(args, kwargs)
        device = self._check_devices(tensors)
        if device is None or device.type != "neuron":
            device = next(t.device for _, t in tensors if t.device.type == "neuron")

        # Outputs: the fake impl's metadata, on the inputs' device.
        to_meta = lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")  # noqa: E731
        meta_args, meta_kwargs = pytree.tree_map_only(torch.Tensor, to_meta, (args, kwargs))
        try:
            meta_out = self._fake(*meta_args, **meta_kwargs)
        except RuntimeError as e:
            if "get_ctx" in str(e) or "data-dependent" in str(e):
                raise NotImplementedError(
                    f"{self.name}: its fake implementation gives outputs whose shape depends on data; neuron "
                    f"kernels need output shapes computable from the inputs' shapes") from e
            raise
        meta_leaves, out_spec = pytree.tree_flatten(meta_out)
        out_leaves = [torch.empty_strided(m.shape, m.stride(), dtype=m.dtype, device=device)
                      if isinstance(m, torch.Tensor) else m for m in meta_leaves]
        outputs = [t for t in out_leaves if isinstance(t, torch.Tensor)]

        neuron_args = [(n, t) for n, t in tensors if t.device.type == "neuron"]
        written = self._written_names()
        mutated = [t for n, t in neuron_args if written is None or n.split("[", 1)[0] in written]
        reads = [t for _, t in neuron_args]
        writes = outputs + mutated
        K.prepare_host_access(reads, writes, self.name)

        alias = lambda t: K.host_alias(t) if t.device.type == "neuron" else t  # noqa: E731
        host_args, host_kwargs = pytree.tree_map_only(torch.Tensor, alias, (args, kwargs))
        with K.InlineLaunch(device.index, self.name):
            result = self.body(*host_args, **host_kwargs)
            result_leaves, result_spec = pytree.tree_flatten(result)
            if result_spec != out_spec:
                raise RuntimeError(f"{self.name}: the kernel returned {_describe(result)} but its fake "
                                   f"implementation returns {_describe(meta_out)}")
            for i, (out, value, meta) in enumerate(zip(out_leaves, result_leaves, meta_leaves)):
                if not isinstance(meta, torch.Tensor):
                    out_leaves[i] = value
                    continue
                if not isinstance(value, torch.Tensor) or value.shape != meta.shape or value.dtype != meta.dtype:
                    raise RuntimeError(
                        f"{self.name}: output {i} of the kernel is {_describe(value)} but its fake "
                        f"implementation says {_describe(meta)}; make them agree")
                K.host_alias(out).copy_(value)
        K.note_written(writes)
        return pytree.tree_unflatten(out_leaves, out_spec)


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {list(value.shape)}"
    if isinstance(value, (list, tuple)):
        kind = "a list" if isinstance(value, list) else "a tuple"
        return f"{kind} of {len(value)} ({', '.join(_describe(v) for v in value)})"
    return "None" if value is None else type(value).__name__


def kernel(name: str, fn: Optional[Callable] = None, /, *, mutates_args: Union[str, Iterable[str]] = (),
           schema: Optional[str] = None, fake: Optional[Callable] = None):
    """Defines a neuron kernel (a ``torch.library.custom_op`` named ``neuron_lab::<name>``).

    Decorate a type-annotated function over CPU tensors (the host's view of device memory)::

        @neuron_lab.kernels.kernel("scale_add")
        def scale_add(x: Tensor, y: Tensor, alpha: float) -> Tensor:
            return x + alpha * y

        @scale_add.register_fake
        def _(x, y, alpha):
            return torch.empty_like(x)

    On neuron tensors the body runs as one inline launch over device memory (a fusion
    boundary in adaptive mode); on CPU tensors it runs as is; under ``torch.compile`` the
    fake implementation is traced. ``mutates_args`` names the arguments the body writes
    into (as in ``torch.library.custom_op``); ``fake`` registers the fake implementation at
    definition (same as ``@k.register_fake``); ``schema`` overrides the inferred schema.
    """

    def define(body: Callable) -> Kernel:
        return Kernel(name, body, mutates_args=mutates_args, schema=schema, fake=fake)

    return define if fn is None else define(fn)
