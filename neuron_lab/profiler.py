"""``neuron_lab.profiler``: profile regions of neuron work (see ``neuron_lab.observability.profiler``)."""

from neuron_lab.observability.profiler import Profile, from_torch_profiler, profile, start, stop

__all__ = ["Profile", "profile", "start", "stop", "from_torch_profiler"]
