"""Which op's numbers leave the reference? Runs code twice and walks its ops in order.

``neuron_lab.compare(fn, *args, against="cpu")`` (and ``%%neuron_compare``) runs the code
once as it runs on the device (the *subject*) and once on a reference, records the result
of every op in both runs with the user's line that issued it, pairs the ops in order and
names the first whose result differs from the reference's beyond a tolerance: its line,
shapes and the size of the difference. The references:

==============  ==========================================================================
``cpu``         the same code on the CPU (devices and tensors moved there)
``replay``      adaptive eager's compiled tier (TorchInductor code for the fused graphs)
                against its replay tier (the CPU kernels, op by op): ``configure(compile=...)``
``float32``     the code under ``torch.autocast("neuron", dtype)`` against the same without
``fastpath-off`` the device's fast host kernels off (``neuron_lab.fastpath``: ATen's kernels only)
==============  ==========================================================================

How, in one process: each run gets its own copy of the inputs (``args``, or the variables a
code string reads, copied with ``torch.save``/``torch.load``: the caller's objects are left
as they were), both runs start from the same random seed, and a ``TorchDispatchMode``
keeps a copy of each op's result (forward and backward) without reading it, so the device
runs the code as it would (fused graphs stay fused). Views are not recorded (their values
are their base's). Ops are paired by name, output shapes and line with ``difflib``: ops
that only one run has (autocast's casts, a kernel the CPU picks differently) are listed,
not compared. A result differs when ``max |subject - reference| > atol + rtol * max
|reference|``: the error relative to the tensor's scale, so a value near zero that moved
by rounding does not count (defaults from ``torch.testing`` per dtype; bfloat16's for
autocast).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import difflib
import html
import io
import linecache
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from neuron_lab.device.late_errors import describe_line

__all__ = ["AGAINST", "Comparison", "OpCall", "OpDifference", "compare"]

AGAINST = {
    "cpu": "the CPU: the same code with its devices and tensors moved to the CPU",
    "replay": "adaptive eager's replay tier (CPU kernels op by op) against its compiled tier (TorchInductor)",
    "float32": "float32: the same code without torch.autocast (the subject runs under autocast)",
    "fastpath-off": "the device's fast host kernels switched off (ATen's CPU kernels only)",
}
_DEFAULT_BUDGET_BYTES = 1 << 30  # results kept per run; later ops are not recorded
_SHOWN_DIFFERENCES = 10
# (rtol, atol) per dtype: torch.testing.assert_close's defaults
_TOLERANCES = {
    torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5), torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7), torch.complex64: (1.3e-6, 1e-5), torch.complex128: (1e-7, 1e-7),
}
_COMPILE_WAIT_S = 300.0
_CODE_FILE = "<neuron_lab.compare>"


# ---- what a run records ----------------------------------------------------------------------


@dataclass(frozen=True)
class OpCall:
    """One op of a run: its name (``aten::mul.Tensor``), the user's line that issued it, the
    autograd node it ran for (backward ops), and its outputs' shapes and dtypes."""

    index: int
    name: str
    where: str  # "Cell In[9], line 4" or 'File "x.py", line 4, in f'
    line: int  # in the compared code (0: outside it)
    text: str  # that line's source
    backward_of: str  # "MulBackward0" for an op of the backward pass, else ""
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]

    def key(self, with_dtypes: bool) -> tuple:
        return (self.name, self.shapes, self.line, self.backward_of) + ((self.dtypes,) if with_dtypes else ())

    def describe(self) -> str:
        shapes = ", ".join(f"{d}{list(s)}" for s, d in zip(self.shapes, self.dtypes))
        phase = f" (backward of {self.backward_of})" if self.backward_of else ""
        return f"{self.name}{phase} -> {shapes} at {self.where}" + (f": {self.text}" if self.text else "")


