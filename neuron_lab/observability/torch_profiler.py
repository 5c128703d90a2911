"""torch.profiler's view of the device, and what this layer adds to it.

``torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1])``
traces the device through the activity profiler the device registers with kineto
(``neuron_lab/device/csrc/tracing/kineto_plugin.cpp``): a lane per core and stream with a kernel per
op, linked to the CPU op that recorded it. Before those lanes are made, the device asks the
annotator registered here for what it cannot know itself:

- the name users know each source file by: IPython's ``Cell In[7]`` for a notebook cell;
- the modelled NeuronCore time, FLOPs and bytes of each op and launch
  (``neuron_lab.observability.cost_model``).

``device_profile(prof)`` turns the same records into a :class:`neuron_lab.profiler.Profile`
(tables, the interactive timeline, Parquet) for a torch.profiler run.
"""

from __future__ import annotations

from typing import Any

from neuron_lab.device import trace
from neuron_lab.observability import cost_model
from neuron_lab.observability.records import cell_name

__all__ = ["annotate", "install"]


def annotate(profile: dict) -> dict:
    """What the device's trace session asks before it makes torch.profiler's device lanes:
    ``{"files": {path: "Cell In[7]"}, "launches": {id: (launch cost, [op costs])}}``, each
    cost ``(flops, bytes, modelled_ns)``."""
    spec = cost_model.core()
    files: dict[str, str] = {}
    launches: dict[int, tuple] = {}
    for launch in profile["launches"]:
        for source in [launch["source"]] + [o["source"] for o in launch["ops"]]:
            if source is not None and source[0] not in files:
                files[source[0]] = cell_name(source[0]) or ""
        if launch["kind"] in ("event", "wait"):
            continue
        ops = [cost_model.cached_op_cost(o["name"], o["overload"], o["args"], o["results"], spec)
               for o in launch["ops"]]
        total = cost_model.launch_cost(ops, spec)
        launches[launch["id"]] = ((total.flops, total.bytes, total.modelled_ns),
                                  [(c.flops, c.bytes, c.modelled_ns) for c in ops])
    return {"files": {path: name for path, name in files.items() if name}, "launches": launches}


def install() -> None:
    """Registers :func:`annotate` with the device (done when the observability layer loads)."""
    trace.set_profile_annotator(annotate)
