"""TorchTitan 0.3 end to end on the neuron device: its Llama3 debug model, 3 steps on 2 ranks.

TorchTitan runs as it ships (``torchrun -m torchtitan.train``, no neuron-specific code): it
finds the neuron device by itself through torch's PrivateUse1 branch and its c10d backend
through ``Backend.default_device_backend_map``. Its own config for the debug model stays as it
is (compiled FlexAttention with a block-causal mask, selective activation checkpointing,
FSDP2 with bfloat16 parameters and float32 gradient reduction, fused AdamW), except what makes
the run small and offline: 3 steps on batches of 2 x 256 tokens, the generated tokenizer and
dataset of ``examples/torchtitan/make_assets.py``, no validation.

The reference is the same run on the CPU over gloo (``examples/torchtitan/cpu_reference.py``).
Both start from one seed checkpoint (TorchTitan's own way of starting parallelisms from the
same weights: its initialisation draws from each device's generator and DTensor's RNG
tracker, which differ between the CPU and an accelerator). Each step's loss (TorchTitan's
``loss_metrics/global_avg_loss``) and gradient norm, read from its TensorBoard log, must match
the reference's within bfloat16's precision (relative 2**-8), the precision the config
computes in: FSDP2 casts the parameters to bfloat16, so every matmul and the attention round
to bfloat16, and the neuron run compiles FlexAttention into one graph (float32 inside) where the
reference runs it op by op. With FlexAttention eager on neuron too
(``examples/torchtitan/eager_attention.py``), both do the same arithmetic and every loss and
gradient norm must be equal bit for bit. The configs run:

* ``fsdp``: FSDP2 over both ranks;
* ``fsdp_tp``: tensor parallelism of degree 2 under FSDP2 (of degree 1 on 2 ranks: TorchTitan
  wraps every block in FSDP2 all the same, which casts the parameters to bfloat16).

Needs torch >= 2.14 (TorchTitan calls ``torch.distributed.set_timeout``), torchtitan and
triton (TorchTitan imports it unconditionally); it skips without them, but fails in CI.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "torchtitan"
STEPS = 3
CONFIGS = {
    "fsdp": [],
    "fsdp_tp": ["--parallelism.tensor_parallel_degree", "2"],
}


def missing_requirements() -> list[str]:
    """What this test needs and this environment lacks."""
    missing = []
    if tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) < (2, 14):
        missing.append(f"torch >= 2.14 (this is {torch.__version__})")
    for name in ("torchtitan", "triton"):
        if importlib.util.find_spec(name) is None:
            missing.append(name)
    return missing


BFLOAT16_PRECISION = 2.0**-8


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    missing = missing_requirements()
    if missing:
        reason = f"TorchTitan's end-to-end test needs {', '.join(missing)}: pip install torchtitan==0.3.0 triton"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI must run it, so this fails instead of skipping)")
        pytest.skip(reason)
    spec = importlib.util.spec_from_file_location("make_assets", EXAMPLE / "make_assets.py")
    make_assets = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_assets)
    tokenizer, dataset = make_assets.write_assets(tmp_path_factory.mktemp("titan_assets"))
    # The seed checkpoint: the model's initial weights, written by one process on the CPU.
    seed = tmp_path_factory.mktemp("titan_seed")
    run_torchtitan([str(EXAMPLE / "cpu_reference.py")], 1, (tokenizer, dataset), seed, on_cpu=True, extra=[
        "--checkpoint.enable", "--checkpoint.create_seed_checkpoint", "--parallelism.data_parallel_shard_degree", "1"])
    return tokenizer, dataset, seed / "checkpoint" / "step-0"


def run_torchtitan(entry: list[str], ranks: int, assets: tuple[Path, ...], dump: Path, on_cpu: bool,
                   extra: list[str]) -> str:
    """TorchTitan's trainer on ``ranks`` processes under torchrun, its log."""
    tokenizer, dataset = assets[:2]
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks), *entry,
        "--module", "llama3", "--config", "llama3_debugmodel",
        "--hf_assets_path", str(tokenizer), "--dataloader.dataset_path", str(dataset),
        "--training.steps", str(STEPS), "--training.seq_len", "256", "--training.local_batch_size", "2",
        "--validator.no-enable", "--debug.seed", "0",
        "--metrics.enable_tensorboard", "--metrics.disable_color_printing", "--dump_folder", str(dump),
        *extra,
    ]
    env = {**os.environ, "HF_HOME": str(dump / "hf"), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    if on_cpu:
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    done = subprocess.run(command, env=env, cwd=dump, capture_output=True, text=True, timeout=900)
    log = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(entry)} {' '.join(extra)} failed:\n{log[-6000:]}"
    return log