class _Recorder(TorchDispatchMode):
    """Keeps a copy of every op's results (not views), without reading them."""

    def __init__(self, filename: str, budget_bytes: int) -> None:
        super().__init__()
        self.filename = filename
        self.budget = budget_bytes
        self.used = 0
        self.calls: list[OpCall] = []
        self.values: list[list[torch.Tensor]] = []
        self.dropped = 0  # ops not recorded once the budget was spent
        from neuron_lab.device.late_errors import _library_prefixes

        self.library = _library_prefixes()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's signature
        out = func(*args, **(kwargs or {}))
        if _is_view(func):
            return out
        leaves = [x for x in pytree.tree_leaves(out)]
        tensors = [x.detach() if isinstance(x, torch.Tensor) else torch.tensor(x)
                   for x in leaves if isinstance(x, (torch.Tensor, bool, int, float))]
        if not tensors:
            return out
        size = sum(t.numel() * t.element_size() for t in tensors)
        if self.used + size > self.budget:
            self.dropped += 1
            return out
        self.used += size
        node = torch._C._current_autograd_node()
        where, line, text = self._source()
        self.calls.append(OpCall(len(self.calls), func.name(), where, line, text,
                                 type(node).__name__ if node is not None else "",
                                 tuple(tuple(t.shape) for t in tensors),
                                 tuple(str(t.dtype).removeprefix("torch.") for t in tensors)))
        self.values.append([t.clone() for t in tensors])  # recorded by the device like any op: no wait
        return out

    def _source(self) -> tuple[str, int, str]:
        """(where, line in the compared code, that line's text) of the op being dispatched."""
        frame = sys._getframe(2)
        inner = None
        while frame is not None:
            code = frame.f_code
            if code.co_filename == self.filename:
                line = frame.f_lineno
                where = describe_line(code.co_filename, line, code.co_name) if inner is None else inner
                return where, line, linecache.getline(self.filename, line).strip()
            if inner is None and not code.co_filename.startswith(self.library) \
                    and not code.co_filename.startswith("<frozen"):
                inner = describe_line(code.co_filename, frame.f_lineno, code.co_name)
            frame = frame.f_back
        return inner or "outside the compared code", 0, ""


def _is_view(func: Any) -> bool:
    """A view or metadata op: every output aliases an input and none is written."""
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


# ---- the two sides ---------------------------------------------------------------------------


class _OnCPU(TorchFunctionMode):
    """Runs code written for ``neuron`` on the CPU: devices named ``neuron`` become ``cpu``,
    and a neuron tensor from outside the copied inputs is copied to the CPU (once)."""

    def __init__(self) -> None:
        super().__init__()
        self.moved: dict[int, torch.Tensor] = {}

    def _cpu(self, value: Any) -> Any:
        if isinstance(value, torch.device) and value.type == "neuron":
            return torch.device("cpu")
        if isinstance(value, str) and (value == "neuron" or value.startswith("neuron:")):
            return "cpu"
        if isinstance(value, torch.Tensor) and value.device.type == "neuron":
            twin = self.moved.get(id(value))
            if twin is None:
                twin = value.detach().cpu().requires_grad_(value.requires_grad)
                self.moved[id(value)] = twin
            return twin
        return value

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's signature
        args, kwargs = pytree.tree_map(self._cpu, (tuple(args), dict(kwargs or {})))
        return func(*args, **kwargs)


@dataclass
class _Side:
    """How one run is set up: its name, where its inputs live, what wraps it."""

    name: str
    map_location: Optional[str] = None  # "cpu": the inputs are copied to the CPU
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    warm_up: bool = False  # run once before, unrecorded (the compiled tier compiles its graphs)


def _sides(against: str, dtype: torch.dtype) -> tuple[_Side, _Side, list[str]]:
    """(subject, reference, notes) for ``against``."""
    import neuron_lab

    if against == "cpu":
        return _Side("neuron"), _Side("cpu", map_location="cpu", context=_OnCPU), []
    if against == "float32":
        return (_Side(f"autocast {str(dtype).removeprefix('torch.')}",
                      context=lambda: torch.autocast("neuron", dtype=dtype)), _Side("float32"), [])
    if against == "replay":
        @contextlib.contextmanager
        def tier(compiled: bool) -> Iterator[None]:
            with neuron_lab.mode("adaptive"), neuron_lab.configured(
                    compile=compiled, compile_after=1, run_unrepeated_at_once=False, run_at_once_on_host=False):
                try:
                    yield
                finally:
                    torch.neuron.synchronize()

        return (_Side("compiled tier", context=lambda: tier(True), warm_up=True),
                _Side("replay tier", context=lambda: tier(False)),
                ["the compiled tier compiles the graphs of unrecorded runs before the compared one (until a run builds no new graph)"])
    if against == "fastpath-off":
        from neuron_lab import fastpath

        return (_Side(f"fast path {fastpath.get_mode()}"),
                _Side("fast path off", context=lambda: fastpath.mode("off")), [])
    raise ValueError(f"against={against!r}: compare against one of {', '.join(AGAINST)}")


# ---- inputs: copies for each run ------------------------------------------------------------


