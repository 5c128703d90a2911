"""The compiled tier compiles in a separate process: a user's compiled functions and FX
traces never see the runtime's background work, and a worker that dies costs its graph
the compiled tier only.

Compiling in the user's process shared FX's process-wide state ("symbolic tracing in
progress", patched ``Module.__call__``) with the user's program: a ``torch.compile``'d
Llama training loop failed at step 32 with "Detected that you are using FX to
symbolically trace a dynamo-optimized function". Each test here runs the user's code
until the background compile it overlaps has finished, so that the overlap is certain.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time

import pytest
import torch
from torch import nn

import neuron_lab
from neuron_lab import adaptive_eager as ae
from neuron_lab.adaptive_eager import compiler

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the shared helpers
from hf_models import MODELS, make_batch  # noqa: E402

pytestmark = pytest.mark.usefixtures("adaptive_runtime")

COMPILE_TIMEOUT_S = 300  # a cold Inductor compile on a loaded 2-core machine


@pytest.fixture(autouse=True)
def fresh_state():
    torch._dynamo.reset()
    ae.clear_graph_cache()
    yield
    ae.wait_for_compiles(COMPILE_TIMEOUT_S)
    torch._dynamo.reset()
    ae.clear_graph_cache()


def _compiles_done() -> int:
    counters = ae.counters()
    return counters["compiles_succeeded"] + counters["compiles_failed"]


def _run_until_compiled(step, min_steps: int) -> int:
    """Runs ``step(i)`` at least ``min_steps`` times and until every compile it caused has
    finished (the user's code runs all through the background compiles); returns the steps."""
    deadline = time.monotonic() + COMPILE_TIMEOUT_S
    i = 0
    while i < min_steps or ae.pending_compiles() > 0 or _compiles_done() == 0:
        step(i)
        i += 1
        assert time.monotonic() < deadline, (i, ae.counters(), ae.graphs())
    return i


def _fx_state_is_pristine() -> bool:
    import torch.fx._symbolic_trace as symbolic_trace

    # is_fx_tracing(): torch 2.13 keeps the flag process-wide, 2.14 per thread.
    return (not symbolic_trace.is_fx_tracing()
            and nn.Module.__call__ is nn.modules.module.Module._wrapped_call_impl
            and nn.Module.__getattr__ is symbolic_trace._orig_module_getattr)


def test_compiled_llama_trains_with_an_eager_optimizer_through_background_compiles():
    """The reported loop: a tiny transformers Llama compiled with backend="neuron", AdamW
    outside the compiled region, the loss read each step. Its forward graph gets hot and
    compiles in the background while the loop goes on; every step runs, and the compiled
    code then runs the graph."""
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = MODELS["llama"].build(attention_dropout=0.0).to("neuron")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    compiled = torch.compile(model, backend="neuron")
    batch = {k: v.to("neuron") for k, v in make_batch("causal", torch.Generator().manual_seed(0), tokens=8).items()}
    losses = []

    def step(_: int) -> None:
        loss = compiled(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())

    steps = _run_until_compiled(step, min_steps=100)
    for _ in range(5):
        step(0)  # the compiled code runs
    counters = ae.counters()
    failed = [(g["id"], g["ops"], g["note"]) for g in ae.graphs() if "compile failed" in g["note"]]
    assert counters["compiles_failed"] == 0, failed
    assert counters["compiles_succeeded"] >= 1 and counters["compiled_launches"] >= 1, (steps, counters)
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0] * 0.5, losses[::10]
    assert _fx_state_is_pristine()


def test_users_torch_compile_runs_beside_the_compiled_tier():
    """neuron_lab.configure(compile=True) turned on in a later cell, while the user's own
    torch.compile'd model (TorchInductor, on the CPU, compiled before) runs in the same
    loop as eager neuron code whose graph compiles in the background, and recompiles for
    a new shape during the background compile."""
    user_model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    user_compiled = torch.compile(user_model)
    x16 = torch.randn(8, 16)
    torch.testing.assert_close(user_compiled(x16), user_model(x16))
    neuron_lab.configure(compile=True, compile_after=2)  # restored by the adaptive_runtime fixture
    a, b = torch.randn(4096, device="neuron"), torch.randn(4096, device="neuron")
    # A graph no cache has seen, in structure as well as constants (one of 2**40 cos/sin
    # patterns): its compile traces and codegens from scratch, long enough to overlap the
    # user's calls. (With a fixed structure, a warm Inductor cache on the CI machine once
    # finished it inside one step: no overlap to test.)
    offset = random.random()
    pattern = [random.choice((torch.cos, torch.sin)) for _ in range(40)]
    overlapped = []  # (step, call) of each user call begun while a background compile ran
    recompiled_during = []  # the step whose new batch shape Dynamo recompiled for

    def step(i: int) -> None:
        chain = a
        for unary in pattern:
            chain = unary(chain * b) + offset  # the hot graph (120 ops), compiled from its second launch
        chain.sum().item()
        for call in range(20 if ae.pending_compiles() > 0 else 1):  # calls packed into a background compile
            compiling = ae.pending_compiles() > 0
            rows = 8
            if compiling and len(overlapped) == 1 and not recompiled_during:
                # A new shape at the second call into a compile (the first is a cached call, quick:
                # a recompile there outlasted the background compile): Dynamo recompiles meanwhile.
                rows = 5
                recompiled_during.append(i)
            batch = torch.randn(rows, 16)
            torch.testing.assert_close(user_compiled(batch), user_model(batch))
            if compiling:
                overlapped.append((i, call))

    _run_until_compiled(step, min_steps=100)
    assert recompiled_during and len(overlapped) >= 2, (
        f"the user's calls overlapped a background compile only at (step, call) {overlapped}")
    counters = ae.counters()
    assert counters["compiles_succeeded"] >= 1 and counters["compiles_failed"] == 0, ae.graphs()
    assert _fx_state_is_pristine()


