"""Observability: what the neuron runtime did and why a region was slow.

- ``profiler``: launch-level profiles, tables, timelines, Chrome trace / CSV / Parquet exports
- ``metrics``: the always-on counters and timing distributions report
- ``explain``: a diagnosis of a region (time split, recompiles, syncs, inline ops)
- ``records``: the raw launches, events and memory samples
- ``cost_model``: a modelled NeuronCore time (FLOPs and bytes on a roofline) per op and launch
- ``torch_profiler``: what torch.profiler's device lanes (``ProfilerActivity.PrivateUse1``) get
  from this layer: cell names for source lines, modelled times
- ``timeline``: the interactive timeline (and its static figure)
- ``compare``: which op's numbers leave a reference (the CPU, the replay tier, float32)

Memory snapshots for PyTorch's memory visualizer live in ``torch.neuron.memory``.
"""

from __future__ import annotations

from neuron_lab.observability import metrics, profiler, torch_profiler
from neuron_lab.observability.explain import Explanation, explain, explain_scope
from neuron_lab.observability.profiler import Profile, profile

torch_profiler.install()

__all__ = ["metrics", "profiler", "Profile", "profile", "Explanation", "explain", "explain_scope"]
