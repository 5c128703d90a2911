"""Executes a notebook and saves it with outputs that do not depend on the machine: durations
become "…", temporary cell files "<cell>", addresses "0x…" (the README's notebooks are read on
GitHub; tests/notebook/test_quickstart.py checks the quickstart). Run with the project's Python:

    python scripts/save_notebook_outputs.py notebooks/1_quickstart.ipynb
"""

from __future__ import annotations

import re
import sys

import nbformat
from nbclient import NotebookClient

REPLACEMENTS = [
    (re.compile(r"\b\d+(\.\d+)? ?(ns|µs|us|ms|s)\b"), "…"),
    (re.compile(r"[^\s'\"(]*ipykernel_\d+/\d+\.py"), "<cell>"),
    (re.compile(r"0x[0-9a-fA-F]{4,}"), "0x…"),
]


def machine_independent(text: str) -> str:
    for pattern, replacement in REPLACEMENTS:
        text = pattern.sub(replacement, text)
    return text


def clean(nb: nbformat.NotebookNode) -> None:
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        for output in cell.get("outputs", []):
            if "text" in output:
                output["text"] = machine_independent("".join(output["text"]))
            for mime, value in output.get("data", {}).items():
                if mime.startswith("text/"):
                    output["data"][mime] = machine_independent("".join(value))


def main(path: str) -> None:
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": "notebooks"}}).execute()
    clean(nb)
    nbformat.write(nb, path)


if __name__ == "__main__":
    main(sys.argv[1])
