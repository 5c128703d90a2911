"""The ipywidgets dashboard, driven through a real InteractiveShell (no browser): its widget
state after a few cells, failed cells, the timing chart, unload, and its text fallback."""

from __future__ import annotations

import gc
import os
import re

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

import neuron_lab
from neuron_lab.magics.autotime import timer_for
from neuron_lab.magics.dashboard import Dashboard
from neuron_lab.magics.display import format_bytes

from conftest import unload_extension

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


# `shell` and `ip` (a real InteractiveShell, with the extension loaded) come from conftest.


def run(shell: InteractiveShell, code: str):
    with capture_output() as captured:
        result = shell.run_cell(code, store_history=True)
    return result, captured


def ok(shell: InteractiveShell, code: str):
    result, captured = run(shell, code)
    assert result.success, captured.stdout + captured.stderr
    return result, captured


def show_dashboard(shell: InteractiveShell, options: str = "") -> Dashboard:
    _, captured = ok(shell, f"%neuron_dashboard {options}")
    (output,) = [o for o in captured.outputs if WIDGET_MIME in o.data]
    assert "neuron dashboard" in output.data["text/plain"]  # terminals and nbval read this
    dashboards = [d for d in _live() if d.widget.model_id == output.data[WIDGET_MIME]["model_id"]]
    assert len(dashboards) == 1
    return dashboards[0]


def _live() -> list[Dashboard]:
    from neuron_lab.magics.dashboard import _LIVE

    return list(_LIVE)


def test_the_dashboard_follows_memory_streams_graph_cache_and_cells(ip: InteractiveShell) -> None:
    dashboard = show_dashboard(ip)
    assert "neuron-dashboard" in dashboard.widget._dom_classes
    assert len(dashboard.memory_bars) == torch.neuron.device_count()
    updates = dashboard.updates

    first, _ = ok(ip, "big = torch.ones(256, 1024, device='neuron:0')\nbig = big * 2 + 1")
    second, _ = ok(ip, "host = 1")
    third, _ = ok(ip, "for _ in range(3):\n    small = torch.ones(64, device='neuron') * 3 + 1")
    assert dashboard.updates == updates + 3  # after every cell, from post_run_cell

    for index, (bar, memory) in enumerate(zip(dashboard.memory_bars, dashboard.memory)):
        assert memory.allocated == torch.neuron.memory_allocated(index)
        assert bar.value == memory.allocated and bar.max == torch.neuron.mem_get_info(index)[1]
    assert dashboard.memory[0].allocated >= 256 * 1024 * 4
    assert f"allocated {format_bytes(dashboard.memory[0].allocated)}" in dashboard.memory_labels[0].value
    assert {(s.device, s.stream_id) for s in dashboard.streams} >= {(0, 0)}
    assert all(s.queue_depth == 0 for s in dashboard.streams)
    counters = neuron_lab.adaptive_eager.counters()
    assert dashboard.counters["cache_hits"] == counters["cache_hits"]
    assert f"<td>cache hits</td><td style='text-align:right'>{counters['cache_hits']}</td>" \
        in dashboard.graph_cache_html.value
    assert [r.execution_count for r in dashboard.chart_cells][-2:] == [
        first.execution_count, third.execution_count]  # the host-only cell is not charted
    assert dashboard.chart_html.value.count("<rect") == 2 * len(dashboard.chart_cells)
    assert f"after In [{third.execution_count}]" in dashboard.header.value
    assert second.execution_count not in [r.execution_count for r in dashboard.chart_cells]


def test_a_failed_cell_leaves_the_dashboard_consistent(ip: InteractiveShell) -> None:
    dashboard = show_dashboard(ip)
    ok(ip, "x = torch.randn(4, 5, device='neuron')")
    failed, _ = run(ip, "bad = torch.tensor([0, 9], device='neuron')\nkept = torch.ones(128, device='neuron')\n"
                        "x.index_select(0, bad)")
    assert isinstance(failed.error_in_exec, IndexError)
    last = dashboard.chart_cells[-1]
    assert last.execution_count == failed.execution_count and not last.succeeded
    assert "#d62728" in dashboard.chart_html.value  # drawn in red
    assert "(failed)" in dashboard.header.value
    assert dashboard.memory[0].allocated == torch.neuron.memory_allocated(0)  # read after the failure
    assert all(s.queue_depth == 0 for s in dashboard.streams)
    after, _ = ok(ip, "(x + 1).sum().item()")
    assert dashboard.chart_cells[-1].execution_count == after.execution_count
    assert dashboard.chart_cells[-1].succeeded and "(failed)" not in dashboard.header.value