def _referenced_names(tree: ast.AST, namespace: dict[str, Any]) -> set[str]:
    """Names the code reads from ``namespace``, and those the notebook's functions it calls read."""
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    pending = list(names)
    while pending:
        value = namespace.get(pending.pop())
        if isinstance(value, types.FunctionType) and value.__globals__ is namespace:
            for code in _code_objects(value.__code__):
                for name in code.co_names:
                    if name not in names:
                        names.add(name)
                        pending.append(name)
    return {n for n in names if n in namespace}


def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _copyable(value: Any) -> bool:
    return not isinstance(value, (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType))


class _Inputs:
    """The values a run reads, saved once; each run loads its own copy."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.shared: dict[str, Any] = {}  # not copyable (modules, classes, unpicklable objects): shared
        self.functions: dict[str, types.FunctionType] = {}
        saved: dict[str, Any] = {}
        for name, value in values.items():
            if isinstance(value, types.FunctionType):
                self.functions[name] = value
            elif _copyable(value):
                saved[name] = value
            else:
                self.shared[name] = value
        self.not_copied: list[str] = []
        self.blob = self._save(saved)

    def _save(self, saved: dict[str, Any]) -> bytes:
        buffer = io.BytesIO()
        try:
            torch.save(saved, buffer)  # one pickle: objects that share (a model and its optimizer) still do
            return buffer.getvalue()
        except Exception:  # noqa: BLE001 - find the values that cannot be copied, share them
            pass
        for name in list(saved):
            try:
                torch.save(saved[name], io.BytesIO())
            except Exception:  # noqa: BLE001
                self.shared[name] = saved.pop(name)
                self.not_copied.append(name)
        buffer = io.BytesIO()
        torch.save(saved, buffer)
        return buffer.getvalue()

    def load(self, map_location: Optional[str], namespace: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        """A fresh copy of the values (tensors on ``map_location``, else where they were), with
        the notebook's functions rebound to it."""
        copy = torch.load(io.BytesIO(self.blob), map_location=map_location, weights_only=False)
        out: dict[str, Any] = dict(namespace or {})
        out.update(self.shared)
        out.update(copy)
        for name, fn in self.functions.items():
            if namespace is not None and fn.__globals__ is namespace:
                fn = _rebound(fn, out)
            out[name] = fn
        return out


def _rebound(fn: types.FunctionType, namespace: dict[str, Any]) -> types.FunctionType:
    """``fn`` reading its globals from ``namespace`` (the run's copies) instead of the notebook's."""
    twin = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, fn.__closure__)
    twin.__kwdefaults__ = fn.__kwdefaults__
    twin.__dict__.update(fn.__dict__)
    twin.__qualname__ = fn.__qualname__
    return twin


# ---- comparing ------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpDifference:
    """An op whose result left the reference: the op in both runs and how far apart they are."""

    subject: OpCall
    reference: OpCall
    output: int  # which output of the op
    max_difference: float  # max |subject - reference| (inf: NaN against a number, or shapes differ)
    reference_scale: float  # max |reference|
    at: tuple[int, ...]  # index of the largest difference
    subject_value: float
    reference_value: float
    differing: int  # elements beyond the element-wise tolerance
    numel: int
    rtol: float
    atol: float

    @property
    def relative(self) -> float:
        """The largest difference over the reference's largest magnitude."""
        return self.max_difference / self.reference_scale if self.reference_scale else float("inf")

    def describe(self) -> str:
        where = f" output {self.output}" if self.output else ""
        index = "" if not self.at else f" at {list(self.at)}"
        return (f"{self.subject.describe()}\n  {where.strip() + ': ' if where else ''}max |difference| "
                f"{self.max_difference:.4g}{index} (subject {self.subject_value:.6g}, reference "
                f"{self.reference_value:.6g}), {self.relative:.3g} of the reference's largest magnitude "
                f"{self.reference_scale:.4g}; {self.differing} of {self.numel} elements differ beyond "
                f"rtol={self.rtol:g}, atol={self.atol:g}")


def _tolerance(*dtypes: torch.dtype) -> tuple[float, float]:
    pairs = [_TOLERANCES.get(d, (0.0, 0.0)) for d in dtypes]
    return max(p[0] for p in pairs), max(p[1] for p in pairs)


