"""The observability layer: profiler table, timeline, Chrome trace, CSV/Parquet,
torch.profiler interop, the metrics report and explain()."""

from __future__ import annotations

import csv
import json
import sys

import pytest
import torch

import neuron_lab
from neuron_lab.observability.timeline import LANE_HOST

pytestmark = pytest.mark.usefixtures("adaptive")


@pytest.fixture
def adaptive():
    with neuron_lab.mode("adaptive"):
        yield
    torch.neuron.synchronize()


def here() -> int:
    """The caller's line number."""
    return sys._getframe(1).f_lineno


def known_workload(x: torch.Tensor, steps: int = 5) -> list[float]:
    values = []
    for _ in range(steps):
        y = (x * 2 + 1).sin().sum()
        values.append(y.item())
    return values


# ---- typed kinds ---------------------------------------------------------------------------

def test_launch_and_event_kinds_reach_python_typed() -> None:
    """Launch records and logged events carry LaunchKind / EventKind members (str enums made
    from the native kinds, equal to their words); a kind nobody defined is refused by name."""
    import pickle

    from neuron_lab.device import trace

    assert [k.value for k in trace.LaunchKind] == ["graph", "op", "inline", "event", "wait"]
    assert trace.EventKind.NEW_GRAPH == "new_graph" and f"{trace.EventKind.SYNC}" == "sync"
    assert pickle.loads(pickle.dumps(trace.LaunchKind.WAIT)) is trace.LaunchKind.WAIT
    since = trace.now_ns()
    handle = trace.start_profile()
    x = torch.arange(6.0, device="neuron")
    (x * 2).sum().item()
    torch.neuron.Event().record()
    torch.neuron.synchronize()
    launches = trace.stop_profile(handle)["launches"]
    kinds = {launch["kind"] for launch in launches}
    assert all(type(kind) is trace.LaunchKind for kind in kinds), kinds
    assert trace.LaunchKind.EVENT in kinds and kinds & {trace.LaunchKind.GRAPH, trace.LaunchKind.OP}, kinds
    trace.log_event(trace.EventKind.COMPILE, "graph 1", "a test", device=0)
    trace.log_event("compile_failed", "graph 2", "a test", device=0)
    events = trace.events_since(since)
    assert all(type(e["kind"]) is trace.EventKind for e in events), events
    assert [e["kind"] for e in events if e["detail"] == "a test"] == [
        trace.EventKind.COMPILE, trace.EventKind.COMPILE_FAILED]
    with pytest.raises(ValueError, match="launch_started"):
        trace.log_event("launch_started", "x", "y")
    assert set(trace.launch_times()) == {trace.LaunchKind.GRAPH, trace.LaunchKind.OP, trace.LaunchKind.INLINE}


# ---- the table ----------------------------------------------------------------------------

def test_table_rows_and_counts_for_a_known_workload():
    x = torch.randn(64, 64, device="neuron")
    torch.neuron.synchronize()
    with neuron_lab.profiler.profile() as prof:
        values = known_workload(x)
    assert values == pytest.approx([(x.cpu() * 2 + 1).sin().sum().item()] * 5, rel=1e-5)
    graphs = [l for l in prof.launches if l.kind == "graph"]
    assert len(graphs) == 5 and len({l.graph_id for l in graphs}) == 1, [l.name for l in graphs]
    assert all(l.n_ops == 4 and [o.name for o in l.ops] == ["aten::mul", "aten::add", "aten::sin", "aten::sum"]
               for l in graphs)
    assert all(l.status == "done" and l.tier == "replay" and l.start_ns >= l.enqueue_ns for l in graphs)
    assert all(l.source is not None and l.source.file == __file__ for l in graphs)

    table = prof.table(sort_by="count", top=0)
    rows = {r.name.split(" (")[0]: r for r in table.launch_rows}
    graph_row = rows[f"graph {graphs[0].graph_id}"]
    assert (graph_row.count, graph_row.ops, graph_row.kind) == (5, 20, "graph")
    assert rows["aten::_local_scalar_dense"].count == 5 and rows["aten::_local_scalar_dense"].kind == "inline"
    ops = {r.name: r for r in table.op_rows}
    for name in ("aten::mul", "aten::add", "aten::sin", "aten::sum"):
        assert ops[name].count == 5 and ops[name].device_ns > 0 and ops[name].host_ns > 0
    assert sum(r.share for r in table.launch_rows) == pytest.approx(1.0)

    text, page = str(table), table._repr_html_()
    assert "Launches per graph / kernel" in text and "aten::sin" in text
    assert "<table" in page and "aten::_local_scalar_dense" in page
    top1 = prof.table(sort_by="device_time", top=1)
    assert len(top1.launch_rows) == 1 and top1.total_launch_rows == len(table.launch_rows)
    assert "(1 of" in str(top1)


