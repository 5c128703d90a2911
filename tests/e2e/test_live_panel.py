"""The live panel in a real browser: it moves while a cell runs, not only when the cell ends.

A notebook shows ``%neuron_dashboard``, then runs a cell that trains for several seconds
(and keeps a little more device memory every half second), then a cell that runs out of
device memory. When the training cell starts, the test docks the panel beside the notebook
with the output's context menu ("Create New View for Cell Output", JupyterLab's own, no
extension). While the training cell's prompt still reads ``[*]`` the test reads the
panel's text from the DOM every 0.15 s (with its time): the header must name the running cell, and the
launch count in its graph-cache table must change at least twice, over at least a second,
in the notebook and in the docked view.
Updates that arrive only when a cell ends (no live thread) show neither. Then the failed
cell must be in the panel's cell chart.

The pictures ``live_panel.png`` (the panel mid-cell) and ``live_panel_docked.png`` (the
window, with the panel docked) land in the artifacts folder;
scripts/screenshots.sh copies them to docs/img/.
"""

from __future__ import annotations

import re
import time

import pytest

from tests.e2e.test_browser import RUN_ALL_DONE_JS, describe_cells, open_and_run_all

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

NOTEBOOK = "neuron_lab_live_panel.ipynb"
TRAIN_SECONDS = 6.0
CELLS = [
    "%load_ext neuron_lab",
    "import time, torch, neuron_lab\n"
    # Graphs stay recorded where the host runs launches, so the panel's launch count moves.
    "neuron_lab.configure(run_at_once_on_host=False)\n"
    "torch.manual_seed(0)\n"
    "model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to('neuron')\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
    "x, y = torch.randn(128, 256, device='neuron'), torch.randint(0, 10, (128,), device='neuron')\n"
    "def step():\n"
    "    opt.zero_grad()\n"
    "    loss = torch.nn.functional.cross_entropy(model(x), y)\n"
    "    loss.backward()\n"
    "    opt.step()\n"
    "    return loss\n"
    "step().item()",
    "%neuron_dashboard",
    # Trains for TRAIN_SECONDS, keeping 1 MiB more device memory every half second.
    "kept, steps, started = [], 0, time.monotonic()\n"
    f"while time.monotonic() - started < {TRAIN_SECONDS}:\n"
    "    loss = step().item()\n"
    "    steps += 1\n"
    "    if len(kept) < (time.monotonic() - started) * 2:\n"
    "        kept.append(torch.empty(256, 1024, device='neuron'))\n"
    "steps",
    "too_big = torch.empty(1 << 46, dtype=torch.uint8, device='neuron')  # runs out of device memory",
]
DASHBOARD_CELL, TRAIN_CELL, OOM_CELL = 2, 3, 4
CELL_NAMES = ("load", "model", "dashboard", "train", "out of memory")
# One reading of the page: is the training cell running (the cell before it has finished, it
# has not: Run All marks every queued cell [*]), and what the panel says.
READ_PANEL_JS = """
(trainIndex) => {
  const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')];
  const before = prompts[trainIndex - 1], train = prompts[trainIndex];
  const panel = document.querySelector('.jp-Notebook .jupyter-widgets.neuron-dashboard');
  const docked = document.querySelector('.jp-LinkedOutputView .jupyter-widgets.neuron-dashboard');
  return {running: !!before && /\\[\\d+\\]/.test(before.textContent) && !!train && train.textContent.includes('*'),
          t: performance.now(), text: panel ? panel.innerText : null, docked: docked ? docked.innerText : null};
}"""
ACTIVATE_NOTEBOOK_JS = """
() => {
  const shell = window.jupyterapp.shell;
  const notebook = Array.from(shell.widgets('main')).find(w => w.sessionContext);
  shell.activateById(notebook.id);
}"""
LAUNCHES = re.compile(r"launches \(graphs\)\s+(\d+)")


