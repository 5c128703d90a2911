"""torch.compile(backend="neuron"): registration, forward and backward parity for an
MLP, a CNN and a transformer block, recompiles, dynamic shapes, graph breaks,
autocast inside compiled code, and what the profiler and explain() show."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from torch import nn

import neuron_lab
from neuron_lab.compile import compiled_graphs


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    torch.compiler.set_default_backend("inductor")


def parity(model: nn.Module, make_input, compile_model, atol: float = 1e-5, steps: int = 2) -> None:
    """Trains a copy on CPU (eager) and a compiled copy on neuron; losses and grads agree."""
    torch.manual_seed(0)
    cpu_model = copy.deepcopy(model)
    dev_model = copy.deepcopy(model).to("neuron")
    compiled = compile_model(dev_model)
    for step in range(steps):
        x = make_input(step)
        ref_out = cpu_model(x)
        out = compiled(x.to("neuron"))
        torch.testing.assert_close(out.cpu(), ref_out, atol=atol, rtol=1e-4)
        ref_out.square().mean().backward()
        out.square().mean().backward()
        for (name, a), b in zip(dev_model.named_parameters(), cpu_model.parameters()):
            torch.testing.assert_close(a.grad.cpu(), b.grad, atol=atol, rtol=1e-4, msg=f"grad of {name}")
        for m in (cpu_model, dev_model):
            m.zero_grad()


def test_backend_is_listed():
    assert "neuron" in torch.compiler.list_backends()


class MLP(nn.Module):
    """A user's model (Module.compile() traces forwards defined outside torch.nn)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


LAUNCHES = ("async", "inline")


def compile_with(launch: str):
    return lambda m: torch.compile(m, backend="neuron", options={"neuron.launch": launch})


@pytest.mark.parametrize("launch", LAUNCHES)
def test_set_default_backend_then_model_compile_runs_on_neuron(launch):
    torch.compiler.set_default_backend("neuron")
    model = MLP()
    before = len(compiled_graphs())

    def compile_model(m):
        m.compile(options={"neuron.launch": "inline"} if launch == "inline" else None)
        return m

    parity(model, lambda step: torch.randn(16, 32), compile_model)
    kinds = [g["kind"] for g in compiled_graphs()[before:]]
    assert kinds == ["forward", "backward"], compiled_graphs()[before:]
    assert all(g["tier"] == launch and g["launches"] == 2 for g in compiled_graphs()[before:])


@pytest.mark.parametrize("launch", LAUNCHES)
def test_cnn_forward_and_backward_match_eager(launch):
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 8, 3),
                          nn.ReLU(), nn.Flatten(), nn.Linear(8 * 2 * 2, 5))
    parity(model, lambda step: torch.randn(4, 3, 8, 8), compile_with(launch), atol=1e-4)


@pytest.mark.parametrize("launch", LAUNCHES)
def test_transformer_block_forward_and_backward_match_eager(launch):
    model = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True)
    parity(model, lambda step: torch.randn(2, 6, 32), compile_with(launch), atol=1e-4)


@pytest.mark.usefixtures("graphs_recorded_on_host")
def test_async_graphs_are_recorded_and_launched_whole_on_the_stream():
    """The default: a compiled graph's ops are recorded by adaptive eager (the host does
    not wait for them) and launched together when the graph ends; steady-state steps
    hit adaptive eager's graph cache, and nothing runs as an inline launch."""
    from neuron_lab import adaptive_eager as ae

    model = torch.compile(MLP().to("neuron"), backend="neuron")
    x = torch.randn(16, 32, device="neuron")
    before = len(compiled_graphs())
    for _ in range(3):  # compiles, then warms adaptive eager's cache
        model(x).square().mean().backward()
    torch.neuron.synchronize()
    graphs = compiled_graphs()[before:]
    assert [g["tier"] for g in graphs] == ["async", "async"]
    counters = ae.counters()
    with neuron_lab.profiler.profile() as prof:
        model(x).square().mean().backward()
        torch.neuron.synchronize()
    after = ae.counters()
    assert after["ops_recorded"] - counters["ops_recorded"] >= 10  # the graphs' ops (views are not launched)
    assert after["graphs_built"] == counters["graphs_built"]  # the steady state hits the cache
    flushes = after["flushes"].get("end of a compiled graph", 0) - counters["flushes"].get("end of a compiled graph", 0)
    assert flushes == 2  # the forward and the backward graph, each launched when it ends
    assert not [l for l in prof.launches if l.kind == "inline"]
    assert all(g["launches"] == 4 for g in compiled_graphs()[before:])