def _difference(subject: OpCall, reference: OpCall, output: int, a: torch.Tensor, b: torch.Tensor,
                rtol: Optional[float], atol: Optional[float],
                precision: Optional[torch.dtype] = None) -> Optional[OpDifference]:
    """How ``a`` (subject) differs from ``b`` (reference), or None within tolerance. Default
    tolerances are the coarsest of the two dtypes' and ``precision``'s (autocast's: a float32
    result computed from its low-precision results carries their rounding)."""
    default_rtol, default_atol = _tolerance(a.dtype, b.dtype, *([precision] if precision is not None else []))
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol
    a, b = a.cpu(), b.cpu()
    if a.shape != b.shape:
        return OpDifference(subject, reference, output, float("inf"), float("nan"), (), float("nan"),
                            float("nan"), max(a.numel(), b.numel()), max(a.numel(), b.numel()), rtol, atol)
    if a.is_complex() or b.is_complex():
        a, b = torch.view_as_real(a.to(torch.complex128)), torch.view_as_real(b.to(torch.complex128))
    exact = not (a.is_floating_point() or a.is_complex()) and not (b.is_floating_point() or b.is_complex())
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    same_nan = torch.isnan(a64) & torch.isnan(b64)
    same_inf = torch.isinf(a64) & (a64 == b64)
    gap = torch.where(same_nan | same_inf, torch.zeros_like(a64), (a64 - b64).abs())
    gap = torch.nan_to_num(gap, nan=float("inf"))
    finite_b = b64[torch.isfinite(b64)]
    scale = float(finite_b.abs().max()) if finite_b.numel() else 0.0
    worst = float(gap.max()) if gap.numel() else 0.0
    if exact:
        if worst == 0:
            return None
    elif worst <= atol + rtol * scale:
        return None
    differing = int((gap > atol + rtol * b64.abs()).sum())
    flat = int(gap.flatten().argmax()) if gap.numel() else 0
    at = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), gap.shape)) if gap.dim() else ()
    return OpDifference(subject, reference, output, worst, scale, at, float(a64.flatten()[flat]),
                        float(b64.flatten()[flat]), differing, gap.numel(), rtol, atol)


@dataclass
class Comparison:
    """The result of ``compare``: ``first`` is the first op that left the reference (None: all
    agreed), ``differences`` every compared op that did, in order."""

    against: str
    subject: str
    reference: str
    subject_ops: int
    reference_ops: int
    compared: int
    differences: list[OpDifference]
    only_subject: list[OpCall]
    only_reference: list[OpCall]
    agreed_before: int  # compared ops before the first difference
    notes: list[str] = field(default_factory=list)

    @property
    def first(self) -> Optional[OpDifference]:
        return self.differences[0] if self.differences else None

    def headline(self) -> str:
        if self.first is None:
            return (f"neuron_lab.compare: {self.subject} against {self.reference}: all {self.compared} compared ops "
                    "agree within tolerance")
        return (f"neuron_lab.compare: {self.subject} against {self.reference}: the first op beyond tolerance is "
                f"op {self.first.subject.index + 1} of {self.subject_ops} ({self.agreed_before} compared ops agreed "
                f"before it)")

    def _unmatched(self) -> list[str]:
        out = []
        for calls, run in ((self.only_subject, self.subject), (self.only_reference, self.reference)):
            if calls:
                names = sorted({c.name for c in calls})
                out.append(f"{len(calls)} ops only in the {run} run, not compared: {', '.join(names[:6])}"
                           + (" ..." if len(names) > 6 else ""))
        return out

    def __str__(self) -> str:
        lines = [self.headline()]
        if self.first is not None:
            lines.append("  " + self.first.describe().replace("\n", "\n  "))
            later = len(self.differences) - 1
            if later:
                lines.append(f"  after it, {later} more of the {self.compared} compared ops differ "
                             f"(what a difference does downstream); the next ones:")
                for d in self.differences[1:_SHOWN_DIFFERENCES]:
                    lines.append(f"    {d.subject.describe()}: max |difference| {d.max_difference:.3g}")
        lines.extend("  " + line for line in self._unmatched() + self.notes)
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        esc = html.escape
        out = [f"<div class='neuron-compare'><b>{esc(self.headline())}</b>"]
        if self.first is not None:
            f = self.first
            out.append(
                "<table class='neuron-compare-first' style='border-collapse:collapse;font-size:13px;margin:4px 0'>"
                + "".join(f"<tr><td style='padding:1px 8px;text-align:left'><b>{esc(k)}</b></td>"
                          f"<td style='padding:1px 8px;text-align:left'>{esc(v)}</td></tr>" for k, v in [
                              ("op", f.subject.name + (f" (backward of {f.subject.backward_of})"
                                                       if f.subject.backward_of else "")),
                              ("line", f.subject.where),
                              ("code", f.subject.text),
                              ("output shapes", ", ".join(f"{d}{list(s)}" for s, d in
                                                          zip(f.subject.shapes, f.subject.dtypes))),
                              ("max |difference|", f"{f.max_difference:.4g}" + (f" at {list(f.at)}" if f.at else "")
                               + f" ({self.subject} {f.subject_value:.6g}, {self.reference} "
                                 f"{f.reference_value:.6g})"),
                              ("relative to the reference", f"{f.relative:.3g} of its largest magnitude "
                                                            f"{f.reference_scale:.4g}"),
                              ("elements beyond tolerance", f"{f.differing} of {f.numel} (rtol={f.rtol:g}, "
                                                            f"atol={f.atol:g})"),
                          ]) + "</table>")
            if len(self.differences) > 1:
                rows = "".join(f"<tr><td style='padding:1px 8px;text-align:left'>{esc(d.subject.name)}</td>"
                               f"<td style='padding:1px 8px;text-align:left'>{esc(d.subject.where)}</td>"
                               f"<td style='padding:1px 8px;text-align:right'>{d.max_difference:.3g}</td></tr>"
                               for d in self.differences[1:_SHOWN_DIFFERENCES])
                out.append(f"<div>after it, {len(self.differences) - 1} more of the {self.compared} compared ops "
                           f"differ; the next ones:</div><table style='border-collapse:collapse;font-size:12px'>"
                           f"<tr><th style='text-align:left'>op</th><th style='text-align:left'>line</th>"
                           f"<th>max |difference|</th></tr>{rows}</table>")
        for line in self._unmatched() + self.notes:
            out.append(f"<div style='font-size:12px'>{esc(line)}</div>")
        out.append("</div>")
        return "".join(out)