def test_the_chart_keeps_the_last_n_cells(ip: InteractiveShell) -> None:
    dashboard = show_dashboard(ip, "--cells 2")
    counts = [ok(ip, f"c{i} = torch.ones(8, device='neuron') * {i}")[0].execution_count for i in range(3)]
    assert [r.execution_count for r in dashboard.chart_cells] == counts[1:]


@pytest.mark.parametrize("options", ["--cells 0", "--cells x", "--bogus", "extra"])
def test_dashboard_bad_options(ip: InteractiveShell, options: str) -> None:
    result, captured = run(ip, f"%neuron_dashboard {options}")
    assert isinstance(result.error_in_exec, UsageError)
    assert "Traceback" not in captured.stdout + captured.stderr


def test_refresh_button_and_text_fallback(ip: InteractiveShell) -> None:
    dashboard = Dashboard(cells=5, shell=ip)
    updates = dashboard.updates
    dashboard.refresh_button.click()
    assert dashboard.updates == updates + 1
    text = repr(dashboard)
    assert text.startswith("neuron dashboard (mode adaptive")
    assert "neuron:0" in text and "graph cache:" in text and "queued launches:" in text
    bundle = dashboard._repr_mimebundle_()
    assert bundle["text/plain"] == text and WIDGET_MIME in bundle
    dashboard.close()
    assert dashboard._repr_mimebundle_() == {"text/plain": repr(dashboard)}


def test_unload_stops_the_dashboards(ip: InteractiveShell) -> None:
    dashboard = show_dashboard(ip)
    unload_extension(ip)
    updates = dashboard.updates
    ok(ip, "y = torch.ones(8, device='neuron') * 2")
    assert dashboard.updates == updates and not dashboard.following
    assert "not updating" in dashboard.header.value


def test_a_dashboard_without_the_extension_times_cells_quietly(shell: InteractiveShell) -> None:
    assert timer_for(shell) is None
    dashboard = neuron_lab.Dashboard(cells=3)  # the running shell, found by itself
    try:
        assert dashboard.shell is shell and dashboard.following
        result, captured = ok(shell, "z = torch.ones(8, device='neuron') + 1")
        assert captured.stdout == ""  # no per-cell line without %load_ext
        assert dashboard.chart_cells[-1].execution_count == result.execution_count
        with capture_output() as loaded:  # loading later adopts the same timer and turns the line on
            shell.run_line_magic("load_ext", "neuron_lab")
        assert "NeuronCore" in loaded.stdout
        assert timer_for(shell) is dashboard.timer and dashboard.timer.printing
        _, captured = ok(shell, "z = z + 1")
        assert captured.stdout.strip() == dashboard.chart_cells[-1].explanation.summary_line()
    finally:
        unload_extension(shell)


# ---- live: while cells run ---------------------------------------------------------------------