def test_recompile_on_a_new_shape_is_counted_and_explained():
    def f(x):
        return (x.sin() * 2).sum(dim=-1)

    compiled = torch.compile(f, backend="neuron", dynamic=False)
    compiled(torch.randn(8, 4, device="neuron"))
    with neuron_lab.explain_scope() as e:
        out = compiled(torch.ones(3, 4, device="neuron"))
    torch.testing.assert_close(out.cpu(), f(torch.ones(3, 4)))
    # (torch.ones may also rebuild an adaptive-eager graph cached by another test.)
    recompiles = [r for r in e.recompiles if r.what.startswith("torch.compile")]
    assert len(recompiles) == 1, [(r.what, r.detail) for r in e.recompiles]
    (recompile,) = recompiles
    assert "float32[3, 4]" in recompile.detail and "float32[8, 4]" in recompile.detail
    assert recompile.source.file == __file__
    assert any(ev.kind == "compile" and "compiled inference graph" in ev.what for ev in e.events)
    assert "recompile" in str(e)


def test_dynamic_shapes_run_correctly_through_adaptive_eager():
    def f(x):
        return torch.relu(x) @ x.T

    compiled = torch.compile(f, backend="neuron", dynamic=True)
    for n in (3, 5, 7):
        x = torch.randn(n, 4)
        torch.testing.assert_close(compiled(x.to("neuron")).cpu(), f(x), atol=1e-5, rtol=1e-5)
    assert any(g["tier"] == "async" for g in compiled_graphs())


def test_graph_breaks_fall_back_to_adaptive_eager():
    def f(x):
        y = x * 2
        if y.sum().item() > 0:  # a data-dependent branch: a graph break
            return y + 1
        return y - 1

    compiled = torch.compile(f, backend="neuron")
    x = torch.randn(16)
    torch.testing.assert_close(compiled(x.to("neuron")).cpu(), f(x))
    torch.testing.assert_close(compiled((-x.abs()).to("neuron")).cpu(), f(-x.abs()))


def test_autocast_inside_compiled_code_uses_low_precision_matmuls():
    def f(a, b):
        with torch.autocast("neuron", dtype=torch.bfloat16):
            c = a @ b
            s = c.float().softmax(dim=-1).sum()
        return c, s

    a, b = torch.randn(8, 16), torch.randn(16, 8)
    c, s = torch.compile(f, backend="neuron")(a.to("neuron"), b.to("neuron"))
    assert c.dtype == torch.bfloat16 and s.dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = a @ b
    torch.testing.assert_close(c.cpu(), ref, atol=2e-2, rtol=2e-2)


def test_profiler_and_counters_see_compiled_inline_launches():
    model = torch.compile(nn.Linear(8, 8).to("neuron"), backend="neuron", options={"neuron.launch": "inline"})
    x = torch.randn(4, 8, device="neuron")
    model(x)  # compile outside the profile
    with neuron_lab.profiler.profile() as prof:
        for _ in range(3):
            y = model(x)
        y.sum().item()
    # The weights require grad, so AOTAutograd compiled a forward (and a backward) graph.
    launches = [l for l in prof.launches if l.name.startswith("compiled forward graph")]
    assert len(launches) == 3 and all(l.kind == "inline" and l.status == "done" for l in launches)
    assert any(r.name.startswith("compiled forward graph") for r in prof.table().launch_rows)


