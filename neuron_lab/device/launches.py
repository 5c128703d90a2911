"""Where the device runs its launches: on a stream's device thread, or on the host thread
that launches them.

A device thread overlaps a launch with the host's recording of the next one, which pays
while the launch's kernels leave a CPU free for the host. Kernels that use every CPU the
process may run on (``torch.get_num_threads()`` at least the affinity mask's size: torch's
default on a machine without SMT) leave none: the host thread then shares a core with the
kernels' OpenMP team, and a parallel region waits for its slowest thread. There the host runs
the launch itself, as it would at its next wait. Either way the kernels use the launching
thread's thread count, so results keep their bits; errors still surface at the next wait.

``NEURON_LAB_LAUNCH_RUNNER`` (read at import) or :func:`set_launch_runner` chooses:

``auto``           the host where kernels take every usable CPU, else the device thread (the default)
``device_thread``  always the stream's device thread
``host``           always the launching host thread

Adaptive eager's policy follows the choice: where the host runs a launch, no device computes
while the host records the next, so a buffer is not launched early for an idle device
(``recorder.cpp``): graphs are cut where the program waits, not where timing happened to.
"""

from __future__ import annotations

import contextlib
import enum
import os
from collections.abc import Iterator

__all__ = ["LaunchRunner", "launch_runner", "set_launch_runner", "launches_run_on", "host_runs_launches"]

ENVIRONMENT_VARIABLE = "NEURON_LAB_LAUNCH_RUNNER"


class LaunchRunner(enum.StrEnum):
    AUTO = "auto"
    DEVICE_THREAD = "device_thread"
    HOST = "host"


def _parse(value: LaunchRunner | str, source: str) -> LaunchRunner:
    try:
        return LaunchRunner(str(value).strip().lower())
    except ValueError:
        choices = ", ".join(r.value for r in LaunchRunner)
        raise ValueError(f"{source}={value!r} is not a launch runner; use one of {choices}") from None


def launch_runner() -> LaunchRunner:
    """The current choice (``auto`` unless set)."""
    from neuron_lab.device import _C

    return LaunchRunner(_C.launch_runner())


def set_launch_runner(runner: LaunchRunner | str) -> None:
    """Chooses where launches run from now on (launches already queued are not moved)."""
    from neuron_lab.device import _C

    _C.set_launch_runner(_parse(runner, "runner").value)


@contextlib.contextmanager
def launches_run_on(runner: LaunchRunner | str) -> Iterator[None]:
    """``with launches_run_on("device_thread"):`` the choice for a block, restored after."""
    previous = launch_runner()
    set_launch_runner(runner)
    try:
        yield
    finally:
        set_launch_runner(previous)


def host_runs_launches(intra_op_threads: int | None = None) -> bool:
    """Whether a launch made now, with ``intra_op_threads`` (default: ``torch.get_num_threads()``)
    kernel threads, runs on the host thread that makes it."""
    if intra_op_threads is None:
        import torch

        intra_op_threads = torch.get_num_threads()
    from neuron_lab.device import _C

    return bool(_C.host_runs_launches(int(intra_op_threads)))


def from_environment(environ: dict[str, str] | None = None) -> LaunchRunner:
    """``NEURON_LAB_LAUNCH_RUNNER``'s choice (read before the device loads); raises ValueError on a bad value."""
    env = os.environ if environ is None else environ
    return _parse(env.get(ENVIRONMENT_VARIABLE, LaunchRunner.AUTO.value), ENVIRONMENT_VARIABLE)