def test_users_fx_trace_while_the_background_compiler_works():
    """A user's torch.fx.symbolic_trace on the main thread during background compiles
    traces as it would alone (leaf modules as call_module nodes), and FX's process-wide
    state, seen from the user's thread, is never the background compiler's."""
    neuron_lab.configure(compile=True, compile_after=2)
    user_model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    x_user = torch.randn(3, 8)
    a, b = torch.randn(4096, device="neuron"), torch.randn(4096, device="neuron")
    offset = random.random()  # a graph no cache has seen: its compile traces from scratch
    seen_foreign_state = []

    def step(_: int) -> None:
        (((a * b).sin() + offset).tanh() * 0.5).sum().item()  # a hot graph for the background compiler
        if not _fx_state_is_pristine():
            seen_foreign_state.append(True)
        traced = torch.fx.symbolic_trace(user_model)
        assert [n.op for n in traced.graph.nodes].count("call_module") == 3, traced.graph
        torch.testing.assert_close(traced(x_user), user_model(x_user))

    _run_until_compiled(step, min_steps=100)
    assert ae.counters()["compiles_succeeded"] >= 1, ae.graphs()
    assert not seen_foreign_state and _fx_state_is_pristine()


def test_a_worker_killed_mid_compile_leaves_the_graph_replaying_and_counted():
    """kill -9 of the compile worker while it compiles: the loop goes on with replay (the
    CPU's bits), the failure is counted with its cause, and the next hot graph compiles in
    a new worker."""
    neuron_lab.configure(compile=True, compile_after=2)
    x_cpu = torch.randn(4096)
    x = x_cpu.to("neuron")
    killed = []

    def step(_: int) -> None:
        out = ((x * 1.5).cos() + x).sigmoid()
        assert torch.equal(out.cpu(), ((x_cpu * 1.5).cos() + x_cpu).sigmoid())  # replay: eager's bits
        pid = compiler.compile_worker_pid()
        if not killed and pid is not None and ae.pending_compiles() > 0:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    _run_until_compiled(step, min_steps=20)
    assert killed
    counters = ae.counters()
    assert counters["compiles_failed"] == 1 and counters["compiled_launches"] == 0, counters
    notes = [g["note"] for g in ae.graphs() if g["note"]]
    assert any("compile worker died (killed by SIGKILL)" in n for n in notes), ae.graphs()

    y = torch.randn(4096, device="neuron")
    _run_until_compiled(lambda _: ((y * y).exp() - y).sum().item(), min_steps=4)
    assert ae.counters()["compiles_succeeded"] >= 1, ae.graphs()
    assert compiler.compile_worker_pid() not in (None, killed[0])


def test_the_worker_compiles_the_code_an_in_process_compile_would(monkeypatch):
    """The compiled tier's numbers are what TorchInductor in the user's process made:
    the worker compiles with the parent's settings (here one thread: Inductor splits a
    reduction by the thread count, which changes its rounding; the count must also reach
    the cache keys, or code built for another count comes back from the disk cache)."""
    from torch._inductor.compile_fx import compile_fx

    from neuron_lab.adaptive_eager import fx_graph

    compiled_graphs = []
    original = compiler._compile

    def keep(request):
        code = original(request)
        compiled_graphs.append((compiler.describe(request), code))
        return code

    monkeypatch.setattr(compiler, "_compile", keep)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        neuron_lab.configure(compile=True, compile_after=2)
        x = torch.randn(1 << 20, device="neuron")
        _run_until_compiled(lambda _: ((x * 1.3).sin().sum() * 2).item(), min_steps=3)
        assert len(compiled_graphs) == 1, ae.graphs()
        description, from_worker = compiled_graphs[0]
        module, examples = fx_graph.build_graph_module(description)
        with torch.no_grad(), torch._inductor.config.patch(force_disable_caches=True):  # fresh code
            in_process = compile_fx(module, examples)
        generator = torch.Generator().manual_seed(0)
        inputs = [torch.randn(e.shape, generator=generator, dtype=e.dtype) for e in examples]
        expected, actual = [t.clone() for t in inputs], [t.clone() for t in inputs]
        in_process(*expected)
        from_worker(actual)
    finally:
        torch.set_num_threads(threads)
    for e, a in zip(expected, actual):
        assert torch.equal(e, a)


def test_a_library_cut_short_in_the_cache_is_named_for_removal(tmp_path):
    """A compile killed while writing its library (a kernel restart kills the worker) leaves a
    short file that Inductor would load at every later compile of that code ("file too
    short"): the compiler knows it as damaged, in its own cache only, and compiles again."""
    from neuron_lab import files

    short = files.cache_subdir("inductor") / "test-damaged" / "cabc.main.so"
    short.parent.mkdir(exist_ok=True)
    short.write_bytes(b"\x7fELF")
    try:
        error = RuntimeError(f"InductorError: ImportError: {short}: file too short")
        assert compiler.damaged_cache_file(error) == short.resolve()
        assert compiler.damaged_cache_file(RuntimeError(f"ImportError: {short}: undefined symbol: f")) is None
        elsewhere = tmp_path / "user.so"
        assert compiler.damaged_cache_file(RuntimeError(f"ImportError: {elsewhere}: file too short")) is None
    finally:
        short.unlink()
        short.parent.rmdir()