def test_compiled_results_take_device_memory_without_copies():
    """Inductor's results are allocated in device memory and adopted, not copied;
    a result that views an input stays a view of the neuron input."""
    from neuron_lab.device import _C

    def f(x, w):
        return (x @ w).relu(), w.t()

    compiled = torch.compile(f, backend="neuron", options={"neuron.launch": "inline"})
    x, w = torch.randn(16, 32), torch.randn(32, 8)
    xd, wd = x.to("neuron"), w.to("neuron")
    compiled(xd, wd)  # compiles
    torch.neuron.synchronize()
    copies = _C.counters()["output_copies"]
    before = torch.neuron.memory_allocated()
    out, wt = compiled(xd, wd)
    torch.neuron.synchronize()
    assert _C.counters()["output_copies"] == copies
    assert out.device.type == "neuron" and wt.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), (x @ w).relu())
    # The result's memory is accounted on the device (512-byte blocks), the view takes none.
    assert torch.neuron.memory_allocated() - before == 16 * 8 * 4
    assert wt.untyped_storage().data_ptr() == wd.untyped_storage().data_ptr()
    torch.testing.assert_close(wt.cpu(), w.t())
    # CPU allocations after the launch are plain host memory again.
    host = torch.ones(1 << 16)
    torch.neuron.synchronize()
    assert torch.neuron.memory_allocated() - before == 16 * 8 * 4
    del out
    assert torch.neuron.memory_allocated() == before
    assert host.sum().item() == 1 << 16


def test_compiled_cnn_uses_onednn_scratch_memory_from_the_device():
    """oneDNN allocates scratch through the CPU allocator's raw interface: inside a
    compiled launch that memory comes from the device and goes back to it."""
    conv = nn.Conv2d(3, 16, 3).to("neuron")
    compiled = torch.compile(conv, backend="neuron", options={"neuron.launch": "inline"})
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        for _ in range(3):
            out = compiled(x.to("neuron"))
        ref = conv.cpu()(x)
    torch.testing.assert_close(out.cpu(), ref, atol=1e-4, rtol=1e-4)


