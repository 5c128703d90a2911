"""The IPython extension, driven through a real InteractiveShell: %load_ext/%unload_ext, the
per-cell line and its attribution, asynchronous errors, and every magic with good and bad input."""

from __future__ import annotations

import gc
import json
import os

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

import neuron_lab
import neuron_lab.adaptive_eager as ae
from neuron_lab.magics.autotime import CellTimer, _CellFinisher, timer_for
from neuron_lab.magics.display import CellExplanation, MemoryReport, StatusReport, format_bytes
from neuron_lab.magics.magics import NeuronMagics

from conftest import run_python

MAGICS = ("neuron_memory", "neuron_mode", "neuron_status", "neuron_explain", "neuron_autotime",
          "neuron_dashboard")


# ---- a real shell --------------------------------------------------------------------------


# `shell` and `ip` (a real InteractiveShell, with the extension loaded) come from conftest.


class Cell:
    """What running one cell gave: the ExecutionResult, the printed text, the rich outputs."""

    def __init__(self, shell: InteractiveShell, code: str) -> None:
        with capture_output() as captured:
            self.result = shell.run_cell(code, store_history=True)
        self.text = captured.stdout + captured.stderr
        self.outputs = captured.outputs
        self.error = self.result.error_in_exec or self.result.error_before_exec

    @property
    def lines(self) -> list[str]:
        return self.text.splitlines()


def run(shell: InteractiveShell, code: str) -> Cell:
    return Cell(shell, code)


def ok(shell: InteractiveShell, code: str) -> Cell:
    cell = Cell(shell, code)
    assert cell.error is None, cell.text
    return cell


def usage_error(shell: InteractiveShell, code: str) -> Cell:
    cell = Cell(shell, code)
    assert isinstance(cell.error, UsageError), (cell.error, cell.text)
    assert "Traceback" not in cell.text, cell.text
    return cell


def summary_lines(cell: Cell, timer: CellTimer) -> list[str]:
    """The per-cell lines this cell printed (compared with the line of its own record)."""
    record = timer.record_of(cell.result.execution_count)
    if record is None or not record.used_device:
        return []
    return [line for line in cell.lines if line == record.explanation.summary_line()]


def our_callbacks(shell: InteractiveShell, event: str) -> list:
    return [cb for cb in shell.events.callbacks[event] if isinstance(getattr(cb, "__self__", None), CellTimer)]


# ---- load and unload -----------------------------------------------------------------------


def test_load_prints_one_line_with_devices_mode_and_memory(shell: InteractiveShell) -> None:
    with capture_output() as captured:
        shell.run_line_magic("load_ext", "neuron_lab")
    try:
        lines = captured.stdout.strip().splitlines()
        assert len(lines) == 1, captured.stdout
        count = torch.neuron.device_count()
        capacity = torch.neuron.mem_get_info(0)[1]
        assert f"{count} NeuronCore" in lines[0]
        assert f"{format_bytes(capacity)} per core" in lines[0]
        assert f"mode {neuron_lab.get_mode()}" in lines[0]
    finally:
        with capture_output():
            shell.run_line_magic("unload_ext", "neuron_lab")


def test_loading_twice_is_harmless(ip: InteractiveShell) -> None:
    again = ok(ip, "%load_ext neuron_lab")
    assert "already loaded" in again.text
    with capture_output():
        neuron_lab.load_ipython_extension(ip)  # called directly: no second set of hooks
    assert len(our_callbacks(ip, "pre_run_cell")) == 1
    assert len(our_callbacks(ip, "post_run_cell")) == 1
    assert sum(isinstance(t, _CellFinisher) for t in ip.ast_transformers) == 1
    cell = ok(ip, "a = torch.ones(8, device='neuron') * 2")
    assert len(summary_lines(cell, timer_for(ip))) == 1


