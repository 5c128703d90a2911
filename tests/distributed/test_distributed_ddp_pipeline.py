"""DDP, ZeroRedundancyOptimizer and pipeline parallelism on neuron, end to end under
torchrun, against single-process references; and the examples in ``examples/``.

Each rank script runs all its cases in one launch (process start is the expensive part
on this machine); the module-scoped fixtures launch once and the tests check each case.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch
from ranks import SCRIPTS, load_example, mse_losses, run_example, run_on_ranks

TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
# fp16_compress_hook rounds each bucket to float16 (11 significant bits) before and after
# the sum: the gradients move by a few parts in 1e4, the parameters after 3 steps less.
FP16_TOLERANCE = {"rtol": 2e-3, "atol": 2e-4}

DDP_CASES = [
    "sgd_several_buckets", "adamw_default_buckets", "adamw_grads_as_bucket_views", "no_sync_accumulation",
    "find_unused_parameters", "fp16_compress_hook", "custom_all_reduce_hook", "device_ids_cpu_inputs",
    "device_ids_inputs_on_other_core", "static_graph", "zero_adamw", "zero_adamw_bucket_view",
]
PIPELINE_CASES = ["gpipe", "1f1b", "1f1b_static_shapes", "gpipe_traced"]


def close(actual: list[float] | None, expected: list[float] | None, what: str, tolerance: dict[str, float]) -> None:
    """``actual`` matches ``expected`` within ``tolerance`` (both None, or both values)."""
    assert (actual is None) == (expected is None), f"{what}: {actual!r} where the reference has {expected!r}"
    if actual is None:
        return
    a, e = torch.tensor(actual, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64)
    assert a.shape == e.shape, f"{what}: {a.shape} values, the reference {e.shape}"
    assert torch.allclose(a, e, **tolerance), \
        f"{what}: max difference {(a - e).abs().max().item():.3g} (tolerance {tolerance})"


def state_close(actual: dict[str, Any], expected: dict[str, Any], what: str, tolerance: dict[str, float]) -> None:
    assert sorted(actual) == sorted(expected), f"{what}: names {sorted(actual)}, the reference {sorted(expected)}"
    for name, values in expected.items():
        close(actual[name], values, f"{what} {name}", tolerance)


# ---- the device's pinned memory (DDP's find_unused_parameters stages through it) ---------


def test_pinned_host_memory_is_reported_pinned() -> None:
    pinned = torch.arange(6.0).pin_memory()
    assert pinned.is_pinned() and pinned[2:].is_pinned() and torch.empty(3, pin_memory=True).is_pinned()
    assert not torch.arange(6.0).is_pinned()
    on_device = pinned.to("neuron", non_blocking=True)
    pinned.zero_()  # the copy took the host data already
    assert on_device.cpu().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


# ---- DDP and ZeroRedundancyOptimizer, 2 ranks ----------------------------------------------


@pytest.fixture(scope="module")
def ddp_reports() -> list[dict[str, Any]]:
    reports = run_on_ranks(SCRIPTS / "ddp_training.py", nproc=2, timeout=600)
    assert sorted(reports[0]["cases"]) == sorted(DDP_CASES)
    return reports


@pytest.mark.parametrize("case", DDP_CASES)
def test_ddp_matches_single_process_training(ddp_reports: list[dict[str, Any]], case: str) -> None:
    """Each step's loss (the ranks' mean), and the final parameters, gradients and buffers
    of every rank, match one process training on the concatenated batch."""
    results = [rep["cases"][case] for rep in ddp_reports]
    for rank, result in enumerate(results):
        assert "error" not in result, f"rank {rank}: {result['error']}"
    tolerance = FP16_TOLERANCE if case == "fp16_compress_hook" else TOLERANCE
    expected = results[0]["reference"]
    mean_losses = torch.tensor([r["ddp"]["losses"] for r in results]).mean(0).tolist()
    close(mean_losses, expected["losses"], "loss per step", tolerance)
    for rank, result in enumerate(results):
        for part in ("params", "grads", "buffers"):
            state_close(result["ddp"][part], expected[part], f"rank {rank} {part}", tolerance)


def test_gloo_lets_go_of_every_host_tensor(ddp_reports: list[dict[str, Any]]) -> None:
    """After all the cases and a last large all_reduce, gloo's threads hold no tensor of
    the backend (which keeps them referenced until then, so that no worker thread frees
    a Python object while the process exits)."""
    assert all(rep["released_at_exit"] for rep in ddp_reports)


def test_ddp_small_bucket_cap_makes_several_buckets(ddp_reports: list[dict[str, Any]]) -> None:
    assert ddp_reports[0]["cases"]["sgd_several_buckets"]["ddp"]["buckets"] > 1
    assert ddp_reports[0]["cases"]["adamw_default_buckets"]["ddp"]["buckets"] == 1


def test_ddp_unused_layer_keeps_no_gradient(ddp_reports: list[dict[str, Any]]) -> None:
    """The layer no forward uses has no gradient on any rank; the branch one rank used has one on both."""
    for rep in ddp_reports:
        grads = rep["cases"]["find_unused_parameters"]["ddp"]["grads"]
        assert grads["never.weight"] is None and grads["extra.weight"] is not None


def test_ddp_custom_hook_reduces_every_bucket(ddp_reports: list[dict[str, Any]]) -> None:
    """Our hook ran for each bucket of each step (after the first step DDP rebuilds the
    buckets by the cap)."""
    for rep in ddp_reports:
        result = rep["cases"]["custom_all_reduce_hook"]["ddp"]
        assert all(calls >= 1 for calls in result["hook_calls"])
        assert result["hook_calls"][-1] == result["buckets"] > 1


def test_ddp_fp16_hook_compresses(ddp_reports: list[dict[str, Any]]) -> None:
    """The fp16 hook's gradients differ from the float32 reference (by its rounding)."""
    result = ddp_reports[0]["cases"]["fp16_compress_hook"]
    diffs = [abs(a - e) for name, grad in result["ddp"]["grads"].items()
             for a, e in zip(grad, result["reference"]["grads"][name], strict=True)]
    assert max(diffs) > 0


