"""The per-cell line's time parts: each defined (TIME_PARTS, %neuron_status, README), none
larger than wall, and the host's parts with "other" adding up to wall, whatever the mode and
whatever other threads do meanwhile."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

import neuron_lab
from neuron_lab.observability.explain import TIME_PARTS, format_seconds

ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(r"^neuron: wall (?P<wall>\S+ \S+) = (?P<parts>[^|]+) \| device busy (?P<device>\S+ \S+)"
                  r"(?: \| compile (?P<compile>\S+ \S+) \(background\))? \| \d+ launches \(.*\) \| \d+ syncs \| peak ")
UNITS = {"s": 1.0, "ms": 1e-3, "µs": 1e-6}


def seconds(text: str) -> float:
    value, unit = text.split()
    return float(value) * UNITS[unit]


def check_parts(e) -> None:
    """The invariants of one Explanation and of its line."""
    host = e.host_tracing_s + e.sync_wait_s + e.host_running_ops_s
    assert 0 <= host <= e.wall_s + 1e-9, (host, e.wall_s)
    assert abs(host + e.other_s - e.wall_s) < 1e-9
    for name, value in (("device busy", e.device_s), ("compile", e.compile_s)):
        assert 0 <= value <= e.wall_s, (name, value, e.wall_s)
    match = LINE.match(e.summary_line())
    assert match, e.summary_line()
    shown = {}
    for part in match["parts"].strip().split(" + "):
        name, value, unit = part.rsplit(" ", 2)
        shown[name] = f"{value} {unit}"
    assert {"recording", "waiting", "other"} <= set(shown) <= {"recording", "waiting", "running ops", "other"}
    # The shown parts add up to the shown wall, within the rounding of what is shown.
    texts = list(shown.values()) + [match["wall"]]
    rounding = sum({"s": 0.005, "ms": 5e-5, "µs": 5e-7}[t.split()[1]] for t in texts)
    assert abs(sum(seconds(t) for t in shown.values()) - seconds(match["wall"])) <= rounding + 1e-12, e.summary_line()
    assert seconds(match["device"]) <= seconds(match["wall"])


def train_steps(device: str, steps: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 64, device=device)
    for _ in range(steps):
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    loss.item()


def test_the_parts_add_up_to_wall_in_each_mode(mode: str) -> None:
    with neuron_lab.explain_scope() as e:
        train_steps("neuron", 20)
    check_parts(e)
    assert e.sync_wait_s > 0  # loss.item() waited
    if mode == "blocking":
        assert e.host_running_ops_s > 0  # blocking mode runs every op on the calling thread
    else:
        assert e.host_tracing_s > 0


def test_two_cores_busy_at_once_count_once() -> None:
    """Device busy is the time some launch ran, not the sum over cores and streams."""
    a = torch.randn(512, 512, device="neuron:0")
    b = torch.randn(512, 512, device="neuron:1")
    torch.neuron.synchronize()
    with neuron_lab.explain_scope() as e:
        for _ in range(6):
            a = (a @ a).tanh()
            b = (b @ b).tanh()
        torch.neuron.synchronize(0)
        torch.neuron.synchronize(1)
    check_parts(e)
    assert e.device_s > 0


def test_other_threads_recording_do_not_count_in_a_region() -> None:
    """A region's host parts are its own thread's: two threads recording ops all along
    would make the process-wide recording time larger than the region's wall time."""
    stop = threading.Event()

    def record() -> None:
        x = torch.ones(64, device="neuron")
        while not stop.is_set():
            for _ in range(50):
                x = x * 1.0001 + 0.5
            x.sum().item()

    threads = [threading.Thread(target=record) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        with neuron_lab.explain_scope() as e:
            deadline = time.perf_counter() + 0.5
            while time.perf_counter() < deadline:  # this thread: mostly its own Python
                sum(range(1000))
            (torch.ones(4, device="neuron") + 1).sum().item()
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    check_parts(e)
    assert e.other_s > e.host_tracing_s  # the region itself mostly ran Python


def test_the_line_and_status_define_every_part(ip: InteractiveShell) -> None:
    with capture_output() as captured:
        ip.run_cell("z = (torch.ones(256, 256, device='neuron') * 2).sum().item()", store_history=True)
    (line,) = [l for l in captured.stdout.splitlines() if l.startswith("neuron: wall")]
    assert LINE.match(line), line
    with capture_output() as status:
        ip.run_cell("%neuron_status", store_history=True)
    text = status.stdout + "".join(o.data.get("text/plain", "") for o in status.outputs)
    for part, meaning in TIME_PARTS.items():
        assert f"{part}: {meaning}" in text, part
    readme = (ROOT / "README.md").read_text()
    for part in TIME_PARTS:
        assert f"*{part}*" in readme, f"README does not define the per-cell line's part {part!r}"


def test_format_seconds_keeps_three_digits() -> None:
    assert [format_seconds(s) for s in (1.5, 0.7375, 0.0123, 0.000870)] == ["1.50 s", "737.5 ms", "12.3 ms", "870 µs"]