def test_unload_removes_every_magic_hook_and_transformer(ip: InteractiveShell) -> None:
    before = {event: list(callbacks) for event, callbacks in ip.events.callbacks.items()}
    ok(ip, "%unload_ext neuron_lab")
    assert our_callbacks(ip, "pre_run_cell") == [] and our_callbacks(ip, "post_run_cell") == []
    assert not any(isinstance(t, _CellFinisher) for t in ip.ast_transformers)
    magics = ip.magics_manager.magics
    assert not [name for name in list(magics["line"]) + list(magics["cell"]) if name.startswith("neuron_")]
    assert "NeuronMagics" not in dict(ip.magics_manager.registry)
    assert timer_for(ip) is None
    after = {event: list(callbacks) for event, callbacks in ip.events.callbacks.items()}
    for event in after:  # nothing else was touched
        assert [c for c in before[event] if not isinstance(getattr(c, "__self__", None), CellTimer)] == after[event]

    cell = ok(ip, "b = torch.ones(8, device='neuron') * 2\nb.sum().item()")
    assert cell.result.result == 16.0
    assert "wall" not in cell.text and "neuron" not in cell.text
    assert "not found" in usage_error(ip, "%neuron_status").text
    assert "not found" in usage_error(ip, "%%neuron_profile\nc = 1").text
    ok(ip, "%load_ext neuron_lab")  # and it loads again
    assert len(summary_lines(ok(ip, "c = torch.ones(8, device='neuron') + 1"), timer_for(ip))) == 1


def test_reload_ext_keeps_one_timer(ip: InteractiveShell) -> None:
    ok(ip, "%reload_ext neuron_lab")
    assert len(our_callbacks(ip, "post_run_cell")) == 1
    cell = ok(ip, "d = torch.ones(8, device='neuron') - 1")
    assert len(summary_lines(cell, timer_for(ip))) == 1


def test_importing_neuron_lab_and_the_twins_needs_no_ipython() -> None:
    done = run_python("""
        import sys
        import neuron_lab, neuron_lab.magics
        text = str(neuron_lab.magics.memory_report()) + str(neuron_lab.magics.status())
        assert "neuron:0" in text, text
        assert "IPython" not in sys.modules and "ipywidgets" not in sys.modules, "imported"
        print("ok")
    """)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


# ---- the per-cell line ---------------------------------------------------------------------


def test_a_line_after_device_cells_and_nothing_after_others(ip: InteractiveShell) -> None:
    timer = timer_for(ip)
    device = ok(ip, "x = torch.randn(64, 64, device='neuron')\ny = (x @ x).relu() * 2")
    assert len(summary_lines(device, timer)) == 1
    assert device.lines[-1] == timer.record_of(device.result.execution_count).explanation.summary_line()
    host = ok(ip, "z = 1 + 1\nprint('host only')")
    assert host.text == "host only\n"
    record = timer.record_of(host.result.execution_count)
    assert record is not None and not record.used_device
    assert ok(ip, "w = 3").text == ""


def test_numbers_belong_to_the_cell_that_queued_the_work(ip: InteractiveShell) -> None:
    timer = timer_for(ip)
    allocated = torch.neuron.memory_allocated(0)
    first = ok(ip, "a = torch.ones(4096, device='neuron')\nfor _ in range(5):\n    a = a * 1.5 + 1")
    # the cell's work is finished by the time its line is printed: nothing is left queued
    launches = ae.counters()["launches"]
    torch.neuron.synchronize()
    assert ae.counters()["launches"] == launches
    assert ae.queue_depth(0, 0) == 0
    record = timer.record_of(first.result.execution_count)
    assert record.used_device and record.succeeded
    assert record.explanation.launches >= 1
    assert record.explanation.memory_delta_bytes == torch.neuron.memory_allocated(0) - allocated
    assert record.explanation.peak_bytes >= 4096 * 4

    second = ok(ip, "n = 7")
    assert not timer.record_of(second.result.execution_count).used_device
    third = ok(ip, "del a")
    assert timer.record_of(third.result.execution_count).explanation.memory_delta_bytes < 0  # its free
    assert [r.execution_count for r in timer.records][-3:] == [
        first.result.execution_count, second.result.execution_count, third.result.execution_count]


def test_the_last_expression_is_still_displayed(ip: InteractiveShell) -> None:
    cell = ok(ip, "v = torch.ones(5, device='neuron')\nv.sum().item()")
    assert cell.result.result == 5.0
    assert ip.user_ns["Out"][cell.result.execution_count] == 5.0
    quiet = ok(ip, "v.sum().item();")
    assert quiet.result.result is None
    ip.ast_node_interactivity = "last_expr_or_assign"
    assigned = ok(ip, "s = v.sum().item() * 2")
    assert assigned.result.result == 10.0


