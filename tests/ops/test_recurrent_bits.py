"""nn.LSTM, nn.GRU, nn.RNN and their cells on neuron give the CPU's bits, in every mode.

The CPU runs a float32 LSTM through oneDNN (aten::mkldnn_rnn_layer) and other RNNs with
plain ops over a sequence projected at once; ATen's composite would give an accelerator
fused cells that round differently (an LSTM language model drifted by 2.2e-6). The device
takes the CPU's path (rnn_as_on_cpu.cpp): the same ATen ops, in the same order, so
outputs, gradients and training steps are bit for bit the CPU's.
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils._python_dispatch import TorchDispatchMode

import neuron_lab
from parity import same_bits


def flat(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, nn.utils.rnn.PackedSequence):
        return [value.data]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in flat(v)]
    return []


LAYERS = {
    "lstm 2 layers, bidirectional, batch_first": lambda: nn.LSTM(5, 4, num_layers=2, bidirectional=True,
                                                                 batch_first=True),
    "lstm without biases": lambda: nn.LSTM(5, 4, bias=False),
    "lstm with projections": lambda: nn.LSTM(5, 4, num_layers=2, proj_size=3),
    "lstm float64": lambda: nn.LSTM(5, 4, num_layers=2, bidirectional=True).double(),
    "lstm bfloat16": lambda: nn.LSTM(5, 4).bfloat16(),
    "gru 2 layers, bidirectional, batch_first": lambda: nn.GRU(5, 4, num_layers=2, bidirectional=True,
                                                               batch_first=True),
    "gru without biases": lambda: nn.GRU(5, 4, bias=False),
    "rnn tanh": lambda: nn.RNN(5, 4, num_layers=2),
    "rnn relu, bidirectional": lambda: nn.RNN(5, 4, nonlinearity="relu", bidirectional=True),
}
PACKED = {
    "packed lstm, bidirectional": lambda: nn.LSTM(5, 4, num_layers=2, bidirectional=True),
    "packed lstm with projections": lambda: nn.LSTM(5, 4, proj_size=2),
    "packed gru, bidirectional": lambda: nn.GRU(5, 4, bidirectional=True),
    "packed rnn relu": lambda: nn.RNN(5, 4, nonlinearity="relu", num_layers=2),
}
CELLS = {
    "lstm cell": lambda: nn.LSTMCell(5, 4),
    "lstm cell without biases": lambda: nn.LSTMCell(5, 4, bias=False),
    "gru cell": lambda: nn.GRUCell(5, 4),
    "rnn cell": lambda: nn.RNNCell(5, 4, nonlinearity="relu"),
}


def inputs(name: str, module: nn.Module, device: str):
    """The module's input on ``device`` (the same values on every device), requiring grad."""
    dtype = next(module.parameters()).dtype
    g = torch.Generator().manual_seed(7)
    if name in CELLS:
        x = torch.randn(3, 5, generator=g, dtype=dtype)
        return (x.to(device).requires_grad_(),)
    if name in PACKED:
        x = torch.randn(6, 3, 5, generator=g, dtype=dtype).to(device).requires_grad_()
        return (pack_padded_sequence(x, torch.tensor([6, 4, 1]), enforce_sorted=True), x)
    batch_first = getattr(module, "batch_first", False)
    x = torch.randn(3, 6, 5, generator=g, dtype=dtype) if batch_first else torch.randn(6, 3, 5, generator=g, dtype=dtype)
    return (x.to(device).requires_grad_(),)


def cotangents_for(name: str, module: nn.Module, device: str) -> list:
    """A fixed random cotangent per output (found from a CPU run without grad)."""
    with torch.no_grad():
        shapes = [(o.shape, o.dtype) for o in flat(copy.deepcopy(module).cpu()(inputs(name, module, "cpu")[0]))]
    g = torch.Generator().manual_seed(11)
    return [torch.randn(shape, generator=g, dtype=dtype).to(device) for shape, dtype in shapes]


def run(name: str, module: nn.Module, device: str, log: "OpLog | None" = None):
    """Outputs, then the gradients of the input and parameters for a fixed cotangent (the
    ops of the forward and the backward logged in ``log``)."""
    args = inputs(name, module, device)
    cotangents = cotangents_for(name, module, device)
    params = list(module.parameters())
    with log if log is not None else contextlib.nullcontext():
        outputs = flat(module(args[0]))
        grads = torch.autograd.grad(outputs, [args[-1], *params], cotangents)
    return outputs, list(grads)


ALL = {**LAYERS, **PACKED, **CELLS}


@pytest.mark.parametrize("name", list(ALL))
def test_outputs_and_gradients_are_the_cpus_bits(name: str, mode: str) -> None:
    torch.manual_seed(0)
    ref = ALL[name]()
    dev = copy.deepcopy(ref).to("neuron")
    cpu_out, cpu_grads = run(name, ref, "cpu")
    dev_out, dev_grads = run(name, dev, "neuron")
    assert all(o.device.type == "neuron" for o in dev_out)
    for i, (a, b) in enumerate(zip(cpu_out, dev_out)):
        assert same_bits(b, a), f"{name}: output {i} differs: {(b.cpu().double() - a.double()).abs().max()}"
    for i, (a, b) in enumerate(zip(cpu_grads, dev_grads)):
        assert same_bits(b, a), f"{name}: gradient {i} differs: {(b.cpu().double() - a.double()).abs().max()}"