def test_each_op_of_a_long_function_carries_its_own_line(tmp_path):
    # 600 ops on 600 lines of one function (as in torch.compile's FX graphs), run twice:
    # more distinct instructions than the per-thread line cache holds, looked up in
    # order and then from the top again. Every op must name its own line.
    n_ops = 600
    body = "".join(f"    x = x + {i}\n" for i in range(n_ops))
    path = tmp_path / "long_function.py"
    path.write_text("def long_function(x):\n" + body + "    return x\n")
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    x = torch.zeros(4, device="neuron")
    torch.neuron.synchronize()
    neuron_lab.configure(run_unrepeated_at_once=False)  # record all 1200 (none run at once)
    try:
        with neuron_lab.profiler.profile() as prof:
            results = [namespace["long_function"](x) for _ in range(2)]
            torch.neuron.synchronize()
    finally:
        neuron_lab.configure(run_unrepeated_at_once=True)
    assert all(r.cpu().tolist() == [float(sum(range(n_ops)))] * 4 for r in results)
    ops = [o for launch in prof.launches for o in launch.ops if o.name == "aten::add"]
    assert len(ops) == 2 * n_ops
    assert all(o.source is not None and o.source.file == str(path) for o in ops)
    assert [o.source.line for o in ops] == list(range(2, 2 + n_ops)) * 2


def test_table_rejects_bad_arguments_with_the_fix():
    with neuron_lab.profiler.profile() as prof:
        (torch.ones(4, device="neuron") + 1).sum().item()
    with pytest.raises(ValueError, match="device_time, modelled_time, host_time, count, name"):
        prof.table(sort_by="speed")
    with pytest.raises(ValueError, match="top=-1"):
        prof.table(top=-1)


def test_profiler_start_stop_and_misuse():
    neuron_lab.profiler.start()
    with pytest.raises(RuntimeError, match="already called"):
        neuron_lab.profiler.start()
    (torch.ones(8, device="neuron") * 3).sum().item()
    prof = neuron_lab.profiler.stop()
    assert any(l.kind == "graph" for l in prof.launches)
    with pytest.raises(RuntimeError, match="without start"):
        neuron_lab.profiler.stop()


def test_nested_profiles_each_see_their_launches():
    x = torch.ones(16, device="neuron")
    with neuron_lab.profiler.profile() as outer:
        (x + 1).sum().item()
        with neuron_lab.profiler.profile() as inner:
            (x * 5).sum().item()
    inner_ids = {l.id for l in inner.launches}
    outer_ids = {l.id for l in outer.launches}
    assert inner_ids and inner_ids < outer_ids


# ---- the timeline ------------------------------------------------------------------------

def two_stream_workload():
    a = torch.randn(256, 256, device="neuron")
    torch.neuron.synchronize()
    side = torch.neuron.Stream()
    done = torch.neuron.Event()
    with neuron_lab.profiler.profile() as prof:
        b = (a @ a).relu()
        done.record()
        with torch.neuron.stream(side):
            side.wait_event(done)
            c = (b * 2).sum()
        torch.neuron.current_stream().wait_stream(side)
        total = c.item()
    return prof, side, total, a


