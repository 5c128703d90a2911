"""Real-browser end-to-end test: JupyterLab in headless Chromium, driven by Playwright.

The test writes a notebook that uses the Jupyter layer (``%load_ext neuron_lab``, per-cell
timing, ``%%neuron_profile``, ``%neuron_dashboard``), opens it in a private JupyterLab
(see conftest.py), runs all its cells from the Run menu as a user would, and checks what
renders in the page. Screenshots (the notebook, the profile table, the dashboard, a cell
with its per-cell line) go to ``test-artifacts/e2e/``; so do the server log and the
browser console, and on failure a screenshot and the page's HTML.

    .venv/bin/python -m pytest tests/e2e          # or: -m e2e / -m 'not e2e'
"""

from __future__ import annotations

import re
import time

import nbformat
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

NOTEBOOK = "neuron_lab_e2e.ipynb"

# One entry per code cell; the test refers to the cells by these names.
CELLS = {
    "load": "%load_ext neuron_lab",
    "device": (
        "import torch\n"
        'x = torch.randn(256, 256, device="neuron")\n'
        "y = (x @ x).sum()\n"
        "y.item()"
    ),
    "host_only": "sum(range(10))",
    "profile": "%%neuron_profile\nz = torch.relu(x @ x)\nz.sum().item()",
    "dashboard": "%neuron_dashboard",
    "after_dashboard": "w = torch.tanh(x @ x).mean()\nw.item()",
}
CELL_INDEX = {name: i for i, name in enumerate(CELLS)}

PER_CELL_LINE = re.compile(r"^neuron: wall .+ \| device .+ launches .+ peak ", re.MULTILINE)
STDOUT = '[data-mime-type="application/vnd.jupyter.stdout"]'
STDERR = '[data-mime-type="application/vnd.jupyter.stderr"]'  # stderr and tracebacks


def open_and_run_all(page, jupyter_server, name: str, sources, viewport: dict | None = None):
    """Writes a notebook of ``sources`` (one code cell each), opens it in JupyterLab once its
    kernel is idle, and starts Run > Run All Cells, as a user would; returns its code cells."""
    from playwright.sync_api import expect

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = jupyter_server.kernelspec
    nb.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    nbformat.write(nb, str(jupyter_server.root_dir / name))
    page.set_default_timeout(30_000)
    if viewport is not None:
        page.set_viewport_size(viewport)
    page.goto(jupyter_server.notebook_url(name))
    notebook = page.locator(".jp-NotebookPanel .jp-Notebook")
    expect(notebook).to_be_visible(timeout=60_000)
    cells = notebook.locator(".jp-CodeCell")
    expect(cells).to_have_count(len(sources))
    page.wait_for_function(KERNEL_IDLE_JS, timeout=60_000)
    page.evaluate("window.jupyterapp.shell.collapseLeft()")  # more room for the outputs
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
    return cells


_KERNEL = """
  const panel = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const session = panel && panel.sessionContext && panel.sessionContext.session;
  const kernel = session && session.kernel;
"""
KERNEL_IDLE_JS = "() => {" + _KERNEL + "return !!kernel && kernel.status === 'idle'; }"
# Run All has finished: the kernel is idle and no cell is queued or running ([*]); the
# first cell ran. (After an error JupyterLab leaves the later cells unrun: [ ].)
RUN_ALL_DONE_JS = (
    "() => {" + _KERNEL + """
  const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')];
  return prompts.length > 0 && /\\[\\d+\\]/.test(prompts[0].textContent)
    && !prompts.some(p => p.textContent.includes('*'))
    && !!kernel && kernel.status === 'idle';
}"""
)
# Height of a window that shows the whole notebook without scrolling it.
FULL_HEIGHT_JS = """
() => {
  const scroller = document.querySelector('.jp-NotebookPanel .jp-WindowedPanel-outer');
  return scroller ? window.innerHeight + scroller.scrollHeight - scroller.clientHeight : window.innerHeight;
}
"""
SCROLL_TO_TOP_JS = """
() => {
  const scroller = document.querySelector('.jp-NotebookPanel .jp-WindowedPanel-outer');
  if (scroller) scroller.scrollTop = 0;
}
"""


def describe_cells(cells, names=tuple(CELLS)) -> str:
    """Every cell's prompt and output text (``names``: the cells' names, in order): what a
    failing assertion prints."""
    lines = []
    for i in range(cells.count()):
        cell = cells.nth(i)
        prompt = cell.locator(".jp-InputPrompt").inner_text().strip()
        outputs = cell.locator(".jp-OutputArea-output").all_inner_texts()
        text = "\n".join(o.strip() for o in outputs) or "<no output>"
        lines.append(f"--- cell {i} {prompt} ({names[i] if i < len(names) else '?'})\n{text}")
    return "\n".join(lines)


