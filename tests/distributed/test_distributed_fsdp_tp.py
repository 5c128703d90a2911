"""FSDP2, DTensor, tensor parallelism and 2-D FSDP + TP on neuron ranks, each against a
single-process reference (allclose 1e-5), and the two examples that use them.

One torchrun launch per rank script covers many cases (a launch costs seconds of
process start); each case is one test here. The rank scripts are in
``tests/rank_scripts/`` (``fsdp_cases``, ``fsdp_four_ranks``, ``tp_cases``,
``dtensor_cases``); they report differences from their references, and these tests
hold them to the tolerances.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch

from ranks import EXAMPLES, SCRIPTS, load_example, mse_losses, run_example, run_on_ranks

ATOL = 1e-5  # float32 against float32: allclose(rtol=0, atol=1e-5), on values of order 1


def results(reports: list[dict[str, Any]], case: str) -> list[dict[str, Any]]:
    """Every rank's result of ``case``; a case that raised on a rank fails with its traceback."""
    per_rank = [rep[case] for rep in reports]
    for rank, result in enumerate(per_rank):
        if "error" in result:
            pytest.fail(f"{case} raised on rank {rank}:\n{result['error']}")
    return per_rank


def assert_close(actual: list[float], expected: list[float], atol: float = ATOL) -> None:
    assert torch.allclose(torch.tensor(actual), torch.tensor(expected), rtol=0, atol=atol), (actual, expected)


def assert_small(diffs: dict[str, float], atol: float = ATOL) -> None:
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= atol, f"{worst} differs by {diffs[worst]:.3g} (> {atol:g}); all: {diffs}"


# ---- FSDP2 on two ranks ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def fsdp(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_on_ranks(SCRIPTS / "fsdp_cases.py", 2, str(tmp_path_factory.mktemp("checkpoint")), timeout=900)


FSDP_TRAINING = ["reshard_after_forward", "keep_unsharded_after_forward", "divide_factor_premul_sum",
                 "divide_factor_forced_sum", "forced_sum_default_factor", "tiny_llama"]


@pytest.mark.parametrize("case", FSDP_TRAINING)
def test_fsdp_training_matches_one_process_on_the_whole_batch(fsdp, case: str) -> None:
    """Losses, first-step gradients and the gathered parameters after three AdamW steps."""
    for result in results(fsdp, case):
        assert_close(result["losses"], result["ref_losses"])
        assert_small(result["grad_diffs"])
        assert_small(result["param_diffs"])


def test_reshard_after_forward_frees_the_unsharded_parameters(fsdp) -> None:
    """With reshard_after_forward the gathered parameters' storages are resized to 0
    after the forward and the blocks hold their shards again; without, they stay."""
    for freed, kept in zip(results(fsdp, "reshard_after_forward"), results(fsdp, "keep_unsharded_after_forward")):
        assert freed["after_forward"] == {"registered_sharded": True, "unsharded_bytes": 0}
        assert kept["after_forward"]["registered_sharded"] is False
        assert kept["after_forward"]["unsharded_bytes"] > 0


@pytest.mark.parametrize("case, ops", [("divide_factor_premul_sum", ["PREMUL_SUM"]),
                                       ("divide_factor_forced_sum", ["SUM"]),
                                       ("forced_sum_default_factor", ["SUM"])])
def test_gradient_divide_factor_reaches_the_backend_as(fsdp, case: str, ops: list[str]) -> None:
    """A factor of 4 on 2 ranks reduces with PREMUL_SUM(1/4); with sum reductions forced,
    SUM and a division (the gradients match the reference's either way)."""
    for result in results(fsdp, case):
        gradient_ops = {pair.split(":")[1] for pair in result["reduce_ops"] if pair.startswith("reduce_scatter")}
        assert gradient_ops == set(ops), result["reduce_ops"]


def test_bf16_mixed_precision_matches_its_emulation(fsdp) -> None:
    """bf16 compute with float32 reduction equals, to 1e-5, the CPU emulation of what each
    rank computes (a bf16 copy on its half batch, float32 mean of the gradients, float32
    AdamW). Against plain float32 the gradients differ by bf16 rounding: bf16 keeps 8
    significant bits (relative step 2**-8 = 3.9e-3), gradients here are below 1 in size
    and pass through a few roundings, so they must agree within 2e-2 -- and differ, which
    shows the compute really ran in bf16."""
    for result in results(fsdp, "bf16_mixed_precision"):
        assert_close(result["losses"], result["ref_losses"])
        assert_small(result["grad_diffs"])
        assert_small(result["param_diffs"])
        assert result["sharded_param_dtypes"] == ["torch.float32"]
        worst = max(result["fp32_grad_diffs"].values())
        assert 0 < worst <= 2e-2, result["fp32_grad_diffs"]