def test_ddp_copies_inputs_from_another_core_on_a_side_stream(ddp_reports: list[dict[str, Any]]) -> None:
    for rep in ddp_reports:
        assert rep["cases"]["device_ids_inputs_on_other_core"]["ddp"]["side_stream_launches"] >= 1


def test_ddp_times_its_iterations_on_neuron(ddp_reports: list[dict[str, Any]]) -> None:
    """DDP's runtime statistics come from the device's timer (events on the stream):
    forward, backward compute and communication each took some time."""
    for rep in ddp_reports:
        timing = rep["cases"]["sgd_several_buckets"]["ddp"]["timing_ns"]
        for key in ("avg_forward_compute_time", "avg_backward_compute_time", "avg_backward_comm_time"):
            assert timing[key] > 0, timing


def test_zero_optimizer_state_matches_adamw(ddp_reports: list[dict[str, Any]]) -> None:
    """ZeroRedundancyOptimizer's state (each rank's shard, consolidated on rank 0) is the
    reference AdamW's."""
    for case in ("zero_adamw", "zero_adamw_bucket_view"):
        result = ddp_reports[0]["cases"][case]
        state_close(result["ddp"]["zero_state"], result["reference"]["zero_state"], f"{case} AdamW state", TOLERANCE)


# ---- pipeline parallelism --------------------------------------------------------------------


@pytest.fixture(scope="module")
def pipeline_reports() -> list[dict[str, Any]]:
    return run_on_ranks(SCRIPTS / "pipeline_schedules.py", nproc=2, timeout=600)


def check_pipeline(reports: list[dict[str, Any]], case: str) -> None:
    """The last stage's per-microbatch losses, and every stage's parameters and gradients,
    match the whole model on one process; the stages hold every layer once."""
    expected = reports[0]["reference"]
    held = []
    for rank, rep in enumerate(reports):
        result = rep["cases"][case]
        held += result["layers"]
        for part in ("params", "grads"):
            mine = {name: expected[part][name] for name in result[part]}
            state_close(result[part], mine, f"stage {rank} {part}", TOLERANCE)
    assert held == list(range(len(held))) and f"{held[-1]}.weight" in expected["params"]
    losses = reports[-1]["cases"][case]["losses"]
    for step, (actual, reference) in enumerate(zip(losses, expected["losses"], strict=True)):
        close(actual, reference, f"step {step} microbatch losses", TOLERANCE)


@pytest.mark.parametrize("case", PIPELINE_CASES)
def test_pipeline_two_stages_matches_whole_model(pipeline_reports: list[dict[str, Any]], case: str) -> None:
    check_pipeline(pipeline_reports, case)


def test_pipeline_1f1b_four_stages_matches_whole_model() -> None:
    reports = run_on_ranks(SCRIPTS / "pipeline_schedules.py", nproc=4, timeout=600, env={"PIPELINE_CASES": "1f1b"})
    check_pipeline(reports, "1f1b")


# ---- the examples, run as a user runs them ---------------------------------------------------


def whole_batch_losses(example: ModuleType) -> list[float]:
    """The example's model trained on one process, on CPU, on each step's whole batch (the
    mean of the ranks' losses in DDP; of the microbatches' losses in the pipeline)."""
    model = example.make_model()
    return mse_losses(model, example.make_optimizer(model.parameters()), example.make_batch, example.STEPS)


@pytest.mark.parametrize("name", ["ddp_train.py", "pipeline_train.py"])
def test_example_prints_the_single_process_losses(name: str) -> None:
    """Each example prints its per-step loss once (rank 0), and the losses are those of
    one process training on the whole batch."""
    example = load_example(name)
    printed = run_example(name)
    assert len(printed) == example.STEPS
    close(printed, whole_batch_losses(example), f"{name} losses", TOLERANCE)