def test_timeline_lanes_for_two_streams_with_an_event():
    prof, side, total, a = two_stream_workload()
    assert total == pytest.approx(((a.cpu() @ a.cpu()).relu() * 2).sum().item(), rel=1e-4)
    by_stream = {}
    for l in prof.launches:
        by_stream.setdefault(l.stream, []).append(l)
    assert set(by_stream) >= {0, side.stream_id}
    kinds_side = [l.kind for l in by_stream[side.stream_id]]
    assert "graph" in kinds_side  # (and a "wait" if the event was not reached yet when it was enqueued)
    # The event orders the streams: the side stream's graph starts after stream 0's graph ended.
    main_graph = next(l for l in by_stream[0] if l.kind == "graph")
    side_graph = next(l for l in by_stream[side.stream_id] if l.kind == "graph")
    assert side_graph.start_ns >= main_graph.end_ns

    timeline = prof.timeline()
    fig = timeline.figure()
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels[0] == LANE_HOST
    assert "neuron:0 stream 0" in labels and f"neuron:0 stream {side.stream_id}" in labels
    assert len(fig.axes[0].collections) >= 3  # bars on the host and on both stream lanes
    # The interactive timeline: the same lanes, a bar per launch and per op of a replayed graph.
    lanes = [lane["name"] for lane in timeline.data["lanes"]]
    assert lanes[0] == "host" and "neuron:0 stream 0" in lanes and f"neuron:0 stream {side.stream_id}" in lanes
    assert "memory neuron:0" in lanes
    tips = [bar[4] for bar in timeline.data["bars"]]
    assert any(t.startswith("aten::mm") and "emulated:" in t and "modelled:" in t for t in tips), tips[:5]
    page = timeline._repr_html_()
    assert "window.neuronTimeline(" in page and "<script>" in page and "http" not in page.split("<script>")[1]


def test_memory_timeline_marks_the_peak():
    with neuron_lab.profiler.profile() as prof:
        big = torch.ones(1024, 1024, device="neuron")
        big.sum().item()
        del big
        torch.neuron.synchronize()
    assert prof.memory, "allocations are sampled while profiling"
    peak = max(s.allocated for s in prof.memory if s.device == 0)
    assert peak >= 4 * 2**20
    fig = prof.memory_timeline()
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any(t.startswith("peak ") and f"{peak / 2**20:.1f}" in t for t in texts), texts


# ---- exports -------------------------------------------------------------------------------

def test_chrome_trace_has_tracks_flows_and_counters(tmp_path):
    prof, side, _, _ = two_stream_workload()
    path = prof.export_chrome_trace(tmp_path / "trace.json")
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    names = {(e["pid"], e.get("tid"), e["args"]["name"]) for e in events if e["ph"] == "M"}
    assert (0, 0, "host") in names and (1, 0, "neuron:0") in names
    assert (1, 0, "stream 0") in names and (1, side.stream_id, f"stream {side.stream_id}") in names
    device_launches = [l for l in prof.launches if l.kind in ("graph", "op", "event", "wait") and l.start_ns]
    starts = {e["id"] for e in events if e["ph"] == "s"}
    ends = {e["id"] for e in events if e["ph"] == "f"}
    assert starts == ends == {l.id for l in device_launches}
    slices = [e for e in events if e["ph"] == "X" and e["pid"] == 1]
    assert {e["tid"] for e in slices if e["cat"] != "inline"} == {0, side.stream_id}
    # Inline kernels (run on the host thread beside the stream) have a lane of their own.
    lane_names = {tid: name for pid, tid, name in names if pid == 1}
    assert all(lane_names[e["tid"]].endswith("inline (host thread)") for e in slices if e["cat"] == "inline")
    assert any(e["ph"] == "C" and e["name"] == "memory" for e in events)
    assert any(e["ph"] == "C" and e["name"] == "launches in flight" for e in events)
    assert any(e["ph"] == "X" and e.get("cat") == "sync" for e in events)