def _pair(subject: _Recorder, reference: _Recorder, with_dtypes: bool) -> tuple[list[tuple[int, int]], list, list]:
    keys_s = [c.key(with_dtypes) for c in subject.calls]
    keys_r = [c.key(with_dtypes) for c in reference.calls]
    pairs: list[tuple[int, int]] = []
    for block in difflib.SequenceMatcher(None, keys_s, keys_r, autojunk=False).get_matching_blocks():
        pairs.extend((block.a + k, block.b + k) for k in range(block.size))
    paired_s = {i for i, _ in pairs}
    paired_r = {j for _, j in pairs}
    return (pairs, [c for c in subject.calls if c.index not in paired_s],
            [c for c in reference.calls if c.index not in paired_r])


# ---- running ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _same_random_numbers(seed: int) -> Iterator[None]:
    """Both runs start from ``seed``; the caller's generators are as they were afterwards."""
    cpu = torch.get_rng_state()
    neuron = torch.neuron.get_rng_state_all()
    torch.manual_seed(seed)
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        torch.neuron.set_rng_state_all(neuron)


def _run_once(side: _Side, run: Callable[[dict[str, Any]], Any], inputs: _Inputs, namespace: Optional[dict],
              seed: int, filename: str, budget: int, quiet: bool) -> _Recorder:
    recorder = _Recorder(filename, budget)
    values = inputs.load(side.map_location, namespace)
    output = contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext()
    with _same_random_numbers(seed), side.context(), output:
        with recorder:
            run(values)
    if side.map_location is None:
        torch.neuron.synchronize()  # the run's device work, and its errors, belong to it
    return recorder