def test_nested_run_cell_and_time_count_as_one_cell(ip: InteractiveShell) -> None:
    timer = timer_for(ip)
    before = len(timer.records)
    captured = ok(ip, "%%capture out\nq = torch.ones(16, device='neuron') * 3\nprint('inside')")
    assert ip.user_ns["out"].stdout.startswith("inside")
    assert len(timer.records) == before + 1
    assert timer.records[-1].execution_count == captured.result.execution_count
    timed = ok(ip, "%time r = torch.ones(16, device='neuron') + 1")
    assert len(timer.records) == before + 2 and timer.records[-1].used_device
    assert len(summary_lines(timed, timer)) == 1


# ---- asynchronous errors -------------------------------------------------------------------


BAD_INDEX = "bad = torch.tensor([0, 9], device='neuron')\n"
# x, and one index_select already run. index_select is recorded (its result shape comes from
# a C++ shape rule): a bad index is found by the CPU kernel when the queued op runs, later.
X_AND_INDEX_SELECT = "x = torch.randn(4, 5, device='neuron')\nx.index_select(0, torch.tensor([0, 1], device='neuron'))"


def test_an_async_error_is_the_error_of_the_cell_that_queued_it(ip: InteractiveShell) -> None:
    timer = timer_for(ip)
    ok(ip, X_AND_INDEX_SELECT)
    failing = run(ip, BAD_INDEX + "picked = x.index_select(0, bad)\nreached_the_end = True")
    assert isinstance(failing.error, IndexError), failing.text
    assert "failed on neuron" in str(failing.error)
    assert "IndexError" in failing.text  # shown as the cell's traceback
    assert ip.user_ns["reached_the_end"] is True  # queued without error; raised at the cell's end
    assert not failing.result.success
    record = timer.record_of(failing.result.execution_count)
    assert not record.succeeded and record.error.startswith("IndexError")
    assert len(summary_lines(failing, timer)) == 1  # the numbers are still shown

    after = ok(ip, "float((x * 2).sum().item() - (x.sum() * 2).item())")  # the kernel is still usable
    assert abs(after.result.result) < 1e-4
    assert timer.record_of(after.result.execution_count).succeeded


def test_an_async_error_in_the_last_expression_is_not_displayed(ip: InteractiveShell) -> None:
    ok(ip, X_AND_INDEX_SELECT)
    failing = run(ip, BAD_INDEX + "x.index_select(0, bad)")
    assert isinstance(failing.error, IndexError), failing.text
    assert failing.result.result is None
    ok(ip, "torch.neuron.synchronize()")  # reported once


def test_an_async_error_behind_a_python_error_is_shown_too(ip: InteractiveShell) -> None:
    timer = timer_for(ip)
    ok(ip, X_AND_INDEX_SELECT)
    failing = run(ip, BAD_INDEX + "x.index_select(0, bad)\nraise ValueError('boom')")
    assert isinstance(failing.error, ValueError)
    assert "boom" in failing.text and "IndexError" in failing.text
    assert "device work this cell queued before it stopped" in failing.text
    assert not timer.record_of(failing.result.execution_count).succeeded
    ok(ip, "torch.neuron.synchronize()\n(x + 1).sum().item()")


def test_a_syntax_error_cell_is_harmless(ip: InteractiveShell) -> None:
    cell = run(ip, "def broken(:\n    pass")
    assert isinstance(cell.result.error_before_exec, SyntaxError)
    ok(ip, "e = torch.ones(2, device='neuron') * 2")


# ---- %neuron_autotime and %neuron_explain --------------------------------------------------


def test_autotime_off_hides_the_line_but_keeps_the_explanation(ip: InteractiveShell) -> None:
    assert ok(ip, "%neuron_autotime").text.strip() == "neuron per-cell timing: on"
    assert ok(ip, "%neuron_autotime off").text.strip() == "neuron per-cell timing: off"
    quiet = ok(ip, "h = torch.ones(32, device='neuron') * 4")
    assert quiet.text == ""
    explained = ok(ip, "%neuron_explain")
    assert isinstance(explained.result.result, CellExplanation)
    assert explained.result.result.record.execution_count == quiet.result.execution_count
    ok(ip, "%neuron_autotime on")
    assert len(summary_lines(ok(ip, "h = h + 1"), timer_for(ip))) == 1


@pytest.mark.parametrize("line", ["maybe", "on off", "--on"])
def test_autotime_bad_input(ip: InteractiveShell, line: str) -> None:
    usage_error(ip, f"%neuron_autotime {line}")


