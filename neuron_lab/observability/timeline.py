"""Matplotlib figures of a profile: the launch timeline and the memory timeline; and the
timelines of several profiles side by side (the ranks of a distributed run, two runs).

Figures are built with ``matplotlib.figure.Figure`` (no pyplot state), so they
display once in notebooks and can be saved with ``fig.savefig(...)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Optional

from matplotlib.figure import Figure
from matplotlib.patches import Patch

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from neuron_lab.observability.profiler import Profile

__all__ = ["timeline_figure", "timeline_grid", "draw_timeline", "memory_figure", "LANE_HOST", "LANE_COMPILER",
           "LANE_COLLECTIVES"]

LANE_HOST = "host"
LANE_COMPILER = "compiler"
LANE_COLLECTIVES = "collectives"
_COLORS = {"collective": "#da8bc3", "replay": "#4c72b0", "compiled": "#55a868", "op": "#8172b2", "inline": "#dd8452", "event": "#999999",
           "wait": "#cccccc", "sync": "#c44e52", "compile": "#937860", "enqueue": "#bbbbbb"}
_MAX_ARROWS = 300


def lanes(profile: "Profile") -> list[str]:
    """Lane names, top to bottom: the host, then a lane per stream per core, then the compiler."""
    streams = sorted({(l.device, l.stream) for l in profile.launches if l.kind != "inline"})
    out = [LANE_HOST] + [f"neuron:{d} stream {s}" for d, s in streams]
    if getattr(profile, "collectives", None):
        out.append(LANE_COLLECTIVES)
    if any(e.kind in ("compile", "compile_failed") for e in profile.events):
        out.append(LANE_COMPILER)
    return out


def timeline_figure(profile: "Profile", width: float = 11.0) -> Figure:
    """A lane per stream per core plus the host lane: device execution, host waits
    (syncs), inline kernels, enqueue-to-execution lines, and background compiles."""
    fig = Figure(figsize=(width, 1.1 + 0.55 * len(lanes(profile))), layout="constrained")
    ax = fig.add_subplot()
    draw_timeline(ax, profile)
    ax.set_xlabel("time since the profile started (ms)")
    ax.set_title("neuron launches: device execution per stream, host waits and enqueues")
    ax.legend(handles=_legend_handles(), loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=7, fontsize="small",
              frameon=False)
    return fig


def timeline_grid(columns: Mapping[str, Sequence[tuple[str, "Profile"]]], width: float = 11.0) -> Figure:
    """Several profiles' timelines in one figure, side by side: a column per title in
    ``columns``, and in it a row per ``(label, profile)``, one above the other.

    The rows of a column share one time axis, from the column's first launch or collective
    (time before it, imports and set-up, shows nothing) to its last profile's end: profiles of processes
    on one machine (the ranks of a distributed run) read the same clock, so their launches
    line up as they happened."""
    if not columns or not all(columns.values()):
        raise ValueError("timeline_grid needs at least one column, each with at least one (label, profile)")
    rows = max(len(c) for c in columns.values())
    lanes_per_row = [max(len(lanes(c[i][1])) if i < len(c) else 1 for c in columns.values()) for i in range(rows)]
    fig = Figure(figsize=(width, 1.4 + 0.45 * sum(lanes_per_row) + 0.35 * rows), layout="constrained")
    panels = fig.subfigures(1, len(columns), squeeze=False)[0]
    for panel, (title, profiles) in zip(panels, columns.items()):
        axes = panel.subplots(len(profiles), 1, sharex=True, squeeze=False,
                              height_ratios=lanes_per_row[:len(profiles)])[:, 0]
        t0 = min(_first_activity_ns(p) for _, p in profiles)
        end_ms = max((p.end_ns - t0) / 1e6 for _, p in profiles)
        for ax, (label, profile) in zip(axes, profiles):
            draw_timeline(ax, profile, t0_ns=t0, end_ms=end_ms)
            ax.set_title(label, fontsize="medium", loc="left")
        axes[-1].set_xlabel("time since the first launch or collective (ms)")
        if title:
            panel.suptitle(title)
    fig.legend(handles=_legend_handles(), loc="outside lower center", ncol=7, fontsize="small", frameon=False)
    return fig


def _first_activity_ns(profile: "Profile") -> int:
    """When the profile's first launch was enqueued or its first collective began (its
    start when it has neither)."""
    times = [l.enqueue_ns for l in profile.launches if l.start_ns]
    times += [c.start_ns for c in getattr(profile, "collectives", ())]
    return min(times, default=profile.start_ns)


def draw_timeline(ax: "Axes", profile: "Profile", t0_ns: Optional[int] = None, end_ms: Optional[float] = None) -> None:
    """Draws a profile's lanes on ``ax``; times in ms from ``t0_ns`` (default: the profile's start)."""
    names = lanes(profile)
    row = {n: i for i, n in enumerate(names)}
    t0 = profile.start_ns if t0_ns is None else t0_ns
    ms = lambda ns: (ns - t0) / 1e6

    def bar(lane: str, start_ns: int, dur_ns: int, color: str, height: float = 0.6) -> None:
        ax.broken_barh([(ms(start_ns), max(dur_ns / 1e6, 1e-4))], (row[lane] - height / 2, height),
                       facecolors=color, edgecolors="none")

    arrows = 0
    for l in profile.launches:
        if not l.start_ns:
            continue
        if l.kind == "inline":  # runs on the host thread
            bar(LANE_HOST, l.start_ns, l.device_ns, _COLORS["inline"], 0.35)
            continue
        lane = f"neuron:{l.device} stream {l.stream}"
        color = _COLORS.get(l.tier or l.kind, _COLORS["op"])
        bar(lane, l.start_ns, l.device_ns, color)
        if arrows < _MAX_ARROWS and l.kind in ("graph", "op"):
            arrows += 1
            ax.plot([ms(l.enqueue_ns), ms(l.start_ns)], [row[LANE_HOST] + 0.3, row[lane] - 0.3],
                    color=_COLORS["enqueue"], linewidth=0.6, zorder=0)
    for e in profile.events:
        if e.kind == "sync":
            bar(LANE_HOST, e.time_ns, e.duration_ns, _COLORS["sync"], 0.6)
        elif e.kind in ("compile", "compile_failed") and LANE_COMPILER in row:
            bar(LANE_COMPILER, e.time_ns, e.duration_ns, _COLORS["compile"])
    for c in getattr(profile, "collectives", ()):  # torch.distributed: this rank's part of each collective
        bar(LANE_COLLECTIVES, c.start_ns, c.duration_ns, _COLORS["collective"])
    ax.set_yticks(range(len(names)), names)
    ax.set_ylim(len(names) - 0.4, -0.6)
    ax.set_xlim(0, max(ms(profile.end_ns) if end_ms is None else end_ms, 1e-3))  # what came before t0: cut
    ax.grid(axis="x", alpha=0.3)


def _legend_handles() -> list[Patch]:
    return [Patch(color=_COLORS[k], label=label) for k, label in (
        ("replay", "graph (replay)"), ("compiled", "graph (compiled)"), ("op", "single op"),
        ("inline", "inline kernel"), ("sync", "host wait (sync)"), ("compile", "compile"),
        ("collective", "collective"))]


def memory_figure(profile: "Profile", width: float = 11.0) -> Figure:
    """Allocated and reserved bytes over time per core, with each core's peak marked."""
    fig = Figure(figsize=(width, 3.2), layout="constrained")
    ax = fig.add_subplot()
    t0 = profile.start_ns
    devices = sorted({s.device for s in profile.memory})
    for d in devices:
        samples = [s for s in profile.memory if s.device == d]
        times = [(s.time_ns - t0) / 1e6 for s in samples]
        alloc = [s.allocated / 2**20 for s in samples]
        reserved = [s.reserved / 2**20 for s in samples]
        line, = ax.step(times, alloc, where="post", label=f"neuron:{d} allocated")
        ax.step(times, reserved, where="post", linestyle="--", color=line.get_color(), alpha=0.6,
                label=f"neuron:{d} reserved")
        peak = max(range(len(alloc)), key=alloc.__getitem__)
        ax.plot([times[peak]], [alloc[peak]], marker="v", color=line.get_color())
        ax.annotate(f"peak {alloc[peak]:.1f} MiB", (times[peak], alloc[peak]), textcoords="offset points",
                    xytext=(4, 6), fontsize="small")
    if not devices:
        ax.text(0.5, 0.5, "no allocations during the profile", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlim(0, max((profile.end_ns - t0) / 1e6, 1e-3))
    ax.set_xlabel("time since the profile started (ms)")
    ax.set_ylabel("MiB")
    ax.set_title("neuron memory")
    ax.grid(alpha=0.3)
    if devices:
        ax.legend(fontsize="small")
    return fig