def test_csv_rows_match_the_launches(tmp_path):
    x = torch.randn(32, 32, device="neuron")
    torch.neuron.synchronize()
    with neuron_lab.profiler.profile() as prof:
        known_workload(x, steps=3)
    launches_path, ops_path = prof.export_csv(tmp_path / "run.csv")
    rows = list(csv.DictReader(open(launches_path)))
    assert [int(r["launch_id"]) for r in rows] == [l.id for l in prof.launches]
    assert [r["kind"] for r in rows] == [l.kind for l in prof.launches]
    op_rows = list(csv.DictReader(open(ops_path)))
    expected = sum(max(len(l.ops), 1) for l in prof.launches if l.kind not in ("event", "wait"))
    assert len(op_rows) == expected
    assert [r["op"] for r in op_rows[:4]] == ["aten::mul", "aten::add", "aten::sin", "aten::sum"]
    assert all(r["source_file"] == __file__ for r in op_rows[:4])


def test_parquet_rows_match_the_launches(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is in the test extra; CI installs it")
    x = torch.randn(32, 32, device="neuron")
    torch.neuron.synchronize()
    with neuron_lab.profiler.profile() as prof:
        known_workload(x, steps=2)
    launches_path, ops_path = prof.export_parquet(tmp_path / "run.parquet")
    launches = pq.read_table(launches_path).to_pylist()
    assert [r["launch_id"] for r in launches] == [l.id for l in prof.launches]
    assert [r["n_ops"] for r in launches] == [l.n_ops for l in prof.launches]
    ops = pq.read_table(ops_path).to_pylist()
    assert len(ops) == len(prof.op_table())


def test_parquet_without_pyarrow_says_how_to_install_it(tmp_path, monkeypatch):
    with neuron_lab.profiler.profile() as prof:
        (torch.ones(4, device="neuron") + 1).sum().item()
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(ImportError, match=r"pip install 'neuron_lab\[parquet\]'"):
        prof.export_parquet(tmp_path / "x.parquet")
    assert not (tmp_path / "x.parquet").exists()


# ---- torch.profiler ------------------------------------------------------------------------

def test_torch_profiler_sees_neuron_launches():
    # The device's lanes are ProfilerActivity.PrivateUse1's (tests/runtime/test_torch_profiler.py): a
    # CPU-only trace has the CPU ops, and no device events, also after a trace that asked for the
    # device (torch counts PRIVATEUSE1_RUNTIME among its CPU activity types).
    x = torch.randn(64, 64, device="neuron")
    torch.neuron.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.PrivateUse1]
    for wanted, expected in ((activities[:1], 0), (activities, 3), (activities[:1], 0), (activities[1:], 3)):
        with torch.profiler.profile(activities=wanted) as tp:
            for _ in range(3):
                (x * 2 + 1).relu().sum().item()
        keys = {e.key: e.count for e in tp.key_averages()}
        assert keys.get("aten::relu", 0) == (3 if activities[0] in wanted else 0), sorted(keys)
        assert keys.get("neuron::relu", 0) == expected, (wanted, sorted(keys))


# ---- metrics --------------------------------------------------------------------------------

def test_metrics_report_counts_launches_syncs_and_cache():
    x = torch.randn(33, 31, device="neuron")  # a shape no other test uses: its graph is new
    torch.neuron.synchronize()
    neuron_lab.metrics.reset()
    known_workload(x, steps=4)
    snap = neuron_lab.metrics.snapshot()
    c = snap["counters"]
    assert c["graph_launches"] == 4 and c["graphs_built"] == 1 and c["cache_hits"] == 3
    assert snap["launch_times"]["graph"].count == 4 and snap["launch_times"]["graph"].total_s > 0
    reads = snap["sync_times"]["aten::_local_scalar_dense"]
    assert reads.count == 4 and reads.p50_s <= reads.p99_s <= reads.max_s
    text = str(neuron_lab.metrics.report())
    for section in ("Graph cache", "Compiles", "Transfers", "Syncs by reason", "Timing distributions"):
        assert section in text
    assert "hit rate" in text and "75.0%" in text
    assert "<table>" in neuron_lab.metrics.report()._repr_html_()
    neuron_lab.metrics.reset()
    assert neuron_lab.metrics.snapshot()["counters"]["graph_launches"] == 0


