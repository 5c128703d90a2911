"""Memory history and snapshots in torch.cuda's format, rendered by PyTorch's memory visualizer."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch.cuda import _memory_viz

MiB = 2**20


@pytest.fixture
def history():
    torch.neuron.memory._record_memory_history(max_entries=10_000, clear_history=True)
    yield
    torch.neuron.memory._record_memory_history(enabled=None, clear_history=True)


def allocate_activations() -> torch.Tensor:
    return torch.empty(2 * MiB, dtype=torch.uint8, device="neuron:1")


def our_blocks(snapshot: dict, size: int) -> list[dict]:
    return [b for seg in snapshot["segments"] if seg["device"] == 1 for b in seg["blocks"] if b["size"] == size]


def test_snapshot_names_who_allocated_each_block(history) -> None:
    keep = allocate_activations()
    snapshot = torch.neuron.memory._snapshot()
    (block,) = [b for b in our_blocks(snapshot, 2 * MiB) if b["state"] == "active_allocated"]
    assert block["address"] == keep.data_ptr()
    assert block["requested_size"] == 2 * MiB
    assert block["frames"][0]["name"] == "allocate_activations"
    assert block["frames"][0]["filename"].endswith("test_memory_history.py")
    assert any(f["name"] == "test_snapshot_names_who_allocated_each_block" for f in block["frames"])
    address = keep.data_ptr()
    del keep
    freed = [b for seg in torch.neuron.memory._snapshot()["segments"] for b in seg["blocks"] if b["address"] == address]
    assert [b["state"] for b in freed] == ["inactive"]  # cached (merged with its free neighbours), not returned


def test_trace_records_every_allocator_action(history) -> None:
    torch.neuron.empty_cache()
    # Earlier blocks freed just now may have had the address the next one gets.
    start = len(torch.neuron.memory._snapshot()["device_traces"][1])
    x = torch.empty(32 * MiB, dtype=torch.uint8, device="neuron:1")  # a segment of its own
    address = x.data_ptr()
    del x
    torch.neuron.empty_cache()
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(2**40, dtype=torch.uint8, device="neuron:1")
    trace = torch.neuron.memory._snapshot()["device_traces"][1][start:]
    mine = [(e["action"], e["size"]) for e in trace if e.get("addr") == address]
    assert mine == [
        ("segment_alloc", 32 * MiB),
        ("alloc", 32 * MiB),
        ("free_requested", 32 * MiB),
        ("free_completed", 32 * MiB),
        ("segment_free", 32 * MiB),
    ]
    oom = [e for e in trace if e["action"] == "oom"]
    assert oom and oom[-1]["size"] == 2**40 and oom[-1]["device_free"] > 0


def test_pytorch_memory_visualizer_renders_it(history, tmp_path) -> None:
    # Earlier tests may keep tensors alive (compiled modules hold their weights): count from here.
    before = sum(torch.neuron.memory_allocated(d) for d in range(torch.neuron.device_count()))
    keep = allocate_activations()
    snapshot = torch.neuron.memory._snapshot()
    expected = _memory_viz.Bytes(before + 2 * MiB)
    assert f"total_allocated: {expected}" in _memory_viz.segsum(snapshot)
    flame = _memory_viz.memory(snapshot, format_flamegraph=lambda lines: lines)
    assert "allocate_activations" in flame and str(2 * MiB) in flame
    html = _memory_viz.trace_plot(snapshot)
    assert html.startswith("<!DOCTYPE html>") or "<html" in html
    path = tmp_path / "snapshot.pickle"
    torch.neuron.memory._dump_snapshot(str(path))
    with open(path, "rb") as f:
        loaded = pickle.load(f)
    assert any(b["address"] == keep.data_ptr() for seg in loaded["segments"] for b in seg["blocks"])
    del keep


def test_stopping_and_limits() -> None:
    torch.neuron.memory._record_memory_history(max_entries=3, clear_history=True)
    for _ in range(5):
        torch.empty(1000, device="neuron:1")
    assert len(torch.neuron.memory._snapshot()["device_traces"][1]) == 3
    torch.neuron.memory._record_memory_history(enabled=None)
    before = torch.neuron.memory._snapshot()["device_traces"][1]
    torch.empty(1000, device="neuron:1")
    assert torch.neuron.memory._snapshot()["device_traces"][1] == before
    torch.neuron.memory._record_memory_history(enabled=None, clear_history=True)
    with pytest.raises(ValueError, match="enabled must be"):
        torch.neuron.memory._record_memory_history(enabled="everything")