def test_notebook_runs_and_renders(page, jupyter_server, artifacts_dir):
    from playwright.sync_api import expect

    started = time.monotonic()
    cells = open_and_run_all(page, jupyter_server, NOTEBOOK, list(CELLS.values()))
    notebook = page.locator(".jp-NotebookPanel .jp-Notebook")
    try:
        page.wait_for_function(RUN_ALL_DONE_JS, timeout=120_000)
    except Exception as e:  # noqa: BLE001 - Playwright's TimeoutError, with the cells' state
        pytest.fail(f"the cells did not finish: {e}\n{describe_cells(cells)}", pytrace=False)

    def cell(name: str):
        return cells.nth(CELL_INDEX[name])

    def stdout(name: str) -> str:
        return "\n".join(cell(name).locator(f".jp-OutputArea-output{STDOUT}").all_inner_texts())

    try:
        prompts = cells.locator(".jp-InputPrompt").all_inner_texts()
        assert all(re.search(r"\[\d+\]", p) for p in prompts), "not every cell ran"
        errors = notebook.locator(f".jp-OutputArea-output{STDERR}")
        assert errors.count() == 0, "a cell raised or wrote to stderr"

        # %load_ext neuron_lab: one line with the devices, memory per core and mode.
        banner = re.search(r"neuron_lab .*: (\d+) NeuronCores? .* per core, mode \w+", stdout("load"))
        assert banner, "no banner line from %load_ext neuron_lab"
        cores = int(banner.group(1))

        # Per-cell timing: a line after the cell that used the device (and its value),
        # none after the cell that did not.
        assert PER_CELL_LINE.search(stdout("device")), "no per-cell line after the device cell"
        expect(cell("device").locator(".jp-OutputArea-executeResult")).to_have_text(re.compile(r"-?\d"))
        assert not stdout("host_only"), "per-cell line (or other print) after a host-only cell"
        expect(cell("host_only").locator(".jp-OutputArea-executeResult")).to_contain_text("45")

        # %%neuron_profile: the launch table and the op table, with the matmul in it.
        profile = cell("profile").locator(".jp-RenderedHTMLCommon .neuron-profile")
        expect(profile).to_be_visible()
        tables = profile.locator("table.neuron-profile-table")
        expect(tables).to_have_count(2)
        expect(tables.first.locator("tbody tr").first).to_be_visible()
        expect(tables.last.locator("tbody td").filter(has_text=re.compile(r"\bmm\b|matmul"))).not_to_have_count(0)
        assert PER_CELL_LINE.search(stdout("profile")), "no per-cell line after the profiled cell"

        # The dashboard: a live ipywidgets view (rendered by the widget manager, not its
        # text fallback) with a memory bar per core, updated by the cell after it.
        dashboard = cell("dashboard").locator(".jupyter-widgets.neuron-dashboard")
        expect(dashboard).to_be_visible(timeout=30_000)
        expect(dashboard).to_contain_text("neuron dashboard")
        expect(dashboard.locator(".widget-hprogress")).to_have_count(cores)  # memory per core
        expect(dashboard.get_by_role("button", name="Refresh")).to_be_visible()
        last = page.evaluate(
            "() => [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')].pop().textContent"
        )
        last_count = re.search(r"\d+", last).group()
        expect(dashboard).to_contain_text(f"after In [{last_count}]", timeout=15_000)
        expect(dashboard.locator("svg rect")).not_to_have_count(0)  # the timing chart
    except AssertionError as e:
        raise AssertionError(f"{e}\n\nCells and their outputs:\n{describe_cells(cells)}") from None

    # Pictures (the README uses them): the profile table, the dashboard, a cell with its
    # per-cell line, and the whole notebook in a window tall enough to show every cell.
    page.mouse.move(0, 0)  # no hover highlights
    profile.screenshot(path=str(artifacts_dir / "profile_table.png"))
    dashboard.screenshot(path=str(artifacts_dir / "dashboard.png"))
    cell("device").screenshot(path=str(artifacts_dir / "cell_timing.png"))
    height = min(int(page.evaluate(FULL_HEIGHT_JS)), 6000)
    page.set_viewport_size({"width": 1400, "height": max(height, 1000)})
    page.wait_for_timeout(300)  # let JupyterLab lay out the taller window
    page.evaluate(SCROLL_TO_TOP_JS)
    page.screenshot(path=str(artifacts_dir / "notebook.png"))
    print(f"notebook opened, ran and rendered in {time.monotonic() - started:.1f}s")