@pytest.fixture(scope="module")
def reference(assets: tuple[Path, Path, Path], tmp_path_factory: pytest.TempPathFactory):
    """The CPU reference's scalars for a config, each run once."""
    done: dict[str, dict[str, list[float]]] = {}

    def scalars(config: str) -> dict[str, list[float]]:
        if config not in done:
            dump = tmp_path_factory.mktemp(f"cpu_{config}")
            done[config] = train([str(EXAMPLE / "cpu_reference.py")], config, assets, dump, on_cpu=True)
        return done[config]

    return scalars


def train(entry: list[str], config: str, assets: tuple[Path, Path, Path], dump: Path,
          on_cpu: bool) -> dict[str, list[float]]:
    """The config on 2 ranks from the seed checkpoint: each step's loss and gradient norm."""
    log = run_torchtitan(entry, 2, assets, dump, on_cpu, [
        "--checkpoint.enable", "--checkpoint.initial_load_path", str(assets[2]),
        "--checkpoint.initial_load_model_only", "--checkpoint.load_only", *CONFIGS[config]])
    if not on_cpu:
        assert "NEURON capacity" in log, f"TorchTitan did not pick the neuron device:\n{log[-3000:]}"
    return logged_scalars(dump / "tb")


def logged_scalars(folder: Path) -> dict[str, list[float]]:
    """Rank 0's TensorBoard log: each step's loss and gradient norm (float32, as logged)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (run,) = {p.parent for p in folder.rglob("events.out.tfevents.*")}
    events = EventAccumulator(str(run))
    events.Reload()
    scalars = {}
    for name, tag in (("loss", "loss_metrics/global_avg_loss"), ("grad_norm", "grad_norm")):
        logged = events.Scalars(tag)
        assert [s.step for s in logged] == list(range(1, STEPS + 1)), logged
        scalars[name] = [s.value for s in logged]
    return scalars


@pytest.mark.parametrize("config", list(CONFIGS))
def test_llama3_debug_model_matches_the_cpu_reference(config: str, assets: tuple[Path, Path, Path],
                                                      reference, tmp_path: Path) -> None:
    """TorchTitan's Llama3 debug model on 2 neuron ranks: each step's loss and gradient norm
    match the same run's on the CPU over gloo within bfloat16's precision."""
    on_neuron = train(["-m", "torchtitan.train"], config, assets, tmp_path, on_cpu=False)
    on_cpu = reference(config)
    print(f"{config}: neuron {on_neuron} cpu {on_cpu}")
    for name in ("loss", "grad_norm"):
        torch.testing.assert_close(torch.tensor(on_neuron[name]), torch.tensor(on_cpu[name]),
                                   rtol=BFLOAT16_PRECISION, atol=0, msg=lambda m: f"{config} {name}: {m}")


def test_with_eager_flex_attention_fsdp_tp_equals_the_cpu_bit_for_bit(assets: tuple[Path, Path, Path],
                                                                       reference, tmp_path: Path) -> None:
    """FSDP2 + TP with FlexAttention eager on both sides: the same arithmetic, so every step's
    loss and gradient norm equal the CPU's exactly (what the device promises)."""
    on_neuron = train([str(EXAMPLE / "eager_attention.py")], "fsdp_tp", assets, tmp_path, on_cpu=False)
    assert on_neuron == reference("fsdp_tp")