def _training_step_graph_cache_counts() -> dict:
    """Compiles a small model's training step with the neuron backend; Inductor's
    on-disk graph-cache counters for its forward and backward graphs."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = torch.compile(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).to("neuron"), backend="neuron",
                          options={"neuron.launch": "inline"})
    model(torch.randn(5, 8, device="neuron")).sum().backward()
    return dict(counters["inductor"])


def test_forward_and_backward_graphs_use_inductors_on_disk_cache():
    """Both graphs of a training step go through Inductor's FX graph cache (a backward
    compiled without a ShapeEnv bypassed it): the second compile of the same model,
    as after a kernel restart, loads both from disk."""
    torch.manual_seed(0)
    first = _training_step_graph_cache_counts()
    assert first.get("fxgraph_cache_bypass", 0) == 0, first
    second = _training_step_graph_cache_counts()
    assert second.get("fxgraph_cache_hit", 0) == 2 and second.get("fxgraph_cache_miss", 0) == 0, second


def test_compile_options_and_mode_reach_inductor():
    from torch._dynamo.utils import counters

    f = lambda x: (x * 2).sin()  # noqa: E731
    x = torch.randn(6, device="neuron")
    torch.compile(f, backend="neuron", options={"neuron.launch": "inline"})(x)  # cached on disk from here on
    torch._dynamo.reset()
    counters.clear()
    out = torch.compile(f, backend="neuron", options={"fx-graph-cache": False})(x)
    torch.testing.assert_close(out.cpu(), f(x.cpu()))
    assert counters["inductor"].get("fxgraph_cache_hit", 0) == 0  # the option took effect
    assert compiled_graphs()[-1]["inductor_options"] == {"fx_graph_cache": False}
    assert compiled_graphs()[-1]["tier"] == "inline"  # Inductor options imply Inductor's inline launches
    torch._dynamo.reset()
    torch.compile(f, backend="neuron", mode="max-autotune-no-cudagraphs")(x)
    assert compiled_graphs()[-1]["inductor_options"]["max_autotune"] is True
    torch._dynamo.reset()
    torch.compile(f, backend="neuron", mode="reduce-overhead")(x)  # CUDA graphs do not apply
    assert compiled_graphs()[-1]["inductor_options"] == {} and compiled_graphs()[-1]["tier"] == "async"


def test_unknown_compile_options_and_modes_raise_clear_errors():
    x = torch.randn(6, device="neuron")
    with pytest.raises(Exception, match=r"'no_such_option' is not a TorchInductor option.*list_options\(\)"):
        torch.compile(lambda t: t + 1, backend="neuron", options={"no_such_option": 1})(x)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"Unrecognized mode=fastest"):
        torch.compile(lambda t: t + 2, backend="neuron", mode="fastest")(x)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"options\['neuron.launch'\] is 'later'; use one of 'async', 'inline'"):
        torch.compile(lambda t: t + 4, backend="neuron", options={"neuron.launch": "later"})(x)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"configure the inline launch's compile"):
        torch.compile(lambda t: t + 5, backend="neuron", options={"neuron.launch": "async", "max_autotune": True})(x)
    torch._dynamo.reset()
    # Nothing was lost: the tensor and the backend still work.
    assert torch.compile(lambda t: t + 3, backend="neuron")(x).cpu().equal(x.cpu() + 3)


def test_inductor_cpp_wrapper_compiles_inline_graphs():
    """options={"cpp_wrapper": True} (Inductor's C++ wrapper) works for inline graphs: the
    host copy of the graph carries no neuron fake values for Inductor to trip over."""
    f = lambda x: (x * 2).sin() + 1  # noqa: E731
    x = torch.randn(6, device="neuron")
    out = torch.compile(f, backend="neuron", options={"cpp_wrapper": True})(x)
    torch.testing.assert_close(out.cpu(), f(x.cpu()))
    graph = compiled_graphs()[-1]
    assert graph["tier"] == "inline" and graph["inductor_options"] == {"cpp_wrapper": True}, graph


def test_async_graphs_keep_input_mutations_and_random_ops_eager_exact():
    """BatchNorm's running statistics are input mutations in AOTAutograd's graph: with
    async launches they land in the module's buffers as in eager mode, and eval mode
    recompiles to use them. Dropout draws from the neuron generator: seeded, it repeats."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    ref, dev = copy.deepcopy(model), copy.deepcopy(model).to("neuron")
    compiled = torch.compile(dev, backend="neuron")
    for _ in range(3):
        x = torch.randn(32, 8)
        ref(x).sum().backward()
        compiled(x.to("neuron")).sum().backward()
    torch.testing.assert_close(dev[1].running_mean.cpu(), ref[1].running_mean)
    torch.testing.assert_close(dev[1].running_var.cpu(), ref[1].running_var)
    assert dev[1].num_batches_tracked.item() == 3
    torch.testing.assert_close(dev[0].weight.grad.cpu(), ref[0].weight.grad, atol=1e-4, rtol=1e-4)
    dev.eval(), ref.eval()
    torch.testing.assert_close(compiled(x.to("neuron")).cpu(), ref(x), atol=1e-5, rtol=1e-5)

    before = len(compiled_graphs())
    dropout = torch.compile(lambda t: nn.functional.dropout(t, 0.5), backend="neuron")
    x = torch.ones(64, device="neuron")
    torch.manual_seed(1)
    first = dropout(x).cpu()
    torch.manual_seed(1)
    assert torch.equal(dropout(x).cpu(), first)
    assert 0 < (first == 0).sum() < 64 and set(first.unique().tolist()) <= {0.0, 2.0}
    assert [g["tier"] for g in compiled_graphs()[before:]] == ["async"]  # one inference graph


# ---- torch.compile's default backend (TorchInductor) on neuron tensors ----------------


def test_default_backend_compiles_neuron_graphs_for_the_host():
    """torch.compile(fn) with no backend: a neuron graph is TorchInductor's host code run
    as one inline launch, with the CPU's torch.compile numbers (the same C++ code)."""
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x @ x.T).softmax(-1) * 2 + 1

    x = torch.randn(16, 16)
    before = len(compiled_graphs())
    out = torch.compile(fn)(x.to("neuron"))
    assert out.device.type == "neuron"
    torch._dynamo.reset()
    torch.testing.assert_close(out.cpu(), torch.compile(fn)(x), rtol=0, atol=0)
    graphs = compiled_graphs()[before:]
    assert [g["tier"] for g in graphs] == ["inline"], graphs


def test_default_backend_trains_a_model_on_neuron_as_cpu_compile_does():
    parity(MLP(), lambda step: torch.randn(4, 32), lambda m: torch.compile(m), steps=2)


