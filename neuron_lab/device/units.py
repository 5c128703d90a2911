"""Units of every neuron_lab report: ``torch.neuron.memory_summary``, explain, the
metrics report, the profiler's table and the notebook magics all print bytes the same way."""

from __future__ import annotations

__all__ = ["format_bytes"]


def format_bytes(n: float) -> str:
    """``512 B``, ``1.5 MiB``, ``14.1 GiB`` (binary units, one decimal); signed values keep their sign."""
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
