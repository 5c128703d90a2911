"""A profiled region with collectives: what the profiler, explain() and the exports show."""

import os
import tempfile
import json

import torch
import torch.distributed as dist

import neuron_lab
from neuron_lab.observability.timeline import LANE_COLLECTIVES, lanes
from ranks import report

dist.init_process_group("neuron")
rank = dist.get_rank()
device = torch.device("neuron", int(os.environ["LOCAL_RANK"]) % torch.neuron.device_count())
x = torch.ones(256, device=device)  # 1 KiB
with neuron_lab.profiler.profile() as prof:
    y = x * 2  # pending when the collective starts: the collective launches it
    dist.all_reduce(y)
    out = torch.empty(512, device=device)
    dist.all_gather_into_tensor(out, y)
    total = out.sum().item()
trace = prof.export_chrome_trace(os.path.join(tempfile.mkdtemp(), "trace.json"))
events = json.loads(trace.read_text())["traceEvents"]
report({
    "total": total,
    "collectives": [(c.name, c.bytes_moved, c.bus_bytes, c.group_size) for c in prof.collectives],
    "table": str(prof.table()),
    "html": prof._repr_html_(),
    "explain": str(prof.explain()),
    "summary": prof.explain().summary_line(),
    "trace": [(e["name"], e["args"]["bytes_moved"]) for e in events if e.get("cat") == "collective"],
    "lanes": lanes(prof),
    "collective_lane": LANE_COLLECTIVES,
    "inline_launches": [l.name for l in prof.launches if l.kind == "inline"],
    "by_design_waits": [e.reason.name for e in prof.explain().sync_events],
})
dist.destroy_process_group()