def test_explain_the_previous_device_cell(ip: InteractiveShell) -> None:
    nothing = ok(ip, "%neuron_explain")
    assert "No cell has used the neuron device" in nothing.text and nothing.result.result is None
    device = ok(ip, "k = torch.randn(8, 8, device='neuron')\nk = k @ k")
    ok(ip, "host = 1")
    explained = ok(ip, "%neuron_explain").result.result
    label = f"In [{device.result.execution_count}]"
    assert explained.record.execution_count == device.result.execution_count
    assert str(explained).startswith(label) and str(explained.explanation) in str(explained)
    assert label in explained._repr_html_()
    by_number = ok(ip, f"%neuron_explain {device.result.execution_count}").result.result
    assert by_number.record is explained.record


@pytest.mark.parametrize("line", ["999999", "abc", "1 2"])
def test_explain_bad_input(ip: InteractiveShell, line: str) -> None:
    usage_error(ip, f"%neuron_explain {line}")


# ---- %neuron_memory, %neuron_mode, %neuron_status ------------------------------------------


def test_memory_of_every_core_and_of_one(ip: InteractiveShell) -> None:
    ok(ip, "m = torch.empty(1024, device='neuron:0')")
    report = ok(ip, "%neuron_memory").result.result
    assert isinstance(report, MemoryReport)
    assert [d.index for d in report.devices] == list(range(torch.neuron.device_count()))
    assert report.devices[0].allocated == torch.neuron.memory_allocated(0)
    assert report.devices[0].capacity == torch.neuron.mem_get_info(0)[1]
    assert "neuron:0" in str(report) and "<table" in report._repr_html_()
    last = torch.neuron.device_count() - 1
    for spelling in (str(last), f"neuron:{last}"):
        one = ok(ip, f"%neuron_memory {spelling}").result.result
        assert [d.index for d in one.devices] == [last]
        assert f"neuron:{last} memory summary" in str(one)


@pytest.mark.parametrize("line", ["99", "cpu", "neuron:99", "0 1", "-1"])
def test_memory_bad_device(ip: InteractiveShell, line: str) -> None:
    usage_error(ip, f"%neuron_memory {line}")


def test_mode_shows_and_sets(ip: InteractiveShell) -> None:
    assert ok(ip, "%neuron_mode").lines == ["neuron mode: adaptive"]
    assert ok(ip, "%neuron_mode eager").lines[0] == "neuron mode: eager (was adaptive)"  # then its line (a sync)
    assert neuron_lab.get_mode() == "eager"
    ok(ip, "%neuron_mode blocking")
    assert neuron_lab.get_mode() == "blocking"
    ok(ip, "%neuron_mode adaptive")


def test_mode_choices_are_the_runtimes_modes() -> None:
    (action,) = [a for a in NeuronMagics.neuron_mode.parser._actions if a.dest == "mode"]
    assert tuple(action.choices) == ae.MODES


@pytest.mark.parametrize("line", ["turbo", "eager blocking", "-x"])
def test_mode_bad_input(ip: InteractiveShell, line: str) -> None:
    cell = usage_error(ip, f"%neuron_mode {line}")
    assert neuron_lab.get_mode() == "adaptive", cell.text


def test_status_lists_devices_streams_and_the_graph_cache(ip: InteractiveShell) -> None:
    ok(ip, "s = torch.ones(16, device='neuron') * 2")
    report = ok(ip, "%neuron_status").result.result
    assert isinstance(report, StatusReport)
    assert report.mode == "adaptive"
    assert {(s.device, s.stream_id) for s in report.streams} >= {(0, 0)}
    assert all(s.queue_depth == 0 for s in report.streams)  # every cell's work is finished
    text = str(report)
    assert "queued" in text and "cached graphs" in text and "neuron:0" in text
    assert report._repr_html_().count("<table") == 4  # memory, streams, counters, the per-cell line's parts
    usage_error(ip, "%neuron_status now")


def test_reading_statistics_is_not_using_the_device(ip: InteractiveShell) -> None:
    device = ok(ip, "g = torch.ones(16, device='neuron') * 2")
    for magic in ("%neuron_memory", "%neuron_status", "%neuron_memory 0"):
        cell = ok(ip, magic)
        assert "neuron: wall" not in cell.text, magic
    assert ok(ip, "%neuron_explain").result.result.record.execution_count == device.result.execution_count