class OpLog(TorchDispatchMode):
    """The ATen ops a call runs, with their tensors' shapes and strides."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        def describe(a):
            if isinstance(a, torch.Generator):
                return "generator"
            if isinstance(a, torch.Tensor):
                return (tuple(a.shape), a.stride(), a.dtype)
            if isinstance(a, (list, tuple)):
                return tuple(describe(x) for x in a)
            if isinstance(a, torch.device):
                return "device"
            return a
        self.ops.append((str(func), describe(args), {k: describe(v) for k, v in (kwargs or {}).items()}))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", list(ALL))
def test_the_device_runs_the_cpus_ops_in_the_cpus_order(name: str) -> None:
    """Forward and backward: the same ops on the same shapes and strides (so that the autograd
    graph, and the order gradients are summed in, are the CPU's)."""
    torch.manual_seed(0)
    ref = ALL[name]()
    dev = copy.deepcopy(ref).to("neuron")
    logs = {}
    # Blocking mode: in the others the recorder holds pending results, and torch's factory
    # functions then detach them (a dispatched detach that the log would show).
    with neuron_lab.mode("blocking"):
        for device, module in (("cpu", ref), ("neuron", dev)):
            log = OpLog()
            run(name, module, device, log)
            logs[device] = log.ops
    cpu_ops, dev_ops = logs["cpu"], logs["neuron"]
    for i, (a, b) in enumerate(zip(cpu_ops, dev_ops)):
        assert a == b, f"{name}: op {i} differs:\n  cpu:    {a}\n  neuron: {b}"
    assert len(cpu_ops) == len(dev_ops)


@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU, nn.RNN], ids=lambda k: k.__name__)
def test_dropout_between_layers_draws_the_cpus_numbers(kind, mode: str) -> None:
    """In training, dropout between layers: the device's generator draws what the CPU's does
    (its dropout kernel differs from the CPU's composite, so the op sequences differ)."""
    torch.manual_seed(0)
    ref = kind(5, 4, num_layers=3, dropout=0.3)
    dev = copy.deepcopy(ref).to("neuron")
    x = torch.randn(6, 3, 5)
    results = []
    for module, device in ((ref, "cpu"), (dev, "neuron")):
        torch.manual_seed(1)
        out = module(x.to(device).requires_grad_())[0]
        out.sum().backward()
        results.append([out, *(p.grad for p in module.parameters())])
    for a, b in zip(*results):
        assert same_bits(b, a)


def test_half_precision_inference_takes_the_cpus_path(mode: str) -> None:
    torch.manual_seed(0)
    ref = nn.LSTM(5, 4, num_layers=2).half()
    dev = copy.deepcopy(ref).to("neuron")
    x = torch.randn(6, 3, 5).half()
    with torch.no_grad():
        a = flat(ref(x))
        b = flat(dev(x.to("neuron")))
    with torch.inference_mode():
        c = flat(dev(x.to("neuron")))
    for u, v, w in zip(a, b, c):
        assert same_bits(v, u) and same_bits(w, u)


def test_an_lstm_language_model_trains_as_on_the_cpu(mode: str) -> None:
    """Three AdamW steps of embedding -> 2-layer LSTM -> linear: losses, gradients and
    parameters bit for bit the CPU's."""

    class LanguageModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(50, 16)
            self.lstm = nn.LSTM(16, 32, num_layers=2, batch_first=True, dropout=0.0)
            self.head = nn.Linear(32, 50)

        def forward(self, ids):
            out, _ = self.lstm(self.embed(ids))
            return self.head(out)

    torch.manual_seed(0)
    ref = LanguageModel()
    dev = copy.deepcopy(ref).to("neuron")
    ids = torch.randint(0, 50, (4, 12), generator=torch.Generator().manual_seed(3))
    runs = {}
    for device, model in (("cpu", ref), ("neuron", dev)):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        x, y = ids[:, :-1].to(device), ids[:, 1:].to(device)
        losses = []
        for _ in range(3):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x).reshape(-1, 50), y.reshape(-1))
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        runs[device] = (losses, [p.grad for p in model.parameters()], list(model.parameters()))
    for kind, cpu_values, dev_values in zip(("loss", "gradient", "parameter"), runs["cpu"], runs["neuron"]):
        for i, (a, b) in enumerate(zip(cpu_values, dev_values)):
            assert same_bits(b, a), f"{kind} {i} differs from the CPU's"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU], ids=lambda k: k.__name__)
def test_under_autocast_the_layer_runs_in_the_low_precision_dtype(kind, dtype, mode: str) -> None:
    """As CUDA casts its cuDNN RNN's arguments: the result is the CPU's for the layer and its
    input in the autocast dtype."""
    torch.manual_seed(0)
    ref = kind(5, 4, num_layers=2)
    dev = copy.deepcopy(ref).to("neuron")
    x = torch.randn(6, 3, 5)
    with torch.autocast("neuron", dtype=dtype):
        got = dev(x.to("neuron"))[0]
    expected = copy.deepcopy(ref).to(dtype)(x.to(dtype))[0]
    assert got.dtype == dtype
    assert same_bits(got, expected)
