"""Two of the notebook's answers as a user sees them in JupyterLab, checked and pictured.

- A late error: in the default (adaptive) mode an out-of-range embedding id is found only
  when the recorded ops run, two lines later. The cell's error must name the recording line
  as IPython names cells (``Cell In[n], line 3``) and quote it.
- ``%%neuron_compare``: the quickstart's planted numerics bug (a variance computed as
  ``E[h²] - E[h]²``) run under bfloat16 autocast against float32; the answer must name the
  subtraction on the cell's line 3 (the magic is line 1, as IPython counts) as the first op beyond tolerance.

The pictures ``late_error.png`` and ``compare.png`` land in the artifacts folder;
scripts/screenshots.sh copies them to docs/img/.
"""

from __future__ import annotations

import re

import pytest

from tests.e2e.test_browser import RUN_ALL_DONE_JS, describe_cells, open_and_run_all

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

NOTEBOOK = "neuron_lab_pictures.ipynb"
CELLS = {
    "load": "%load_ext neuron_lab",
    "setup": (
        "import torch\n"
        "from torch import nn\n"
        "torch.manual_seed(0)\n"
        "layer = nn.Linear(16, 8).to('neuron')\n"
        "inputs = torch.randn(64, 16, device='neuron')"
    ),
    "compare": (
        "%%neuron_compare --against float32\n"
        "h = layer(inputs) + 10.0\n"
        "var = (h * h).mean(dim=0) - h.mean(dim=0) ** 2  # the planted bug: E[h^2] - E[h]^2\n"
        "z = (h - h.mean(dim=0)) / (var + 1e-5).sqrt()\n"
        "loss = z.square().mean()"
    ),
    # Last: Run All stops at an error.
    "late_error": (
        "embedding = nn.Embedding(10, 4).to('neuron')\n"
        "ids = torch.tensor([1, 2, 12], device='neuron')  # 12 is out of range\n"
        "vectors = embedding(ids)  # recorded here, run later\n"
        "total = vectors.sum() * 2\n"
        "print('total:', total)"
    ),
}
NAMES = tuple(CELLS)
STDERR = '[data-mime-type="application/vnd.jupyter.stderr"]'


def test_late_error_and_compare_read_as_a_user_sees_them(page, jupyter_server, artifacts_dir):
    from playwright.sync_api import expect

    cells = open_and_run_all(page, jupyter_server, NOTEBOOK, list(CELLS.values()))
    page.wait_for_function(RUN_ALL_DONE_JS, timeout=120_000)

    def cell(name: str):
        return cells.nth(NAMES.index(name))

    try:
        # The compare cell names the planted subtraction, at its line, with the difference.
        answer = cell("compare").locator(".neuron-compare")
        expect(answer).to_be_visible()
        text = answer.inner_text()
        assert re.search(r"first op beyond tolerance", text), text
        first = answer.locator("table.neuron-compare-first")
        expect(first).to_contain_text("aten::sub")
        compare_count = re.search(r"\d+", cell("compare").locator(".jp-InputPrompt").inner_text()).group()
        expect(first).to_contain_text(f"Cell In[{compare_count}], line 3")

        # The late error: this cell's error, at the recording line, quoted.
        error = cell("late_error").locator(f".jp-OutputArea-output{STDERR}")
        expect(error).to_have_count(1)
        count = re.search(r"\d+", cell("late_error").locator(".jp-InputPrompt").inner_text()).group()
        message = error.inner_text()
        assert f"Cell In[{count}], line 3" in message, message
        assert "vectors = embedding(ids)" in message, message
        assert "/tmp/ipykernel_" not in message, message  # named as IPython names cells
    except AssertionError as e:
        raise AssertionError(f"{e}\n\nCells and their outputs:\n{describe_cells(cells, NAMES)}") from None

    page.mouse.move(0, 0)
    cell("compare").scroll_into_view_if_needed()
    cell("compare").screenshot(path=str(artifacts_dir / "compare.png"))
    cell("late_error").scroll_into_view_if_needed()
    cell("late_error").screenshot(path=str(artifacts_dir / "late_error.png"))
