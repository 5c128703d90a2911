"""Observability: what the neuron runtime did and why a region was slow.

- ``profiler``: launch-level profiles, tables, timelines, Chrome trace / CSV / Parquet exports
- ``metrics``: the always-on counters and timing distributions report
- ``explain``: a diagnosis of a region (time split, recompiles, syncs, inline ops)
- ``records``: the raw launches, events and memory samples
- ``compare``: which op's numbers leave a reference (the CPU, the replay tier, float32)
- torch.profiler sees neuron launches by itself (ranges named ``neuron: graph N``)

Memory snapshots for PyTorch's memory visualizer live in ``torch.neuron.memory``.
"""

from __future__ import annotations

from neuron_lab.observability import metrics, profiler
from neuron_lab.observability.explain import Explanation, explain, explain_scope
from neuron_lab.observability.profiler import Profile, profile

__all__ = ["metrics", "profiler", "Profile", "profile", "Explanation", "explain", "explain_scope"]
