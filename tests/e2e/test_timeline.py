"""The interactive timeline in a real browser: JupyterLab in headless Chromium (conftest.py).

A notebook profiles a small training loop with ``%%neuron_profile --timeline``; the test finds
the timeline widget in the cell's output, hovers an op of a graph and checks the tooltip (op,
line, emulated and modelled time), zooms with the mouse wheel and checks the visible window
shrank, and drags to pan. Then it opens the same widget saved as a standalone page from a
``file://`` URL (no server, no network) and checks that it draws there too. The screenshot
``timeline.png`` lands in the artifacts folder (docs/img/timeline.png is one).
"""

from __future__ import annotations

import re

import nbformat
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

NOTEBOOK = "neuron_lab_timeline.ipynb"
CELLS = [
    "%load_ext neuron_lab",
    "import torch\n"
    "torch.manual_seed(0)\n"
    "model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8)).to('neuron')\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "x = torch.randn(32, 64, device='neuron')\n"
    "def step():\n"
    "    opt.zero_grad()\n"
    "    loss = model(x).square().mean()\n"
    "    loss.backward()\n"
    "    opt.step()\n"
    "    return loss\n"
    "step().item()",
    "%%neuron_profile --timeline -o prof\n"
    "for _ in range(4):\n"
    "    loss = step()\n"
    "loss.item()",
    "prof.timeline().save_html('timeline.html')",
]
RUN_ALL_DONE_JS = """
() => {
  const panel = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const kernel = panel && panel.sessionContext && panel.sessionContext.session && panel.sessionContext.session.kernel;
  const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')];
  return prompts.length > 0 && prompts.every(p => /\\[\\d+\\]/.test(p.textContent)) && !!kernel && kernel.status === 'idle';
}"""
# The longest op inside a graph (a nested bar), shown in the middle third of the view (zoom=true)
# or as it is, and where it is on the screen.
OP_BAR_JS = """
([root, zoom]) => {
  const api = root.neuronTimeline;
  let best = -1;
  for (let i = 0; i < api.bars; i++) {
    if (api.isOp(i) && (best < 0 || api.barTime(i)[1] > api.barTime(best)[1])) best = i;
  }
  if (best < 0) return null;
  const [start, duration] = api.barTime(best);
  if (zoom) api.setView(start - duration, start + 2 * duration);
  return Object.assign({index: best}, api.barCenter(best));
}"""


def check_widget(page, root, where: str) -> None:
    from playwright.sync_api import expect

    expect(root.locator("canvas")).to_be_visible()
    assert page.evaluate("(root) => root.neuronTimeline.bars", root.element_handle()) > 0, where
    # Zoom in around the middle so that ops are wide enough to hover.
    box = root.locator("canvas").bounding_box()
    start, end = (float(root.get_attribute(a)) for a in ("data-view-start", "data-view-end"))
    page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + 30)
    for _ in range(3):
        page.mouse.wheel(0, -300)
        page.wait_for_timeout(50)
    zoomed = [float(root.get_attribute(a)) for a in ("data-view-start", "data-view-end")]
    assert zoomed[1] - zoomed[0] < 0.7 * (end - start), (where, start, end, zoomed)
    # Pan: drag to the left moves the window later in time.
    page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + 30)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.4, box["y"] + 30, steps=5)
    page.mouse.up()
    panned = [float(root.get_attribute(a)) for a in ("data-view-start", "data-view-end")]
    assert panned[0] > zoomed[0] and panned[1] - panned[0] == pytest.approx(zoomed[1] - zoomed[0], rel=1e-6), where
    target = page.evaluate(OP_BAR_JS, [root.element_handle(), True])
    assert target is not None, f"{where}: no op bar on screen"
    page.mouse.move(target["x"], target["y"])
    tip = root.locator(".neuron-timeline-tip")
    expect(tip).to_be_visible()
    text = tip.inner_text()
    assert re.search(r"aten::\w+", text) and "emulated:" in text and "modelled:" in text, (where, text)
    assert root.get_attribute("data-hover") == str(target["index"]), where


def test_the_timeline_zooms_pans_and_hovers_in_jupyterlab_and_saved_html(page, jupyter_server, artifacts_dir):
    from playwright.sync_api import expect

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = jupyter_server.kernelspec
    nb.cells = [nbformat.v4.new_code_cell(source) for source in CELLS]
    nbformat.write(nb, str(jupyter_server.root_dir / NOTEBOOK))
    page.set_default_timeout(30_000)
    page.set_viewport_size({"width": 1400, "height": 1000})
    page.goto(jupyter_server.notebook_url(NOTEBOOK))
    notebook = page.locator(".jp-NotebookPanel .jp-Notebook")
    expect(notebook).to_be_visible(timeout=60_000)
    page.wait_for_function("() => { const p = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
                           " const k = p && p.sessionContext && p.sessionContext.session &&"
                           " p.sessionContext.session.kernel; return !!k && k.status === 'idle'; }", timeout=60_000)
    page.evaluate("window.jupyterapp.shell.collapseLeft()")
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
    page.wait_for_function(RUN_ALL_DONE_JS, timeout=120_000)

    profiled = notebook.locator(".jp-CodeCell").nth(2)
    root = profiled.locator(".neuron-timeline")
    expect(root).to_have_count(1)
    root.scroll_into_view_if_needed()
    check_widget(page, root, "JupyterLab")
    # The picture: the whole profile, an op hovered.
    page.evaluate("(root) => root.neuronTimeline.setView(0, 1e12)", root.element_handle())
    target = page.evaluate(OP_BAR_JS, [root.element_handle(), False])
    page.mouse.move(target["x"], target["y"])
    expect(root.locator(".neuron-timeline-tip")).to_be_visible()
    box, tip = root.bounding_box(), root.locator(".neuron-timeline-tip").bounding_box()
    bottom = max(box["y"] + box["height"], tip["y"] + tip["height"]) + 4  # the tooltip may hang below
    page.screenshot(path=str(artifacts_dir / "timeline.png"),
                    clip={"x": box["x"], "y": box["y"], "width": box["width"], "height": bottom - box["y"]})

    # The saved page: offline, from a file:// URL.
    saved = jupyter_server.root_dir / "timeline.html"
    assert saved.exists()
    page.goto(saved.as_uri())
    check_widget(page, page.locator(".neuron-timeline"), "saved HTML")
