"""Hugging Face transformers on neuron, against the same code on the CPU.

Eight tiny random models (``tests/hf_models.py``): decoder-only with tied (GPT-2) and
untied (Llama) output layers, an encoder (BERT), encoder-decoders (T5, Whisper), vision
(ViT) and mixture-of-experts (Mixtral, Qwen2-MoE). Each trains a few AdamW steps in train
mode (dropout on: the same seed draws the same masks as the CPU) in the default mode and
in blocking mode, with losses and every parameter within 1e-5 of the CPU's; the
generative ones decode greedily with the default KV cache to exactly the CPU's tokens.
The Trainer (through accelerate) and a PEFT LoRA fine-tune run on neuron with no
configuration, and the attention implementations eager, sdpa and flex_attention agree.
"""

from __future__ import annotations

import copy
import os
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")  # a test dependency: pyproject's [test] extra

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the shared helpers
from hf_models import GENERATIVE, MODELS, TIED, generation_inputs, make_batch  # noqa: E402

import neuron_lab  # noqa: E402
from neuron_lab.compile import compiled_graphs  # noqa: E402

pytestmark = [pytest.mark.usefixtures("replay_tier"),
              pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]
MODES = ("adaptive", "blocking")
# The device promises the CPU's numbers: losses and every weight after training are equal, not close.
TOLERANCE = {"rtol": 0, "atol": 0}


@pytest.fixture(autouse=True, scope="module")
def quiet_transformers():
    transformers.logging.set_verbosity_error()


def build(name: str, **config):
    torch.manual_seed(0)
    return MODELS[name].build(**config)


def train(model, kind: str, device: str, steps: int = 3) -> tuple[list[float], dict]:
    model = model.to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = torch.Generator().manual_seed(3)
    torch.manual_seed(7)  # the dropout masks (the neuron generators draw the CPU's numbers)
    losses = []
    for _ in range(steps):
        out = model(**{k: v.to(device) for k, v in make_batch(kind, batches).items()})
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(out.loss.item())
    return losses, {k: v.detach().cpu() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(MODELS))
def test_training_in_train_mode_matches_the_cpu(name: str, mode: str) -> None:
    model = build(name)
    kind = MODELS[name].kind
    on_neuron = copy.deepcopy(model)
    cpu_losses, cpu_state = train(model, kind, "cpu")
    with neuron_lab.mode(mode):
        losses, state = train(on_neuron, kind, "neuron")
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(cpu_losses), **TOLERANCE)
    assert cpu_losses[-1] != cpu_losses[0]  # it trained
    assert state.keys() == cpu_state.keys()
    for key in cpu_state:
        torch.testing.assert_close(state[key], cpu_state[key], **TOLERANCE, msg=lambda m, key=key: f"{key}: {m}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", GENERATIVE)
def test_greedy_generate_gives_the_cpus_tokens(name: str, mode: str) -> None:
    model = build(name).eval()
    kind = MODELS[name].kind
    on_neuron = copy.deepcopy(model).to("neuron")
    prompt = generation_inputs(kind, torch.Generator().manual_seed(5))
    settings = {"max_new_tokens": 10, "min_new_tokens": 10, "do_sample": False}
    expected = model.generate(**prompt, **settings)
    with neuron_lab.mode(mode):
        tokens = on_neuron.generate(**{k: v.to("neuron") for k, v in prompt.items()}, **settings)
    assert tokens.device.type == "neuron"
    assert torch.equal(tokens.cpu(), expected), (tokens.cpu(), expected)


@pytest.mark.parametrize("name", TIED)
def test_tied_output_layer_stays_tied(name: str) -> None:
    model = build(name)
    model.to("neuron")
    embedding = model.get_input_embeddings().weight
    assert model.get_output_embeddings().weight is embedding
    assert embedding.device.type == "neuron"


