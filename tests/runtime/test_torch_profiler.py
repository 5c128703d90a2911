"""torch.profiler sees the device: ProfilerActivity.PrivateUse1 gives kernels on per-core,
per-stream lanes, linked (and flowed) to the CPU op that recorded them, device time in
key_averages(), source lines, modelled times and memory events; Holistic Trace Analysis
reads the trace; the profilers' own waits are never the user's."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import neuron_lab
from neuron_lab.device import trace as device_trace

ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


def here() -> int:
    return sys._getframe(1).f_lineno


def device_events(prof):
    return [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1]


def workload(x: torch.Tensor, steps: int = 3) -> tuple[list[float], int]:
    values = []
    for _ in range(steps):
        values.append((x @ x + 1).relu().sum().item()); line = here()  # noqa: E702
    return values, line


@pytest.mark.parametrize("mode", ["adaptive", "eager"])
def test_device_kernels_are_linked_to_the_cpu_ops_that_recorded_them(mode, tmp_path):
    x = torch.randn(64, 64, device="neuron")
    torch.neuron.synchronize()
    with neuron_lab.mode(mode):
        workload(x, steps=1)  # warm: the graph exists
        with profile(activities=ACTIVITIES, profile_memory=True) as prof:
            values, line = workload(x)
    expected = ((x.cpu() @ x.cpu() + 1).relu().sum().item())
    assert values == pytest.approx([expected] * 3, rel=1e-4)

    kernels = [e for e in device_events(prof) if e.name == "neuron::mm"]
    assert len(kernels) == 3, sorted({e.name for e in device_events(prof)})
    averages = {e.key: e for e in prof.key_averages()}
    kernel_us = sum(k.self_device_time_total for k in kernels)
    assert kernel_us > 0 and averages["neuron::mm"].self_device_time_total == pytest.approx(kernel_us)
    # The CPU op that recorded each kernel (aten::mm's out= call inside aten::mm) has its time.
    cpu_mm = [e for e in prof.events() if e.name == "aten::mm" and e.device_type == torch.autograd.DeviceType.CPU]
    assert sum(e.self_device_time_total for e in cpu_mm) == pytest.approx(kernel_us)
    assert averages["aten::matmul"].device_time_total == pytest.approx(kernel_us)
    table = prof.key_averages().table(sort_by="device_time_total", row_limit=20)
    assert "Self NEURON" in table and "neuron::mm" in table  # torch names the columns by the backend

    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    names = {(e["pid"], e.get("tid"), e["args"]["name"]) for e in events if e.get("ph") == "M" and "args" in e
             and e["name"] in ("process_name", "thread_name")}
    assert (0, 0, "neuron:0") in names and (0, 0, "stream 0") in names
    mm_kernels = [e for e in events if e.get("ph") == "X" and e["name"] == "neuron::mm"]
    assert len(mm_kernels) == 3 and all(e["cat"] == "kernel" and (e["pid"], e["tid"]) == (0, 0) for e in mm_kernels)
    for k in mm_kernels:
        args = k["args"]
        assert args["source"] == f"{__file__}:{line} in workload"
        assert args["op"] in ("aten::mm", "aten::mm.out") and "Float[64, 64]" in args["shapes"]
        assert args["flops"] == 2 * 64 ** 3 and args["modelled us"] > 0 and args["emulated us"] >= 0
        assert args["External id"] > 0  # the CPU op that recorded it
    # Every kernel's arrow starts on the host, at the op's recording or its launch.
    starts = {e["id"]: e for e in events if e.get("ph") == "s" and e.get("cat") == "ac2g"}
    ends = {e["id"]: e for e in events if e.get("ph") == "f" and e.get("cat") == "ac2g"}
    assert ends and set(ends) <= set(starts)
    assert all(starts[i]["pid"] != 0 and ends[i]["pid"] == 0 for i in ends)
    # Memory: torch.profiler's [memory] events of the device.
    memory = [e for e in events if e.get("name") == "[memory]" and e["args"].get("Device Type") == 20]
    assert memory and any(e["args"]["Bytes"] > 0 for e in memory) and any(e["args"]["Bytes"] < 0 for e in memory)


def test_two_cores_and_two_streams_get_lanes_of_their_own(tmp_path):
    if torch.neuron.device_count() < 2:
        pytest.skip("needs two NeuronCores (NEURON_LAB_CORES)")
    a = torch.randn(32, 32, device="neuron:0")
    b = torch.randn(32, 32, device="neuron:1")
    side = torch.neuron.Stream(device="neuron:0")
    torch.neuron.synchronize(0), torch.neuron.synchronize(1)
    with profile(activities=ACTIVITIES) as prof:
        (a @ a).sum().item()
        (b @ b).sum().item()
        with torch.neuron.stream(side):
            c = (a * 2).sum()
        torch.neuron.current_stream().wait_stream(side)
        c.item()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    lanes = {(e["pid"], e["tid"]) for e in events if e.get("cat") == "kernel"}
    assert {(0, 0), (1, 0), (0, side.stream_id)} <= lanes
    processes = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert processes[0] == "neuron:0" and processes[1] == "neuron:1"


def inline_beside_a_graph(x: torch.Tensor) -> float:
    """Reads a value whose work is done (.item(): an inline kernel on the host thread) while a
    long graph still runs on the stream."""
    done = x.sum()
    torch.neuron.synchronize()
    y = x
    for _ in range(30):
        y = y @ x
    y.sum()  # pending work, launched by the next read
    value = done.item()
    y.sum().item()
    return value


def assert_lanes_run_in_order(events: list[dict], category: str, kind_of) -> None:
    """Each lane's spans of ``category`` never overlap; inline kernels have lanes of their own."""
    spans = [e for e in events if e.get("ph") == "X" and e.get("cat") == category]
    inline = [e for e in spans if kind_of(e) == "inline"]
    graphs = [e for e in spans if kind_of(e) == "graph"]
    assert inline and graphs, sorted({(e["name"], kind_of(e)) for e in spans})
    lanes: dict = {}
    for e in spans:
        lanes.setdefault((e["pid"], e["tid"]), []).append(e)
    for lane, on_lane in lanes.items():
        on_lane.sort(key=lambda e: e["ts"])
        for a, b in zip(on_lane, on_lane[1:]):
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3, (lane, a["name"], a["ts"], a["dur"], b["name"], b["ts"])
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert all(names[(e["pid"], e["tid"])] == "stream 0 inline (host thread)" for e in inline), names
    assert all(names[(e["pid"], e["tid"])] == "stream 0" for e in graphs), names