# ---- %%neuron_profile ----------------------------------------------------------------------


def test_profile_with_every_option(ip: InteractiveShell, tmp_path) -> None:
    trace, parquet = tmp_path / "trace.json", tmp_path / "launches.parquet"
    cell = ok(ip, (f"%%neuron_profile --sort count --top 5 --timeline --memory --trace {trace} "
                   f"--parquet {parquet} --explain -o prof\n"
                   "p = torch.ones(64, device='neuron') * 3\n"
                   "p.sum().item()"))
    assert cell.result.result == 192.0  # the body's last expression is still the cell's value
    prof = ip.user_ns["prof"]
    assert callable(prof.table) and callable(prof.explain)
    kinds = [sorted(output.data) for output in cell.outputs]
    assert sum("text/html" in k for k in kinds) >= 2  # the table and the explanation
    assert sum("image/png" in k for k in kinds) == 2  # timeline and memory
    assert all(output.data["text/plain"] for output in cell.outputs)
    assert json.loads(trace.read_text()) is not None
    assert parquet.stat().st_size > 0
    assert f"Chrome trace written to {trace}" in cell.text
    assert len(summary_lines(cell, timer_for(ip))) == 1


@pytest.mark.parametrize("key", ["device_time", "host_time", "count", "name"])
def test_profile_sort_keys(ip: InteractiveShell, key: str) -> None:
    cell = ok(ip, f"%%neuron_profile --sort {key} --top 3\nt = torch.ones(8, device='neuron') + 2")
    assert len(cell.outputs) == 1
    assert {"text/plain", "text/html"} <= set(cell.outputs[0].data)
    assert cell.result.result is None


@pytest.mark.parametrize(
    "options",
    ["--sort bogus", "--sort", "--top 0", "--top x", "-o 1abc", "-o", "--trace", "--trace /",
     "--parquet", "--bogus", "extra", "--timeline=yes"],
)
def test_profile_bad_options_never_run_the_cell(ip: InteractiveShell, options: str) -> None:
    ip.user_ns.pop("ran", None)
    usage_error(ip, f"%%neuron_profile {options}\nran = True")
    assert "ran" not in ip.user_ns


@pytest.mark.parametrize("option", ["--trace", "--parquet"])
def test_profile_refuses_a_symbolic_link_as_its_output_before_running_the_cell(
        ip: InteractiveShell, tmp_path, option: str) -> None:
    """A link planted at the export path: refused up front, the cell not run, the link's
    target as it was."""
    target = tmp_path / "precious"
    target.write_text("precious content")
    link = tmp_path / "out.json"
    link.symlink_to(target)
    ip.user_ns.pop("ran", None)
    cell = usage_error(ip, f"%%neuron_profile {option} {link}\nran = True")
    assert "symbolic link" in str(cell.error) and str(target) in str(cell.error)
    assert "ran" not in ip.user_ns and target.read_text() == "precious content" and link.is_symlink()


def test_profile_of_an_empty_cell_is_a_usage_error(ip: InteractiveShell) -> None:
    usage_error(ip, "%%neuron_profile\n\n")


def test_profile_errors_are_the_cells_errors(ip: InteractiveShell) -> None:
    failing = run(ip, "%%neuron_profile -o failed_prof\nu = torch.ones(4, device='neuron') * 2\n"
                      "raise ValueError('inside')")
    assert isinstance(failing.error, ValueError)
    assert "raise ValueError('inside')" in failing.text  # the user's line in the traceback
    assert "In[{}], line 3".format(failing.result.execution_count) in failing.text
    assert callable(ip.user_ns["failed_prof"].table)  # what ran is kept for a look
    ok(ip, "x = torch.randn(4, 5, device='neuron')")
    asynchronous = run(ip, "%%neuron_profile\n" + BAD_INDEX + "x.index_select(0, bad)\ny = 1")
    assert isinstance(asynchronous.error, IndexError), asynchronous.text
    ok(ip, "(x * 1).sum().item()")


def test_every_magic_documents_its_options_and_its_plain_python_twin() -> None:
    assert "--sort" in NeuronMagics.neuron_profile.__doc__ and "-o VAR" in NeuronMagics.neuron_profile.__doc__
    for name in ("neuron_profile", *MAGICS):
        assert "twin" in getattr(NeuronMagics, name).__doc__, name