@pytest.mark.parametrize(("name", "implementation"), [
    ("llama", "eager"), ("llama", "sdpa"), ("llama", "flex_attention"),
    ("gpt2", "sdpa"), ("mixtral", "flex_attention"),  # GPT-2 has no flex_attention in transformers
])
def test_attention_implementations_train_as_the_cpus_eager_attention(name: str, implementation: str) -> None:
    """Each attention implementation on neuron trains as eager attention on the CPU
    (without attention dropout, which each implementation draws its own way, on CUDA too)."""
    # Dynamo's caches from earlier tests (other shapes of flex_attention) would mark the shapes
    # dynamic on recompiling, and a dynamic graph takes the async tier: start from a fresh Dynamo.
    torch._dynamo.reset()
    model = build(name, attention_dropout=0.0)
    kind = MODELS[name].kind
    model.set_attn_implementation("eager")
    on_neuron = copy.deepcopy(model)
    on_neuron.set_attn_implementation(implementation)
    cpu_losses, cpu_state = train(model, kind, "cpu", steps=2)
    compiled_before = len(compiled_graphs())
    losses, state = train(on_neuron, kind, "neuron", steps=2)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(cpu_losses), rtol=1e-5, atol=2e-5)
    for key in cpu_state:
        torch.testing.assert_close(state[key], cpu_state[key], rtol=1e-4, atol=2e-5)
    # transformers compiles FlexAttention and its block masks with torch.compile's default
    # backend (once per process and shape): TorchInductor's host code, inline, nothing
    # falling back.
    graphs = compiled_graphs()[compiled_before:]
    assert all(g["tier"] == "inline" for g in graphs), graphs


def _trainer_losses(tmp_path, device_variable: str) -> tuple[list[float], torch.device, torch.device]:
    """Three Trainer steps of tiny Llama; accelerate's device variable as given."""
    from torch.utils.data import Dataset

    class Tokens(Dataset):
        def __init__(self) -> None:
            self.ids = torch.randint(2, 99, (12, 10), generator=torch.Generator().manual_seed(0))

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict:
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    previous = os.environ.get("ACCELERATE_TORCH_DEVICE")
    os.environ["ACCELERATE_TORCH_DEVICE"] = device_variable
    try:
        model = build("llama", attention_dropout=0.0)  # dropout draws from the device's generator
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / device_variable), max_steps=3, per_device_train_batch_size=4,
            logging_steps=1, report_to=[], save_strategy="no", disable_tqdm=True, seed=0, data_seed=0)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens())
        trainer.train()
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        return losses, args.device, next(model.parameters()).device
    finally:
        if previous is None:
            os.environ.pop("ACCELERATE_TORCH_DEVICE", None)
        else:
            os.environ["ACCELERATE_TORCH_DEVICE"] = previous


def test_trainer_trains_on_neuron_with_no_configuration(tmp_path) -> None:
    # neuron_lab sets accelerate's device variable at import when the user has not.
    assert os.environ.get("ACCELERATE_TORCH_DEVICE") == "neuron"
    losses, args_device, param_device = _trainer_losses(tmp_path, os.environ["ACCELERATE_TORCH_DEVICE"])
    assert args_device.type == "neuron" and param_device.type == "neuron"
    cpu_losses, cpu_args_device, _ = _trainer_losses(tmp_path, "cpu")
    assert cpu_args_device.type == "cpu"
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(cpu_losses), **TOLERANCE)


def test_peft_lora_fine_tune_matches_the_cpu() -> None:
    peft = pytest.importorskip("peft")

    def lora(model):
        config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.1)
        return peft.get_peft_model(model, config)

    torch.manual_seed(1)
    cpu_model = lora(build("llama"))
    on_neuron = copy.deepcopy(cpu_model)
    frozen = {k: v.clone() for k, v in cpu_model.state_dict().items() if "lora_" not in k}
    cpu_losses, cpu_state = train(cpu_model, "causal", "cpu")
    losses, state = train(on_neuron, "causal", "neuron")
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(cpu_losses), **TOLERANCE)
    trained = [k for k in cpu_state if "lora_" in k]
    assert trained and all(p.device.type == "neuron" for p in on_neuron.parameters())
    for key in cpu_state:
        torch.testing.assert_close(state[key], cpu_state[key], **TOLERANCE)
    for key, value in frozen.items():  # only the adapters trained
        assert torch.equal(state[key], value), key