# ---- explain --------------------------------------------------------------------------------

def test_explain_names_the_cause_and_line_of_a_recompile_and_a_sync():
    def step(x):
        y = (x * 3).exp()
        return y.mean()

    first = torch.randn(8, 16, device="neuron")
    second = torch.randn(4, 16, device="neuron")
    torch.neuron.synchronize()
    step(first).item()  # graph built for (8, 16)
    torch.neuron.synchronize()
    with neuron_lab.explain_scope() as e:
        loss = step(second)  # same ops, new shape: a recompile
        value_line = here() + 1
        value = loss.item()  # a host read: a sync
    assert value == pytest.approx((second.cpu() * 3).exp().mean().item(), rel=1e-5)
    (recompile,) = e.recompiles
    assert "Float[4, 16]" in recompile.detail and "Float[8, 16]" in recompile.detail
    assert recompile.source.file == __file__ and recompile.source.function == "step"
    syncs = e.sync_events
    assert [(s.what, s.source.line) for s in syncs] == [("aten::_local_scalar_dense", value_line)]
    text = str(e)
    assert "recompile" in text and "Float[4, 16]" in text
    assert f"test_profiler.py:{value_line}" in text and ".item()" in text
    assert e.used_device and e.graphs_built == 1 and e.syncs == 1 and e.launches == 1 and e.inline_ops == 1
    assert "Input shapes" in " ".join(e.advice())
    assert "<table" in e._repr_html_()
    assert e.summary_line().startswith("neuron: wall ")


def test_explain_says_what_differs_when_a_recompile_prints_the_same_inputs():
    """Two calls whose inputs print alike (same dtypes and shapes) can still need another
    graph: another memory layout, or other aliasing between the inputs. The explanation must
    name that, not show two identical signatures (generate() slices input_ids[:, -1:] out of
    a buffer that grows every token: the strides change, the shapes do not)."""

    def step(x, y):
        return (x * y).exp().sum()

    neuron_lab.adaptive_eager.forget_repeats()  # record, whatever earlier tests ran at once
    a, b = torch.randn(4, 16, device="neuron"), torch.randn(4, 16, device="neuron")
    transposed = torch.randn(16, 4, device="neuron").t()
    for _ in range(3):
        step(a, b).item()  # the graph for two distinct row-major [4, 16] tensors
    with neuron_lab.explain_scope() as e:
        step(a, a).item()  # the same shapes, one tensor twice
    (recompile,) = e.recompiles
    assert "as before, but argument 2 uses the graph's buffer 0 here and buffer 1" in recompile.detail
    assert "which tensors share memory differs" in recompile.detail and "Float[4, 16]" in recompile.detail
    with neuron_lab.explain_scope() as e:
        step(transposed, b).item()  # the same shapes, strides (1, 4)
    (recompile,) = e.recompiles
    assert "as before, but argument 1 has strides [1, 4] here and [16, 1]" in recompile.detail
    # A shape change still shows both signatures.
    with neuron_lab.explain_scope() as e:
        step(a[:3], b[:3]).item()
    (recompile,) = e.recompiles
    assert "Float[3, 16]" in recompile.detail and "Float[4, 16]" in recompile.detail


