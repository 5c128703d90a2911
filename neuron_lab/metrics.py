"""``neuron_lab.metrics``: the runtime's counters and timing distributions (see
``neuron_lab.observability.metrics``)."""

from neuron_lab.observability.metrics import Distribution, MetricsReport, report, reset, snapshot

__all__ = ["Distribution", "MetricsReport", "report", "reset", "snapshot"]