def test_default_backend_keeps_host_outputs_on_the_host_and_mode_reaches_inductor():
    def fn(x: torch.Tensor):
        y = x.cos() + 1
        return y, y.sum().cpu(), torch.arange(3, device="neuron")

    out, total, positions = torch.compile(fn, mode="max-autotune-no-cudagraphs")(torch.ones(5, device="neuron"))
    assert out.device.type == "neuron" and positions.device.type == "neuron"
    assert total.device.type == "cpu"  # .cpu() in the graph: the result stays a host tensor
    torch.testing.assert_close(total, torch.tensor(5 * (1 + torch.cos(torch.tensor(1.0)).item())))
    assert compiled_graphs()[-1]["inductor_options"].get("max_autotune") is True


def test_default_backend_on_cpu_tensors_is_inductor_as_before():
    before = len(compiled_graphs())
    out = torch.compile(lambda x: x.sin() * 2)(torch.ones(3))
    assert out.device.type == "cpu"
    assert len(compiled_graphs()) == before  # the neuron backend saw nothing


# ---- adopted results: CPU tensors over adopted memory stay valid ----------------------------

_ADOPTION_CASES = '''
import json, sys, torch, neuron_lab
from neuron_lab.device import host_kernels as hk

def lent(n):  # a host kernel's result: CPU tensor over memory of core 0
    with hk.InlineLaunch(0, "test", device_memory=True):
        return torch.arange(float(n))

def adopted_again():  # a later launch returns the same CPU tensor
    c = lent(64)
    with hk.InlineLaunch(0, "first", device_memory=True):
        a, = hk.adopt([c], 0)
    with hk.InlineLaunch(0, "second", device_memory=True):
        b, = hk.adopt([c], 0)
    a.add_(1)
    return torch.equal(b.cpu(), torch.arange(64.0) + 1) and b.device == torch.device("neuron", 0)

def read_after():  # the caller reads its CPU result after the launch adopted it
    c = lent(64)
    a, = hk.adopt([c], 0)
    a.mul_(2)
    torch.neuron.synchronize()
    return torch.equal(c, torch.arange(64.0) * 2)

def other_core():  # memory of core 0 adopted for core 1: a copy; the CPU tensor keeps its memory
    c = lent(64)
    a, = hk.adopt([c], 1)
    return a.device == torch.device("neuron", 1) and torch.equal(a.cpu(), c) and torch.equal(c, torch.arange(64.0))

def view_then_base():  # a view adopted by one launch, its base by the next
    c = lent(64)
    v, = hk.adopt([c[8:16]], 0)
    b, = hk.adopt([c], 0)
    b.zero_()
    return torch.equal(v.cpu(), torch.zeros(8)) and torch.equal(c[:4], torch.zeros(4))

for name in sys.argv[1:]:
    print(json.dumps({name: bool(globals()[name]())}), flush=True)
'''
ADOPTION_CASES = ["adopted_again", "read_after", "other_core", "view_then_base"]


@pytest.fixture(scope="module")
def adoption_results() -> dict:
    """Each case's result, run in one fresh interpreter (before the fix, the first case's
    read of an emptied CPU storage killed it with SIGSEGV: the others then report nothing)."""
    import json
    import subprocess
    import sys

    from pathlib import Path

    done = subprocess.run([sys.executable, "-c", _ADOPTION_CASES, *ADOPTION_CASES], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[2],  # this checkout's neuron_lab
                          env={**os.environ, "NEURON_LAB_NUM_CORES": "2"})
    results = {}
    for line in done.stdout.splitlines():
        results.update(json.loads(line))
    return {"results": results, "returncode": done.returncode, "stderr": done.stderr[-3000:]}


@pytest.mark.parametrize("case", ADOPTION_CASES)
def test_cpu_tensors_over_adopted_memory_stay_valid(adoption_results: dict, case: str) -> None:
    """A host kernel's CPU result adopted as a neuron tensor keeps its memory: before, the
    memory moved out of the CPU storage, leaving every CPU tensor over it with no memory,
    and the next read or adoption of it crashed the process (as compiled FlexAttention
    under activation checkpointing did in adopt); memory of another core was moved out
    before the core was checked, then copied from nothing."""
    assert adoption_results["returncode"] == 0, adoption_results["stderr"]
    assert adoption_results["results"].get(case) is True, adoption_results
