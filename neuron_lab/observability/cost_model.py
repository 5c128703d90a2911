"""A modelled NeuronCore time for each op and launch, beside the emulated one.

The emulated device runs on the host's CPU: its times say what the host did, not what a
NeuronCore would. This model says what a NeuronCore would take, from each op's FLOPs and
bytes on a roofline, plus a fixed overhead per launch:

    op time     = max(FLOPs / peak FLOP/s of its engine and dtype, bytes / memory bandwidth)
    launch time = launch overhead + the sum of its ops' times

FLOPs come from torch's FLOP counter rules (``torch.utils.flop_counter``: matmuls,
convolutions, attention and their backward passes) where torch has one, and count one
operation per element for other ops (pointwise ops and reductions, on the vector engine);
copies and layout changes move bytes only. Bytes are every tensor an op reads plus every
tensor it writes (in-place results count as read and written), so fused graphs are charged
as if each op went to memory: an upper bound for ops a compiler keeps in on-chip SRAM.

The core is a :class:`CoreSpec`; its defaults are published Trainium2 figures, each with its
source (``CoreSpec.sources``). Set another with ``neuron_lab.observability.cost_model.set_core(...)``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Optional

import torch

__all__ = ["CoreSpec", "OpCost", "TRAINIUM2", "core", "set_core", "op_cost", "cached_op_cost", "launch_cost",
           "modelled_utilisation"]

_NEURON_CORE_V3 = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/neuron-core-v3.html"
_TRAINIUM2 = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/trainium2.html"
_NEURON_CORE_V2 = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/neuron-core-v2.html"


@dataclass(frozen=True, eq=False)
class CoreSpec:
    """One NeuronCore as the model sees it.

    tensor_tflops: the tensor engine's peak per input dtype (matmuls, convolutions, attention).
    vector_tflops: the vector engine's peak (pointwise ops, reductions), any dtype.
    memory_gb_per_s: device memory (HBM) bandwidth of one core, GB/s (1e9 bytes).
    launch_overhead_us: fixed cost of one launch (a graph, an op launched alone, an inline kernel).
    sources: where each figure comes from.
    """

    name: str
    tensor_tflops: Mapping[torch.dtype, float]
    vector_tflops: float
    memory_gb_per_s: float
    launch_overhead_us: float
    sources: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for what, value in (("vector_tflops", self.vector_tflops), ("memory_gb_per_s", self.memory_gb_per_s)):
            if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
                raise ValueError(f"CoreSpec.{what} must be a positive number, got {value!r}")
        if not (isinstance(self.launch_overhead_us, (int, float)) and self.launch_overhead_us >= 0):
            raise ValueError(f"CoreSpec.launch_overhead_us must be >= 0 µs, got {self.launch_overhead_us!r}")
        for dtype, value in self.tensor_tflops.items():
            if not isinstance(dtype, torch.dtype) or not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"CoreSpec.tensor_tflops maps torch dtypes to positive TFLOPS, got {dtype!r}: {value!r}")
        object.__setattr__(self, "tensor_tflops", MappingProxyType(dict(self.tensor_tflops)))
        object.__setattr__(self, "sources", MappingProxyType(dict(self.sources)))

    def tensor_peak(self, dtype: Optional[torch.dtype]) -> float:
        """FLOP/s of the tensor engine for inputs of ``dtype`` (FP32's figure for dtypes it does not list)."""
        tflops = self.tensor_tflops.get(dtype) if dtype is not None else None
        if tflops is None:
            tflops = self.tensor_tflops.get(torch.float32, min(self.tensor_tflops.values(), default=self.vector_tflops))
        return tflops * 1e12

    def replace(self, **changes: Any) -> "CoreSpec":
        """A copy with some figures changed (``TRAINIUM2.replace(launch_overhead_us=5)``)."""
        return dataclasses.replace(self, **changes)


# Trainium2: eight NeuronCore-v3 per chip sharing 2.9 TB/s of HBM, so a core's share is 2.9/8 TB/s.
TRAINIUM2 = CoreSpec(
    name="Trainium2 NeuronCore-v3",
    tensor_tflops={
        torch.float8_e4m3fn: 158.0, torch.float8_e5m2: 158.0,  # cFP8
        torch.bfloat16: 79.0, torch.float16: 79.0,
        torch.float32: 181.0 / 8,  # FP32: 181 TFLOPS per chip
    },
    vector_tflops=2.3,
    memory_gb_per_s=2900.0 / 8,
    launch_overhead_us=15.0,
    sources={
        "tensor_tflops": f"{_NEURON_CORE_V3} (Tensor Engine: 158 cFP8, 79 BF16/FP16/TF32 TFLOPS); "
                         f"FP32: {_TRAINIUM2} (181 FP32 TFLOPS per chip of 8 cores)",
        "vector_tflops": f"{_NEURON_CORE_V2} (Vector Engine: 2.3 FP32 TFLOPS; AWS publishes no NeuronCore-v3 figure)",
        "memory_gb_per_s": f"{_TRAINIUM2} (96 GiB of HBM at 2.9 TB/s per chip of 8 cores)",
        "launch_overhead_us": "an assumption: AWS publishes no per-launch figure; 15 µs is the order of a "
                              "device launch through a runtime queue. Set it from a measurement of your own.",
    },
)

_core = TRAINIUM2


def core() -> CoreSpec:
    """The core description the profiler models with now."""
    return _core


def set_core(spec: CoreSpec) -> CoreSpec:
    """Models with ``spec`` from now on; returns the previous one."""
    global _core
    if not isinstance(spec, CoreSpec):
        raise TypeError(f"set_core takes a CoreSpec (e.g. TRAINIUM2.replace(...)), got {type(spec).__name__}")
    previous, _core = _core, spec
    return previous


@dataclass(frozen=True)
class OpCost:
    """What the model says of one op: its FLOPs, bytes moved and modelled time, and which
    engine's peak bounds it (``tensor``, ``vector`` or ``memory`` for copies)."""

    flops: float
    bytes: float
    modelled_ns: float
    engine: str
    peak_flops: float  # FLOP/s of that engine (0 for copies)

    @property
    def utilisation(self) -> float:
        """FLOPs over what the engine could do in the modelled time (0..1)."""
        return modelled_utilisation(self.flops, self.modelled_ns, self.peak_flops)


def modelled_utilisation(flops: float, modelled_ns: float, peak_flops: float) -> float:
    """``flops`` over what ``peak_flops`` does in ``modelled_ns`` (0 when either is 0)."""
    if modelled_ns <= 0 or peak_flops <= 0:
        return 0.0
    return min(1.0, flops / (peak_flops * modelled_ns * 1e-9))


# Ops that move data and compute nothing.
_MOVES = frozenset({
    "aten::copy_", "aten::_to_copy", "aten::clone", "aten::contiguous", "aten::cat", "aten::stack",
    "aten::index_select", "aten::gather", "aten::scatter", "aten::embedding", "aten::fill_", "aten::zero_",
    "aten::zeros_like", "aten::ones_like", "aten::empty_like", "aten::expand_copy", "aten::permute_copy",
    "aten::_unsafe_view", "aten::view", "aten::t", "aten::transpose", "aten::slice", "aten::select",
    "aten::detach", "aten::alias", "aten::unsqueeze", "aten::squeeze", "aten::_reshape_alias", "aten::as_strided",
    "aten::index", "aten::index_put_", "aten::masked_fill_", "aten::where", "aten::constant_pad_nd",
})


def _is_tensor(value: Any) -> bool:
    return isinstance(value, tuple) and len(value) == 3 and value[0] == "tensor"


def _numel(value: Any) -> int:
    return math.prod(value[2]) if _is_tensor(value) else 0


def _nbytes(value: Any) -> int:
    if not _is_tensor(value):
        return 0
    dtype: torch.dtype = value[1]
    return _numel(value) * dtype.itemsize


def _as_flop_counter_arg(value: Any) -> Any:
    """What torch's FLOP formulas get for an argument: a tensor's shape in its place."""
    if _is_tensor(value):
        return torch.Size(value[2])
    if isinstance(value, tuple) and value and value[0] in ("tensors", "other"):
        return None
    return value


def _overload(name: str, overload: str):
    """torch's ``OpOverload`` for ``aten::name.overload`` and its packet (None if unknown)."""
    namespace, _, op = name.partition("::")
    try:
        packet = getattr(getattr(torch.ops, namespace), op) if op else None
        return getattr(packet, overload or "default"), packet
    except (AttributeError, RuntimeError):
        return None, None


# Ops that write their first argument without reading it.
_OVERWRITES = frozenset({"aten::copy_", "aten::fill_", "aten::zero_", "aten::normal_", "aten::uniform_",
                         "aten::bernoulli_", "aten::random_"})


def _reads(name: str, schema, args: Sequence[Any]) -> list[Any]:
    """The arguments an op reads: not an ``out=`` buffer, nor what it overwrites whole."""
    read = []
    for i, value in enumerate(args):
        argument = schema.arguments[i] if schema is not None and i < len(schema.arguments) else None
        writes = argument is not None and argument.alias_info is not None and argument.alias_info.is_write
        if writes and (argument.name == "out" or (i == 0 and name in _OVERWRITES)):
            continue
        read.append(value)
    return read


def op_cost(name: str, overload: str, args: Sequence[Any], results: Sequence[Any],
            spec: Optional[CoreSpec] = None) -> OpCost:
    """The modelled cost of one recorded op (``args``/``results`` as ``OpCall`` keeps them:
    a tensor is ``("tensor", dtype, shape)``)."""
    from torch.utils.flop_counter import flop_registry

    spec = spec or _core
    op, packet = _overload(name, overload)
    schema = getattr(op, "_schema", None)
    read = sum(_nbytes(a) for a in _reads(name, schema, args))
    written = sum(_nbytes(r) for r in results)
    moved = float(read + written)
    bandwidth = spec.memory_gb_per_s * 1e9
    flops: Optional[float] = None
    rule = flop_registry.get(op) or flop_registry.get(packet)
    if rule is not None:
        shapes = [torch.Size(r[2]) for r in results if _is_tensor(r)]
        out_shape = shapes[0] if len(shapes) == 1 else tuple(shapes)
        positional, keywords = [], {}
        for i, value in enumerate(args):  # keyword-only arguments (addmm's beta, alpha) by name
            argument = schema.arguments[i] if schema is not None and i < len(schema.arguments) else None
            if argument is not None and argument.kwarg_only:
                keywords[argument.name] = _as_flop_counter_arg(value)
            else:
                positional.append(_as_flop_counter_arg(value))
        try:
            flops = float(rule(*positional, out_val=out_shape, **keywords))
        except Exception:  # noqa: BLE001 - a rule that does not fit these arguments: count elements
            flops = None
    if flops is not None:
        dtype = next((a[1] for a in args if _is_tensor(a)), None)
        peak, engine = spec.tensor_peak(dtype), "tensor"
    elif name in _MOVES:
        flops, peak, engine = 0.0, 0.0, "memory"
    else:
        flops = float(max([_numel(v) for v in (*args, *results)], default=0))
        peak, engine = spec.vector_tflops * 1e12, "vector"
    compute_ns = flops / peak * 1e9 if peak > 0 else 0.0
    memory_ns = moved / bandwidth * 1e9
    return OpCost(flops=flops, bytes=moved, modelled_ns=max(compute_ns, memory_ns), engine=engine, peak_flops=peak)


def launch_cost(ops: Sequence[OpCost], spec: Optional[CoreSpec] = None) -> OpCost:
    """A launch: the overhead, then its ops one after the other."""
    spec = spec or _core
    flops = sum(o.flops for o in ops)
    peak = max((o.peak_flops for o in ops), default=0.0)
    engines = {o.engine for o in ops}
    return OpCost(flops=flops, bytes=sum(o.bytes for o in ops),
                  modelled_ns=spec.launch_overhead_us * 1e3 + sum(o.modelled_ns for o in ops),
                  engine=engines.pop() if len(engines) == 1 else "mixed", peak_flops=peak)


_memo: dict = {}


def _hashable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    return value


def cached_op_cost(name: str, overload: str, args: Sequence[Any], results: Sequence[Any],
                   spec: Optional[CoreSpec] = None) -> OpCost:
    """``op_cost``, remembered per op, arguments' shapes and core (a training step repeats them)."""
    spec = spec or _core
    key = (spec, name, overload, _hashable(args), _hashable(results))
    cost = _memo.get(key)
    if cost is None:
        cost = op_cost(name, overload, args, results, spec)
        if len(_memo) > 100_000:
            _memo.clear()
        _memo[key] = cost
    return cost
