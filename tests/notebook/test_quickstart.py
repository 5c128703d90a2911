"""The quickstart notebook uses every magic its text introduces, and its saved outputs hold
nothing that depends on the machine that ran it (timings, temporary file names, addresses),
so that what a reader sees on GitHub is what they will see, up to their own timings."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "notebooks" / "1_quickstart.ipynb"
MAGIC = re.compile(r"(?<![\w%])(%%?neuron_\w+)")
MACHINE_SPECIFIC = {
    "a duration": re.compile(r"\b\d+(\.\d+)? ?(ns|µs|us|ms|s)\b"),
    "a temporary cell file": re.compile(r"ipykernel_\d+|/tmp/"),
    "a memory address": re.compile(r"0x[0-9a-fA-F]{4,}"),
}


def cells(kind: str) -> list[dict]:
    return [c for c in json.loads(QUICKSTART.read_text())["cells"] if c["cell_type"] == kind]


def output_texts(cell: dict) -> list[str]:
    texts = []
    for output in cell.get("outputs", []):
        texts.append("".join(output.get("text", "")))
        for mime, value in output.get("data", {}).items():
            if mime.startswith("text/"):
                texts.append("".join(value))
    return texts


def test_the_quickstart_uses_every_magic_it_introduces() -> None:
    introduced = {m for c in cells("markdown") for m in MAGIC.findall("".join(c["source"]))}
    used = {line.split()[0] for c in cells("code") for line in "".join(c["source"]).splitlines()
            if line.startswith("%")}
    assert introduced >= {"%%neuron_profile", "%neuron_memory", "%neuron_explain", "%%neuron_compare"}
    assert introduced <= used, f"introduced but no cell uses them: {sorted(introduced - used)}"


def test_the_quickstart_s_saved_outputs_are_machine_independent() -> None:
    found = []
    for n, cell in enumerate(cells("code")):
        for text in output_texts(cell):
            for what, pattern in MACHINE_SPECIFIC.items():
                match = pattern.search(text)
                if match:
                    found.append(f"code cell {n}: {what} {match.group(0)!r} in {text[:80]!r}")
    assert not found, "\n".join(found)
    assert all(cell.get("outputs") for cell in cells("code")), "every code cell keeps an output to show"