def test_a_recompile_prints_each_kind_of_argument():
    """The signatures a recompile shows are read back from the graph key: tensor lists,
    wrapped integers, int lists, booleans and None each print as the user wrote them (the
    ops are recorded in their out= form, so the result tensor is the last argument)."""

    def step(x, copies, k, dims):
        y = torch.cat([x] * copies, 0) * k
        return y.sum(dims, keepdim=True).sum()

    neuron_lab.adaptive_eager.forget_repeats()
    x = torch.randn(4, 8, device="neuron")
    for _ in range(3):
        step(x, 2, 3, [1]).item()
    cases = [  # each differs from the one before in one op (the graph compared with is the last built)
        ((3, 3, [1]), "aten::cat got inputs ([3 tensors], 0, Float[12, 8]); cached graph {} has "
                      "([2 tensors], 0, Float[8, 8])"),
        ((3, 5, [1]), "aten::mul got inputs (Float[12, 8], 5, Float[12, 8]); cached graph {} has "
                      "(Float[12, 8], 3, Float[12, 8])"),
        ((3, 5, [0]), "aten::sum got inputs (Float[12, 8], [0], True, None, Float[1, 8]); cached graph {} "
                      "has (Float[12, 8], [1], True, None, Float[12, 1])"),
    ]
    for args, expected in cases:
        with neuron_lab.explain_scope() as e:
            value = step(x, *args).item()
        assert value == pytest.approx(step(x.cpu(), *args).item(), rel=1e-5, abs=1e-5)
        (recompile,) = e.recompiles
        cached = recompile.detail.split("cached graph ")[1].split(" ")[0]
        assert expected.format(cached) in recompile.detail, recompile.detail


def test_every_host_wait_carries_a_typed_reason():
    from neuron_lab.observability.records import Reason

    x = torch.randn(4, 8, device="neuron")
    torch.neuron.synchronize()
    with neuron_lab.explain_scope() as e:
        (x * 2).sum().item()          # a host value
        (x + 1).cpu()                 # a copy to the host
        torch.nonzero(x > 0)          # an op that runs on the host
        (x - 1).resize_(2, 16)        # a metadata change
        torch.neuron.synchronize()
    reasons = [(s.reason, s.what) for s in e.sync_events]
    assert reasons == [(Reason.HOST_READ, "aten::_local_scalar_dense"), (Reason.COPY_TO_HOST, "copy to host"),
                       (Reason.INLINE_OP, "aten::nonzero"), (Reason.METADATA_CHANGE, "aten::resize_"),
                       (Reason.SYNCHRONIZE, "synchronize")], reasons
    assert Reason.COPY_TO_HOST.words == "copy to host"
    # Host reads are not listed as ops that cut graphs; the others are, with why.
    assert [ev.what for ev in e.inline_events] == ["aten::nonzero", "aten::resize_"]
    assert "changes metadata" in str(e)
    flushes = neuron_lab.adaptive_eager.counters()["flushes"]
    assert {"host read", "copy to host", "inline op", "metadata change"} <= set(flushes), flushes


def test_explain_lists_inline_ops_with_why():
    x = torch.tensor([0.0, 1.0, 0.0, 2.0], device="neuron")
    with neuron_lab.explain_scope() as e:
        idx = torch.nonzero(x)
    assert idx.cpu().flatten().tolist() == [1, 3]
    inline = [ev for ev in e.inline_events if ev.what == "aten::nonzero"]
    assert inline and "depends on data" in inline[0].detail
    assert inline[0].source.file == __file__
    assert "aten::nonzero" in str(e)


def test_explain_of_a_function_and_of_host_only_code():
    x = torch.ones(8, device="neuron")
    e = neuron_lab.explain(lambda t: (t + 1).sum().item())(x)
    assert e.result == 16.0 and e.used_device and e.syncs == 1
    quiet = neuron_lab.explain(lambda: sum(range(10)))()
    assert quiet.result == 45 and not quiet.used_device
    with pytest.raises(TypeError, match="explain_scope"):
        neuron_lab.explain(42)


def test_explain_scope_reports_an_async_error_after_filling_the_numbers():
    x = torch.ones(4, device="neuron")
    scope = neuron_lab.explain_scope()
    with pytest.raises(IndexError, match="index 7 is out of bounds"):
        with scope as e:
            bad = torch.tensor([0, 7], device="neuron")
            y = x[bad]  # out of range: raised asynchronously, at the scope's final wait
    assert e.launches >= 1 and e.wall_s > 0
    assert (x + 1).sum().item() == 8.0  # the runtime stays usable
