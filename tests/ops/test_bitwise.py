"""Every OpInfo op gives the CPU's bits on neuron, in every mode (a CI-sized sweep).

``bitwise_support`` compares each op's results (dtype, shape, strides, bits; NaN matches
NaN) and input gradients (for a fixed random cotangent) with the CPU's. CI runs every
op that supports float32 on the CPU with its first sample, in each mode (adaptive, eager,
blocking), in one crash-isolating worker: about 25 s a mode on this 2-core machine. The
full sweep (every sample) is ``scripts/bitwise_sweep.py``. A mismatch fails; an op that
cannot be compared is listed, with its reason, in ``bitwise_support`` (checked here).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the shared helpers

import bitwise_support as support  # noqa: E402
from conftest import run_python  # noqa: E402
import opinfo_support  # noqa: E402

import neuron_lab  # noqa: E402
from neuron_lab.adaptive_eager._native import native  # noqa: E402

SAMPLES = 1  # per op: the first sample that involves the device


@pytest.fixture(scope="module")
def runner():
    r = support.make_runner(SAMPLES)
    yield r
    r.close()


@pytest.mark.parametrize("mode", support.MODES)
def test_every_op_gives_the_cpus_bits(mode: str, runner) -> None:
    bad = []
    passed = 0
    for op_id in support.all_op_ids():
        result = runner.run(op_id, mode=mode)
        if result.status == "passed":
            passed += 1
        elif result.status not in ("excluded", "skipped"):
            bad.append(f"{op_id}: {result.status}: {result.message.strip()[:600]}")
    assert not bad, f"{len(bad)} ops are not the CPU's bits in {mode} mode:\n" + "\n".join(bad)
    assert passed >= 600, f"only {passed} ops passed: the sweep did not run"


def test_every_listed_op_still_exists() -> None:
    ids = set(support.all_op_ids())
    stale = sorted((set(support.EXCLUSIONS) | set(support.CPU_NOT_REPRODUCIBLE)) - ids)
    assert not stale, f"entries that name no OpInfo op (remove them): {stale}"
    assert all(support.EXCLUSIONS.values()) and all(support.CPU_NOT_REPRODUCIBLE.values())


def test_every_excluded_op_still_cannot_run_on_the_device() -> None:
    for op_id in support.EXCLUSIONS:
        result = support.check_bits(opinfo_support.all_ops()[op_id], 2, "blocking")
        assert result.status != "passed", f"{op_id} now gives the CPU's bits: remove its exclusion"


def test_an_op_the_cpu_may_not_reproduce_is_compared_bit_for_bit_where_it_does() -> None:
    """An entry of CPU_NOT_REPRODUCIBLE relaxes the comparison only on a torch whose CPU does
    vary (its probe says so): where the CPU reproduces the op, its bits must match."""
    assert set(support.CPU_NOT_REPRODUCIBLE_PROBES) == set(support.CPU_NOT_REPRODUCIBLE)
    for op_id in support.CPU_NOT_REPRODUCIBLE:
        varies = support.cpu_varies(op_id)
        result = support.check_bits(opinfo_support.all_ops()[op_id], 2, "blocking")
        assert result.status == "passed", result.message
        assert result.checks.get("forward", 0) > 0, result.checks
        assert result.checks.get("forward_metadata_only", 0) == (result.checks["forward"] if varies else 0), (
            op_id, varies, result.checks)


# Calls whose result metadata the op's meta kernel gets wrong: without the op's entry in
# ops_checked_at_first_call, a recorded call's result differs from the CPU's (shapes no
# other test uses, so that nothing was learned for them before).
def _eig_strides(device: str):
    a = torch.randn(11, 11, generator=torch.Generator().manual_seed(0)).to(device)
    return torch.linalg.eig(a).eigenvectors.stride()


def _lstm_runs(device: str):
    lstm = torch.nn.LSTM(3, 13).to(device)
    return lstm(torch.zeros(2, 1, 3, device=device))[0].shape


def _unpool_strides(device: str):
    x = torch.randn(1, 3, 4, 6, generator=torch.Generator().manual_seed(0)).to(device)
    pooled, indices = torch.nn.functional.max_pool2d(x.to(memory_format=torch.channels_last), 2, return_indices=True)
    return torch.nn.functional.max_unpool2d(pooled, indices, 2).stride()


def _nonzero_static_strides(device: str):
    x = (torch.arange(70.0).reshape(2, 5, 7) % 3).to(device)
    return torch.nonzero_static(x, size=13).stride()


METADATA_PROBES = {"aten::linalg_eig": _eig_strides, "aten::mkldnn_rnn_layer": _lstm_runs,
                   "aten::max_unpool2d": _unpool_strides, "aten::nonzero_static": _nonzero_static_strides}


def test_every_op_learned_from_the_cpu_kernel_is_still_needed() -> None:
    listed = native.ops_checked_at_first_call()
    metadata = sorted(op for op, why in listed.items() if why.startswith("metadata:"))
    assert metadata == sorted(METADATA_PROBES), "each metadata entry needs a probe here"
    unneeded = []
    try:
        with neuron_lab.mode("eager"):
            for op, probe in METADATA_PROBES.items():
                native.set_ops_checked_at_first_call({k: v for k, v in listed.items() if k != op})
                try:
                    same = probe("neuron") == probe("cpu")
                    torch.neuron.synchronize()
                except RuntimeError:
                    same = False
                if same:
                    unneeded.append(op)
    finally:
        native.set_ops_checked_at_first_call(listed)
    assert not unneeded, f"ops whose meta kernel now agrees with their CPU kernel (remove them): {unneeded}"