def compare(fn_or_code: Union[Callable[..., Any], str], *args: Any, against: str = "cpu",
            namespace: Optional[dict[str, Any]] = None, rtol: Optional[float] = None,
            atol: Optional[float] = None, seed: int = 0, dtype: torch.dtype = torch.bfloat16,
            budget_bytes: int = _DEFAULT_BUDGET_BYTES, filename: Optional[str] = None,
            **kwargs: Any) -> Comparison:
    """Runs ``fn(*args, **kwargs)`` (or a code string, in a copy of ``namespace``) on the
    device and on the reference ``against`` names (``AGAINST``), and returns the
    ``Comparison``: the first op whose result leaves the reference's beyond the tolerance,
    with its line, shapes and the size of the difference. See the module's docstring.

    Each run gets its own copy of the inputs; the caller's objects and random generators are
    left as they were. ``rtol``/``atol`` override the per-dtype defaults; ``dtype`` is
    autocast's for ``against="float32"``; ``budget_bytes`` bounds the results kept per run.
    """
    if isinstance(fn_or_code, str):
        if args or kwargs:
            raise TypeError("compare(code, ...) runs a code string in `namespace`; pass values through the "
                            "namespace, not as arguments")
        filename = filename or _CODE_FILE
        if filename not in linecache.cache:
            linecache.cache[filename] = (len(fn_or_code), None, fn_or_code.splitlines(True), filename)
        tree = ast.parse(fn_or_code, filename=filename)
        code = compile(tree, filename, "exec")
        source_namespace = namespace if namespace is not None else {}
        inputs = _Inputs({n: source_namespace[n] for n in _referenced_names(tree, source_namespace)})

        def run(values: dict[str, Any]) -> Any:
            exec(code, values)  # noqa: S102 - the user's code, as a cell runs it

    elif callable(fn_or_code):
        fn = fn_or_code
        filename = fn.__code__.co_filename if isinstance(fn, types.FunctionType) else (filename or "")
        source_namespace = None
        inputs = _Inputs({"args": args, "kwargs": kwargs})

        def run(values: dict[str, Any]) -> Any:
            return fn(*values["args"], **values["kwargs"])

    else:
        raise TypeError(f"compare() takes a function or a code string, got {type(fn_or_code).__name__}")
    if against not in AGAINST:
        raise ValueError(f"against={against!r}: compare against one of {', '.join(AGAINST)}")
    for name, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and not value >= 0:
            raise ValueError(f"{name} must be a number >= 0, got {value!r}")
    subject_side, reference_side, notes = _sides(against, dtype)

    torch.neuron.synchronize()  # the caller's earlier work is not the runs'
    if subject_side.warm_up:
        _warm_up(subject_side, run, inputs, source_namespace, seed, filename, budget_bytes)
    counters_before = _launch_tiers()
    subject = _run_once(subject_side, run, inputs, source_namespace, seed, filename, budget_bytes,
                        quiet=False)
    if against == "replay":
        compiled, replayed = (after - before for after, before in zip(_launch_tiers(), counters_before))
        notes = notes + [f"in the compiled run, {compiled} launches ran compiled code and {replayed} replayed"]
    reference = _run_once(reference_side, run, inputs, source_namespace, seed, filename,
                          budget_bytes, quiet=True)
    if inputs.not_copied:
        notes.append(f"not copied for each run, so shared by both (they cannot be pickled): "
                     f"{', '.join(sorted(inputs.not_copied))}")
    for recorder, run_name in ((subject, subject_side.name), (reference, reference_side.name)):
        if recorder.dropped:
            notes.append(f"the {run_name} run kept results up to {budget_bytes} bytes: its last "
                         f"{recorder.dropped} ops were not compared")

    pairs, only_subject, only_reference = _pair(subject, reference, with_dtypes=against != "float32")
    differences: list[OpDifference] = []
    agreed_before = 0
    for i, j in pairs:
        found = None
        for k, (a, b) in enumerate(zip(subject.values[i], reference.values[j])):
            found = _difference(subject.calls[i], reference.calls[j], k, a, b, rtol, atol,
                                precision=dtype if against == "float32" else None)
            if found is not None:
                break
        if found is not None:
            differences.append(found)
        elif not differences:
            agreed_before += 1
    return Comparison(against, subject_side.name, reference_side.name, len(subject.calls), len(reference.calls),
                      len(pairs), differences, only_subject, only_reference, agreed_before, notes)


_MAX_WARM_UP_RUNS = 3


def _warm_up(side: _Side, run: Callable, inputs: "_Inputs", namespace: Optional[dict], seed: int, filename: str,
             budget: int) -> None:
    """Runs the code unrecorded until a run builds no new graph (at most _MAX_WARM_UP_RUNS), then
    waits for their compiles. One run is not always enough: a first run's last graph is launched
    at its final wait, a second run's where the cached graph ends, while the program still holds
    other tensors, and which results stay alive is part of a graph's key."""
    from neuron_lab.adaptive_eager import counters, wait_for_compiles

    for _ in range(_MAX_WARM_UP_RUNS):
        built = counters()["graphs_built"]
        _run_once(side, run, inputs, namespace, seed, filename, budget, quiet=True)
        if counters()["graphs_built"] == built:
            break
    wait_for_compiles(timeout=_COMPILE_WAIT_S)


def _launch_tiers() -> tuple[int, int]:
    from neuron_lab.adaptive_eager import counters

    c = counters()
    return int(c["compiled_launches"]), int(c["replay_launches"])