def test_distributed_checkpoint_restores_model_and_optimizer(fsdp) -> None:
    for result in results(fsdp, "distributed_checkpoint"):
        assert result["diff_before_load"] > 0.1  # a differently initialised model
        assert result["model_diff"] == 0.0
        assert result["optim_entries"] > 0 and set(result["optim_diffs"].values()) == {0.0}
        assert result["next_losses"][0] == result["next_losses"][1]
        assert result["after_step_diff"] == 0.0


# ---- four ranks: HSDP and 2-D FSDP + TP --------------------------------------------------------
@pytest.fixture(scope="module")
def four_ranks() -> list[dict[str, Any]]:
    return run_on_ranks(SCRIPTS / "fsdp_four_ranks.py", 4, timeout=900)


def test_hsdp_on_a_2x2_mesh_matches_one_process(four_ranks) -> None:
    for result in results(four_ranks, "hsdp_2x2"):
        assert_close(result["losses"], result["ref_losses"])
        assert_small(result["param_diffs"])
        assert set(result["placements"].values()) == {"(Replicate(), Shard(dim=0))"}


def test_fsdp_over_tensor_parallel_blocks_matches_one_process(four_ranks) -> None:
    coordinates = []
    for result in results(four_ranks, "fsdp_tp_2d"):
        assert_close(result["losses"], result["ref_losses"])
        assert_small(result["param_diffs"])
        assert result["placements"]["0.up.weight"] == "(_StridedShard(dim=0, sf=2), Shard(dim=0))"
        assert result["placements"]["0.down.weight"] == "(Shard(dim=0), Shard(dim=1))"
        coordinates.append(result["coordinate"])
    assert coordinates == [[0, 0], [0, 1], [1, 0], [1, 1]]


def test_random_ops_on_a_2x2_mesh_agree_across_replicas(four_ranks) -> None:
    """normal_ on a DTensor sharded over one mesh dimension and replicated over the other:
    the two replicas of each shard are equal, the shards differ, and all ranks end at
    the same generator offset."""
    per_rank = results(four_ranks, "random_2d")
    local = [torch.tensor(r["local"]) for r in per_rank]  # mesh [[0, 1], [2, 3]], Shard(0) on dim 1
    assert torch.equal(local[0], local[2]) and torch.equal(local[1], local[3])
    assert not torch.equal(local[0], local[1])
    for r in per_rank:
        assert r["local_diff"] == 0.0
        assert r["state_after"] == per_rank[0]["state_after"]


# ---- tensor parallelism --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tp() -> list[dict[str, Any]]:
    return run_on_ranks(SCRIPTS / "tp_cases.py", 2, timeout=900)


@pytest.mark.parametrize("case", ["mlp_colwise_rowwise", "sequence_parallel_layernorm", "sequence_parallel_rmsnorm",
                                  "tiny_llama_attention_mlp"])
def test_tensor_parallel_forward_and_backward_match_one_process(tp, case: str) -> None:
    for result in results(tp, case):
        assert_close(result["losses"], result["ref_losses"])
        assert max(result["output_diffs"]) <= ATOL, result["output_diffs"]
        assert_small(result["grad_diffs"])
        assert_small(result["param_diffs"])
        assert result["sharded"], "the plan sharded no parameter"


# ---- DTensor -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dtensor() -> list[dict[str, Any]]:
    return run_on_ranks(SCRIPTS / "dtensor_cases.py", 2, timeout=900)


def test_distribute_tensor_shards_rank_zeros_data(dtensor) -> None:
    for rank, result in enumerate(results(dtensor, "distribute")):
        assert len(result) == 6
        for placement, r in result.items():
            assert r["local_shape"] == r["expected_shape"], placement
            assert r["local_diff"] == 0.0 and r["full_diff"] == 0.0, (placement, r)
            assert r["device"] == f"neuron:{rank}"
        assert result["S(0)[5, 3]"]["local_shape"] == [[3, 3], [2, 3]][rank]


def test_redistribute_between_shard_replicate_and_partial(dtensor) -> None:
    for result in results(dtensor, "redistribute"):
        assert len(result) == 7
        for r in result.values():
            assert_small({k: v for k, v in r.items() if k.endswith("diff")})
        assert result["S(0)->S(1)"]["placements"] == "(Shard(dim=1),)"


def test_ops_on_dtensors_match_plain_tensors(dtensor) -> None:
    for result in results(dtensor, "ops"):
        assert_small({name: r["diff"] for name, r in result.items()})
        assert result["matmul_partial"]["placements"] == "(Partial(sum),)"
        assert result["sum"]["placements"] == "(Partial(sum),)"