def test_a_lane_runs_in_order_even_with_an_inline_kernel_beside_a_graph(tmp_path):
    # Tools read a lane as one stream's kernels in order (Holistic Trace Analysis's idle time
    # went negative when an inline kernel sat on the stream's lane beside a running graph).
    x = torch.randn(128, 128, device="neuron") / 128**0.5
    with neuron_lab.mode("adaptive"):
        with profile(activities=ACTIVITIES) as prof:
            value = inline_beside_a_graph(x)
        with neuron_lab.profiler.profile() as own:
            inline_beside_a_graph(x)
    assert value == pytest.approx(x.cpu().sum().item(), rel=1e-4)
    prof.export_chrome_trace(str(tmp_path / "torch.json"))
    events = json.loads((tmp_path / "torch.json").read_text())["traceEvents"]
    assert_lanes_run_in_order(events, "kernel", lambda e: e["args"].get("launch"))
    # "stream" in a kernel's args is the stream it ran in order on (what HTA reads): none inline.
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert all(e["args"]["inline for stream"] == 0 and "stream" not in e["args"]
               for e in kernels if e["args"]["launch"] == "inline")
    assert all(e["args"]["stream"] == 0 for e in kernels if e["args"]["launch"] == "graph")
    # neuron_lab.profiler's own trace: launches, one span each.
    own_events = json.loads(own.export_chrome_trace(tmp_path / "own.json").read_text())["traceEvents"]
    spans = [e for e in own_events if e.get("ph") == "X" and e.get("cat") in ("graph", "inline")]
    for e in spans:
        e["args"]["kind_of_launch"] = e["cat"]
        e["cat"] = "launch span"
    assert_lanes_run_in_order(own_events, "launch span", lambda e: e["args"]["kind_of_launch"])


def test_profile_with_torch_profiler_gives_key_averages_and_its_trace(tmp_path):
    x = torch.randn(48, 48, device="neuron")
    torch.neuron.synchronize()
    with neuron_lab.profiler.profile(torch_profiler=True) as prof:
        for _ in range(2):
            (x @ x).sum().item()
    assert prof.torch is not None
    assert {e.key: e for e in prof.torch.key_averages()}["aten::mm"].device_time_total > 0
    path = prof.export_chrome_trace(tmp_path / "trace.json")
    kernels = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("name") == "neuron::mm"]
    # The same launches in both views: one recorder.
    assert len(kernels) == sum(1 for l in prof.launches for o in l.ops if o.name == "aten::mm") == 2
    same = neuron_lab.profiler.from_torch_profiler()
    assert [l.id for l in same.launches] == [l.id for l in prof.launches]
    with torch.profiler.profile(activities=ACTIVITIES):
        with pytest.raises(RuntimeError, match="already running"):
            neuron_lab.profiler.profile(torch_profiler=True).start()


def test_a_profilers_own_waits_are_never_the_users():
    x = torch.randn(64, 64, device="neuron")
    torch.neuron.synchronize()
    with neuron_lab.explain_scope() as outer:
        with neuron_lab.profiler.profile():
            y = x @ x  # pending at the profile's end: finishing it is the profiler's wait
        with profile(activities=ACTIVITIES):
            z = x * 3
    waits = [e for e in outer.events if e.kind == "sync"]
    assert any(e.by_profiler for e in waits)  # they happened, and are marked
    assert all(not e.by_profiler for e in outer.sync_events) and not outer.sync_events
    assert "host waits (" not in str(outer)
    totals = device_trace.totals()
    assert totals["profiler_wait_ns"] > 0
    torch.testing.assert_close(y.cpu(), x.cpu() @ x.cpu()), torch.testing.assert_close(z.cpu(), x.cpu() * 3)


def test_holistic_trace_analysis_reads_the_trace(tmp_path):
    try:
        import hta.trace_analysis as hta
    except ImportError as error:  # in the test extra: CI (CI set) installs it, so there it must be
        if os.environ.get("CI"):
            pytest.fail(f"HolisticTraceAnalysis is in the test extra but does not import: {error}", pytrace=False)
        pytest.skip("HolisticTraceAnalysis is not installed (pip install -e '.[test]')")
    x = torch.randn(96, 96, device="neuron")
    torch.neuron.synchronize()
    with profile(activities=ACTIVITIES) as prof:
        for _ in range(3):
            (x @ x).relu().sum().item()
    folder = tmp_path / "traces"
    folder.mkdir()
    prof.export_chrome_trace(str(folder / "rank0.json"))
    analyzer = hta.TraceAnalysis(trace_dir=str(folder))
    kernels = analyzer.get_gpu_kernel_breakdown(visualize=False)[1]
    assert "neuron::mm" in set(kernels["name"])
    temporal = analyzer.get_temporal_breakdown(visualize=False)
    assert float(temporal["kernel_time(us)"].sum()) > 0
    idle = analyzer.get_idle_time_breakdown(visualize=False)[0]
    assert len(idle) > 0
