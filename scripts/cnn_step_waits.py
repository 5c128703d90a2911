"""Host waits per training step of a ResNet-18-shaped model and a tiny diffusers UNet on the
neuron device (adaptive mode), by what they waited on, and a rough step-time ratio against
CPU eager. Usage: python scripts/cnn_step_waits.py [--steps N] [--model resnet|unet|both]."""

from __future__ import annotations

import argparse
import collections
import time

import torch

import neuron_lab  # noqa: F401  (registers the device)
from neuron_lab import adaptive_eager as ae


def resnet18_shaped() -> tuple[torch.nn.Module, callable]:
    from transformers import ResNetConfig, ResNetForImageClassification

    config = ResNetConfig(layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512],
                          embedding_size=64, num_labels=10)
    torch.manual_seed(0)
    model = ResNetForImageClassification(config)
    pixels = torch.randn(8, 3, 64, 64)
    labels = torch.randint(0, 10, (8,))

    def loss_of(m, device):
        return m(pixel_values=pixels.to(device), labels=labels.to(device)).loss

    return model, loss_of


def tiny_unet() -> tuple[torch.nn.Module, callable]:
    import diffusers

    torch.manual_seed(0)
    model = diffusers.UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32, attention_head_dim=8, norm_num_groups=8)
    sample = torch.randn(2, 4, 16, 16)
    timestep = torch.tensor([10, 500])
    context = torch.randn(2, 7, 32)
    target = torch.randn(2, 4, 16, 16)

    def loss_of(m, device):
        out = m(sample.to(device), timestep.to(device), encoder_hidden_states=context.to(device)).sample
        return torch.nn.functional.mse_loss(out, target.to(device))

    return model, loss_of


MODELS = {"resnet": resnet18_shaped, "unet": tiny_unet}


def train(make, device: str, steps: int, count_waits: bool = False):
    import copy

    model, loss_of = make()
    model = copy.deepcopy(model).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    waits_per_step, losses, times = [], [], []
    for _ in range(steps):
        if count_waits:
            torch.neuron.synchronize()
            ae.reset_counters()
        start = time.perf_counter()
        loss = loss_of(model, device)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if device != "cpu":
            torch.neuron.synchronize()
        times.append(time.perf_counter() - start)
        if count_waits:
            waits_per_step.append(dict(ae.counters()["syncs"]))
        losses.append(loss.detach().cpu())
    return model, losses, times, waits_per_step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--model", choices=["resnet", "unet", "both"], default="both")
    args = parser.parse_args()
    for name in (["resnet", "unet"] if args.model == "both" else [args.model]):
        make = MODELS[name]
        _, _, _, waits = train(make, "neuron", args.steps, count_waits=True)
        steady = waits[-1]
        print(f"{name}: waits per step (by reason), first step {sum(waits[0].values())}, last step "
              f"{sum(steady.values())}:")
        for why, n in collections.Counter(steady).most_common():
            print(f"    {n:4d}  {why}")
        _, _, cpu_times, _ = train(make, "cpu", args.steps)
        _, _, dev_times, _ = train(make, "neuron", args.steps)
        cpu_t = sorted(cpu_times[2:])[len(cpu_times[2:]) // 2]
        dev_t = sorted(dev_times[2:])[len(dev_times[2:]) // 2]
        print(f"{name}: median step {dev_t * 1e3:.1f} ms neuron vs {cpu_t * 1e3:.1f} ms CPU eager: "
              f"{dev_t / cpu_t:.2f}x (threads {torch.get_num_threads()})")


if __name__ == "__main__":
    main()