def test_random_ops_on_dtensors_draw_per_shard_and_keep_ranks_in_step(dtensor) -> None:
    """In the offset form each rank's shard is exactly what a generator at that shard's
    offset draws; replicated tensors are equal on all ranks; every rank ends each op at
    the offset past the whole tensor; the same seed gives the same tensor again; an
    explicit generator advances instead of the default one."""
    per_rank = results(dtensor, "random")
    for r in per_rank:
        assert r["start_state"] == [1234, 0]
        for case, offset in (("normal_shard0", 48), ("normal_replicate", 96), ("uniform_shard1", 136),
                             ("dropout_shard0", 184), ("dropout_replicate", 232)):
            assert r[case]["state_after"] == [1234, offset], case
        for case in ("normal_shard0", "normal_replicate", "uniform_shard1", "dropout_shard0"):
            assert r[case]["local_diff"] == 0.0, case
        assert r["normal_shard0"]["shards_differ"]
        assert 0 < r["dropout_shard0"]["kept"] < 24
        assert r["repeat_diff"] == 0.0
        explicit = r["explicit_generator"]
        assert explicit["generator_after"] == [1235, 48]
        assert explicit["default_after"] == explicit["default_before"]
    for case in ("normal_replicate", "dropout_replicate"):
        assert per_rank[0][case]["local"] == per_rank[1][case]["local"], case
    assert per_rank[0]["normal_shard0"]["full"] == per_rank[1]["normal_shard0"]["full"]
    values = set(per_rank[0]["dropout_replicate"]["local"])
    assert values == {0.0, 2.0}


def test_random_dtensor_ops_need_no_opt_in(dtensor) -> None:
    """torch.manual_seed, then DTensor random ops with the generators in their CPU form:
    before, torch's tracker failed with a bare AssertionError (it reads a 16-byte philox
    state). Now the tracker puts the generator into the offset form at (seed, 0): shards
    draw their own numbers, replicas equal ones, all ranks stay at one offset; a
    user-passed generator likewise. Outside DTensor the generator kept the CPU form."""
    per_rank = results(dtensor, "random_no_opt_in")
    for r in per_rank:
        assert r["outside"] == {"state_bytes": 5056, "cpu_numbers": True, "restores": True}
        for case, offset in (("normal_shard0", 48), ("uniform_replicate", 96), ("rand_like_shard0", 144),
                             ("dropout_replicate", 192)):
            assert r[case]["state_after"] == [1234, offset], case
        for case in ("normal_shard0", "uniform_replicate", "rand_like_shard0"):
            assert r[case]["local_diff"] == 0.0, case
        assert r["normal_shard0"]["shards_differ"]
        explicit = r["explicit_generator"]
        assert explicit["bytes_before"] == 5056
        assert explicit["generator_after"] == [1235, 48] and explicit["local_diff"] == 0.0
        assert explicit["default_after"] == [1234, 192]
    for case in ("uniform_replicate", "dropout_replicate"):
        assert per_rank[0][case]["local"] == per_rank[1][case]["local"], case
    assert set(per_rank[0]["dropout_replicate"]["local"]) == {0.0, 2.0}


# ---- compiled FlexAttention under activation checkpointing, FSDP2 ---------------------------------
def test_compiled_flex_attention_under_checkpointing_with_fsdp2_matches_the_cpu() -> None:
    """TorchTitan's way on 2 ranks: compiled FlexAttention with a block mask, each block
    checkpointed (its forward runs again in the backward) and sharded with FSDP2; the losses
    and parameters equal the same model's on the CPU over gloo within float32 rounding (the
    CPU reference attends with causal SDPA: another summation order)."""
    (first, second) = [r["compiled_flex_under_checkpointing"] for r in
                       run_on_ranks(SCRIPTS / "flex_checkpoint_fsdp.py", 2, timeout=900)]
    for result in (first, second):
        assert "error" not in result, result.get("error")
        assert result["sharded"]
        assert_close(result["losses"], result["ref_losses"])
        assert_small(result["param_diffs"])
    assert first["losses"] == second["losses"]


# ---- the examples --------------------------------------------------------------------------------
def reference_losses(example: ModuleType) -> list[float]:
    """The example's model and batches trained in this process on the CPU."""
    model = example.build_model()
    return mse_losses(model, example.make_optimizer(model), example.batch, example.STEPS)


@pytest.mark.parametrize("name", ["fsdp_train.py", "tp_train.py"])
def test_example_prints_the_losses_of_one_process(name: str) -> None:
    example = load_example(name)
    printed = run_example(name)
    assert len(printed) == example.STEPS
    assert_close(printed, reference_losses(example))  # printed with 6 decimals
    assert (EXAMPLES / name).read_text().count("torchrun --standalone --nproc-per-node 2") == 1