def test_the_live_panel_changes_while_a_cell_runs_and_charts_a_failed_cell(page, jupyter_server, artifacts_dir):
    from playwright.sync_api import expect

    started = time.monotonic()
    cells = open_and_run_all(page, jupyter_server, NOTEBOOK, CELLS,
                             viewport={"width": 1800, "height": 1000})  # room for the notebook and the docked panel
    notebook = page.locator(".jp-NotebookPanel .jp-Notebook")

    # Wait for the training cell to start with the panel shown, then read the panel until it ends.
    page.wait_for_function(
        "(i) => { const r = (" + READ_PANEL_JS + ")(i); return r.running && !!r.text; }",
        arg=TRAIN_CELL, timeout=90_000, polling=100,
    )
    dashboard = notebook.locator(".jupyter-widgets.neuron-dashboard")
    # Dock it beside the notebook as a user would (no extension): the output's context menu.
    cells.nth(DASHBOARD_CELL).locator(".jp-OutputArea-output").first.click(button="right", position={"x": 60, "y": 8})
    page.get_by_role("menuitem", name=re.compile(r"^Create New View for (Cell )?Output$")).click()
    expect(page.locator(".jp-LinkedOutputView .jupyter-widgets.neuron-dashboard")).to_be_visible(timeout=10_000)
    # It opens below the notebook; drag its tab to the right edge to keep it beside the notebook.
    tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="Output View")
    tab_box, main_box = tab.bounding_box(), page.locator("#jp-main-dock-panel").bounding_box()
    page.mouse.move(tab_box["x"] + tab_box["width"] / 2, tab_box["y"] + tab_box["height"] / 2)
    page.mouse.down()
    right_edge = (main_box["x"] + main_box["width"] - 10, main_box["y"] + main_box["height"] / 2)
    page.mouse.move(*right_edge, steps=12)
    page.mouse.move(*right_edge)
    page.mouse.up()
    page.evaluate(ACTIVATE_NOTEBOOK_JS)  # the new view took the focus; the checks below read the notebook's kernel
    cells.nth(TRAIN_CELL).evaluate("cell => cell.scrollIntoView({block: 'center'})")
    readings, pictured = [], False
    deadline = time.monotonic() + TRAIN_SECONDS * 4 + 30
    while time.monotonic() < deadline:
        reading = page.evaluate(READ_PANEL_JS, TRAIN_CELL)
        if not reading["running"]:
            break
        readings.append(reading)
        if not pictured and reading["t"] - readings[0]["t"] > TRAIN_SECONDS * 1000 / 2:
            page.mouse.move(0, 0)
            dashboard.screenshot(path=str(artifacts_dir / "live_panel.png"))
            page.screenshot(path=str(artifacts_dir / "live_panel_docked.png"))
            pictured = True
        page.wait_for_timeout(150)
    page.wait_for_function(RUN_ALL_DONE_JS, timeout=120_000)

    # Live readings: taken while the cell ran, with the panel naming the running cell.
    def launch_counts(key: str) -> list[tuple[float, int]]:
        return [(r["t"], int(m.group(1))) for r in readings
                if re.search(r"running In \[\d+\]", r[key] or "") and (m := LAUNCHES.search(r[key]))]

    def changes_of(counts: list[tuple[float, int]]) -> list[tuple[float, int]]:
        return [(t, n) for (t, n), (_, before) in zip(counts[1:], counts[:-1]) if n != before]

    live = launch_counts("text")
    changes = changes_of(live)
    docked_changes = changes_of(launch_counts("docked"))
    summary = (f"{len(readings)} readings while the cell ran, {len(live)} naming it; launch count changes "
               f"(ms, launches): {[(round(t - readings[0]['t']), n) for t, n in changes]}\n"
               f"first panel text: {readings[0]['text'] if readings else None!r}\n"
               f"last panel text: {readings[-1]['text'] if readings else None!r}\n{describe_cells(cells, CELL_NAMES)}")
    assert len(changes) >= 2, "the panel did not change twice while the cell ran: " + summary
    assert changes[-1][0] - changes[0][0] >= 1000, "the changes came in one burst, not over time: " + summary
    assert len(docked_changes) >= 2, "the docked view did not change twice while the cell ran: " + summary
    header_texts = {r["text"].splitlines()[0] for r in readings if r["text"]}
    assert len(header_texts) >= 3, "the header (running cell and its time) did not move: " + summary
    assert pictured, summary

    # After the run: the out-of-memory cell is in the chart, marked failed.
    oom = cells.nth(OOM_CELL)
    expect(oom.locator('[data-mime-type="application/vnd.jupyter.stderr"]')).to_contain_text("OutOfMemoryError")
    oom_count = re.search(r"\d+", oom.locator(".jp-InputPrompt").inner_text()).group()
    expect(dashboard).to_contain_text(f"after In [{oom_count}] (failed)", timeout=15_000)
    bars = [t.strip() for t in dashboard.locator("svg g title").all_text_contents()]
    failed = [t for t in bars if t.startswith(f"In [{oom_count}] failed")]
    assert failed and "OutOfMemoryError" in failed[0], bars
    train_count = re.search(r"\d+", cells.nth(TRAIN_CELL).locator(".jp-InputPrompt").inner_text()).group()
    assert any(t.startswith(f"In [{train_count}]\n") for t in bars), bars
    print(f"live panel: {len(changes)} launch-count changes in {len(live)} readings; "
          f"test body {time.monotonic() - started:.1f}s")