def test_the_panel_updates_while_a_cell_runs(ip: InteractiveShell) -> None:
    """The live thread updates the widgets during a running cell (the browser test checks that
    the page shows it): at least once a second, with the running cell and memory over time."""
    dashboard = show_dashboard(ip, "--interval 0.25")
    ip.user_ns["dashboard"] = dashboard
    result, _ = ok(ip, "import time\n"
                       "x = torch.ones(256, 256, device='neuron')\n"
                       "seen = []\n"
                       "start = time.monotonic()\n"
                       "while time.monotonic() - start < 2.0:\n"
                       "    x = (x @ x).tanh()\n"
                       "    x.sum().item()\n"
                       "    seen.append((time.monotonic() - start, dashboard.ticks, dashboard.header.value))\n")
    seen = ip.user_ns["seen"]
    n = result.execution_count
    # ticks in every second of the cell
    for second in (0, 1):
        ticks = {t for at, t, _ in seen if second + 0.3 <= at < second + 1.0}
        assert len(ticks) >= 2, seen[-5:]
    assert any(f"running In [{n}] for " in header for _, _, header in seen)
    during = [s for s in dashboard.samples if s.time >= dashboard.samples[-1].time - 2.5]
    assert len(during) >= 4 and all(len(s.allocated) == torch.neuron.device_count() for s in during)
    assert "<polyline" in dashboard.memory_chart_html.value
    assert "launches / s" in dashboard.activity_html.value and "busy" in dashboard.activity_html.value
    assert f"after In [{n}]" in dashboard.header.value  # the cell's end: the full update
    dashboard.stop()
    assert not dashboard.live


def test_the_panel_counts_ops_run_at_once_beside_launches(ip: InteractiveShell) -> None:
    """Where graphs do not pay (shapes that never repeat, as generate()'s), the runtime runs ops
    at once and launches nothing: the panel shows those ops per second, not an idle device."""
    dashboard = show_dashboard(ip, "--interval 0")
    dashboard.tick()
    ok(ip, "w = torch.randn(8, 8, device='neuron')\n"
           "for n in range(1, 121):\n"
           "    torch.tanh(torch.randn(n, 8, device='neuron') @ w).softmax(-1).sum(0)\n")
    dashboard.tick()
    per_second = re.search(r"ops run at once / s</td><td[^>]*>(\d+)<", dashboard.activity_html.value)
    assert per_second is not None, dashboard.activity_html.value
    assert int(per_second.group(1)) > 0
    assert dashboard.samples[-1].ops_at_once > dashboard.samples[0].ops_at_once


def test_a_tick_never_waits_for_the_device(ip: InteractiveShell) -> None:
    dashboard = show_dashboard(ip, "--interval 0")
    assert not dashboard.live
    syncs = sum(neuron_lab.adaptive_eager.counters()["syncs"].values())
    pending = torch.ones(1024, device="neuron") * 3 + 1  # recorded, not run
    dashboard.tick()
    assert sum(neuron_lab.adaptive_eager.counters()["syncs"].values()) == syncs
    assert dashboard.ticks == 1
    pending.sum().item()


def test_a_tick_moves_the_memory_label_with_its_bar(ip: InteractiveShell) -> None:
    """The text beside a memory bar says what the bar shows: a tick that moves the bar moves
    the label's allocated bytes too (before, the label kept the last cell's number)."""
    dashboard = show_dashboard(ip, "--interval 0")
    kept = torch.empty(3 * 1024 * 1024, dtype=torch.uint8, device="neuron")
    dashboard.tick()
    live = dashboard.samples[-1].allocated[0]
    assert dashboard.memory_bars[0].value == live
    assert f"allocated {format_bytes(live)} ·" in dashboard.memory_labels[0].value
    assert "(after the last cell)" in dashboard.memory_labels[0].value
    del kept


def test_failed_out_of_memory_and_interrupted_cells_are_charted(ip: InteractiveShell) -> None:
    dashboard = show_dashboard(ip)
    oom, _ = run(ip, "huge = torch.empty(2**40, device='neuron')")
    assert isinstance(oom.error_in_exec, torch.OutOfMemoryError)
    stopped, _ = run(ip, "raise KeyboardInterrupt")
    assert isinstance(stopped.error_in_exec, KeyboardInterrupt)
    charted = dashboard.chart_cells[-2:]
    assert [r.execution_count for r in charted] == [oom.execution_count, stopped.execution_count]
    assert not charted[0].succeeded and not charted[0].interrupted and "OutOfMemoryError" in charted[0].error
    assert charted[1].interrupted
    assert "#d62728" in dashboard.chart_html.value and "#e6550d" in dashboard.chart_html.value  # red, orange
    assert "(interrupted)" in dashboard.header.value
    assert "INTERRUPTED" in repr(dashboard) and "FAILED" in repr(dashboard)