def test_rich_outputs_have_readable_text(ip: InteractiveShell) -> None:
    ok(ip, "f = torch.ones(4, device='neuron') * 2")
    for magic in ("%neuron_memory", "%neuron_memory 0", "%neuron_status", "%neuron_explain"):
        value = ok(ip, magic).result.result
        data, _ = ip.display_formatter.format(value)
        assert "text/html" in data and " object at 0x" not in data["text/plain"], magic
        assert "neuron" in data["text/plain"] or "In [" in data["text/plain"], magic


# ---- cells named as IPython names them ------------------------------------------------------


def test_profiles_and_explanations_name_cells_as_ipython_does(ip: InteractiveShell) -> None:
    """A line of a cell reads ``In[N], line L`` (IPython's tracebacks say ``Cell In[N], line
    L``), not the file name the kernel compiled the cell to."""
    cell = ok(ip, "import neuron_lab, torch\n"
                  "with neuron_lab.profiler.profile() as cell_prof, neuron_lab.explain_scope() as cell_why:\n"
                  "    cell_total = (torch.ones(8, device='neuron') * 2).sum().item()")
    count = cell.result.execution_count
    prof, why = ip.user_ns["cell_prof"], ip.user_ns["cell_why"]
    assert f"In[{count}], line 3" in str(prof.table()), str(prof.table())
    assert f"Cell In[{count}], line 3" in str(why), str(why)
    launch = next(l for l in prof.launches if l.source is not None)
    assert launch.source.short == f"In[{count}], line 3"
    # Outside IPython's cells the file's own name stays.
    from neuron_lab.observability.records import SourceLine
    assert SourceLine("/work/train.py", 12, "step").short == "train.py:12"


# ---- profiling does not bill the user ---------------------------------------------------------


def test_the_profilers_rendering_is_not_billed_to_the_cell(ip: InteractiveShell, monkeypatch) -> None:
    """The cell's line ends with the profiled code: the table's rendering (here made slow on
    purpose, a probe) comes after it."""
    import time

    from neuron_lab.observability.table import ProfileTable

    rendering_s = 1.0
    original = ProfileTable._repr_html_

    def slow_render(self):
        time.sleep(rendering_s)
        return original(self)

    monkeypatch.setattr(ProfileTable, "_repr_html_", slow_render)
    started = time.perf_counter()
    cell = ok(ip, "%%neuron_profile\nbilled = (torch.ones(64, device='neuron') * 3).sum().item()")
    took = time.perf_counter() - started
    assert took >= rendering_s
    record = timer_for(ip).record_of(cell.result.execution_count)
    assert record.used_device and record.explanation.wall_s < took - 0.8 * rendering_s, (
        record.explanation.wall_s, took)


def test_explain_never_lists_the_profilers_waits_as_the_users(ip: InteractiveShell) -> None:
    cell = ok(ip, "%%neuron_profile --explain\n"
                  "pending = torch.ones(64, 64, device='neuron') @ torch.ones(64, 64, device='neuron')")
    record = timer_for(ip).record_of(cell.result.execution_count)
    from neuron_lab.observability.records import format_source

    lines = [format_source(e.source) for e in record.explanation.sync_events]
    assert not any("run_cell_magic" in line or "IPython" in line for line in lines), lines
    assert not any(e.by_profiler for e in record.explanation.sync_events)
    shown = str(ok(ip, f"%neuron_explain {cell.result.execution_count}").result.result)
    assert "run_cell_magic" not in shown and "host waits (" not in shown, shown


def test_torch_profiler_names_cell_lines_as_ipython_does(ip: InteractiveShell, tmp_path) -> None:
    path = tmp_path / "trace.json"
    cell = ok(ip, "from torch.profiler import ProfilerActivity, profile as torch_profile\n"
                  "with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as tp:\n"
                  "    tv = (torch.ones(8, 8, device='neuron') @ torch.ones(8, 8, device='neuron')).sum().item()\n"
                  f"tp.export_chrome_trace({str(path)!r})")
    events = json.loads(path.read_text())["traceEvents"]
    sources = {e["args"].get("source") for e in events if e.get("cat") == "kernel"}
    assert f"Cell In[{cell.result.execution_count}], line 3" in sources, sources
