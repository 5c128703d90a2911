"""An error the device raises late (at the next wait) reads as raised at the line that recorded
the failing op: in a notebook cell, named as IPython names it ("Cell In[7], line 3") with the
line quoted, the printing frames dropped, the recorded line as the innermost frame and a note
on what ran in between; in a script, the same with its file and line."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

import neuron_lab
from neuron_lab.device import late_errors

# Line 3 records an embedding lookup with an id out of range; line 6 prints, and waits.
CELL = """\
emb = torch.nn.Embedding(10, 4).to("neuron")
ids = torch.tensor([1, 2, 30], device="neuron")
h = emb(ids)
y = h * 2
print("between")
print(y)
"""
RECORDED, RAISED = 3, 6
PRINTING_FRAMES = ("_tensor_str.py", "torch/_tensor.py", "tensor_repr.py")


def run_cell(shell: InteractiveShell, code: str):
    with capture_output() as captured:
        result = shell.run_cell(code, store_history=True)
    return result, captured.stdout + captured.stderr


def test_a_late_error_in_a_cell_reads_as_raised_at_the_recording_line(ip: InteractiveShell) -> None:
    result, text = run_cell(ip, CELL)
    n = result.execution_count
    error = result.error_in_exec
    assert isinstance(error, IndexError), text
    # The message names the cell as IPython does and quotes the line that recorded the op.
    assert f"recorded at Cell In[{n}], line {RECORDED}: h = emb(ids)" in str(error), str(error)
    assert "ipykernel" not in str(error) and "<ipython-input" not in str(error)
    # The traceback: no printing frames, the waiting line, then the recorded line as the innermost frame.
    assert not any(frame in text for frame in PRINTING_FRAMES), text
    frames = re.findall(r"^Cell In\[(\d+)\], line (\d+)", text, re.MULTILINE)
    assert frames == [(str(n), str(RAISED)), (str(n), str(RECORDED))], text
    assert re.search(rf"^----> {RECORDED} h = emb\(ids\)", text, re.MULTILINE), text
    # The note: where it was raised, what ran in between, what never ran.
    assert f"raised at the next wait, Cell In[{n}], line {RAISED}: print(y)" in text, text
    assert f"lines {RECORDED + 1}-{RAISED - 1} ran" in text and '5 print("between")' in text, text
    assert "not run: aten::mul" in text, text  # y = h * 2 was in the failed op's launch
    assert "between" in text  # the print of line 5 did run, before the error surfaced


def test_an_error_raised_at_the_end_of_the_cell_points_at_its_line(ip: InteractiveShell) -> None:
    result, text = run_cell(ip, "x = torch.randn(4, 5, device='neuron')\nbad = torch.tensor([0, 9], device='neuron')\n"
                                "picked = x.index_select(0, bad)\nfinished = True")
    n = result.execution_count
    assert isinstance(result.error_in_exec, IndexError), text
    assert re.findall(r"^Cell In\[(\d+)\], line (\d+)", text, re.MULTILINE) == [(str(n), "3")], text
    assert "when the cell ended" in text and "autotime.py" not in text, text


def test_a_caught_late_error_names_the_cell_too(ip: InteractiveShell) -> None:
    result, text = run_cell(ip, "emb = torch.nn.Embedding(10, 4).to('neuron')\n"
                                "h = emb(torch.tensor([11], device='neuron'))\n"
                                "try:\n    h.sum().item()\nexcept IndexError as e:\n    caught = str(e)")
    assert result.error_in_exec is None, text
    assert f"recorded at Cell In[{result.execution_count}], line 2: h = emb(" in ip.user_ns["caught"]


SCRIPT = """\
import torch
import neuron_lab

emb = torch.nn.Embedding(10, 4).to("neuron")
ids = torch.tensor([1, 2, 30], device="neuron")
h = emb(ids)
y = h * 2
print("between", flush=True)
print(y)
"""


def test_a_late_error_in_a_script_reads_as_raised_at_its_recording_line(tmp_path: Path) -> None:
    script = tmp_path / "late_error.py"
    script.write_text(SCRIPT)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    text = result.stderr
    assert not any(frame in text for frame in PRINTING_FRAMES), text
    frames = re.findall(r'^  File "([^"]+)", line (\d+), in (\S+)', text, re.MULTILINE)
    assert frames == [(str(script), "9", "<module>"), (str(script), "6", "<module>")], text
    assert re.search(r'line 6, in <module>\n    h = emb\(ids\)', text), text
    assert f'recorded at {script}:6 in <module>: h = emb(ids)' in text, text
    assert f'raised at the next wait, File "{script}", line 9, in <module>: print(y)' in text, text
    assert "lines 7-8 ran" in text and "not run: aten::mul (line 7)" in text, text


def test_a_late_error_inside_a_function_that_returned(tmp_path: Path) -> None:
    script = tmp_path / "in_function.py"
    script.write_text(textwrap.dedent("""\
        import torch
        import neuron_lab

        def lookup(ids):
            table = torch.nn.Embedding(10, 4).to("neuron")
            return table(ids)

        out = lookup(torch.tensor([99], device="neuron"))
        out.sum().item()
        """))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    text = result.stderr
    frames = re.findall(r'^  File "([^"]+)", line (\d+), in (\S+)', text, re.MULTILINE)
    assert frames == [(str(script), "9", "<module>"), (str(script), "6", "lookup")], text
    assert "return table(ids)" in text and "went on from the recording line" in text, text


def test_other_errors_are_left_as_they_are(ip: InteractiveShell) -> None:
    error = ValueError("not a device error")
    assert late_errors.rewrite(error) is None and not getattr(error, "__notes__", None)
    result, text = run_cell(ip, "def f():\n    raise KeyError('k')\nf()")
    assert isinstance(result.error_in_exec, KeyError)
    assert re.findall(r"^Cell In\[\d+\], line (\d+)", text, re.MULTILINE) == ["3", "2"], text


def test_unload_gives_the_shell_its_traceback_back(shell: InteractiveShell) -> None:
    from conftest import unload_extension

    with capture_output():
        shell.run_line_magic("load_ext", "neuron_lab")
    assert "showtraceback" in shell.__dict__
    unload_extension(shell)
    assert "showtraceback" not in shell.__dict__
    neuron_lab.set_mode("adaptive")
    torch.neuron.synchronize()
