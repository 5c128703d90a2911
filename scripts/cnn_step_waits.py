"""Host waits per training step of a ResNet-18-shaped model and a tiny diffusers UNet on the
neuron device (adaptive mode), by what they waited on, and a rough step-time ratio against
CPU eager (alternating steps, both at torch's default threads; the first step is left out).
Usage: python scripts/cnn_step_waits.py [--steps N] [--model resnet|unet|both]."""

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


def trainer(make, device: str):
    """A generator: each next() runs one AdamW training step (waiting for the device at its
    end) and gives (wall seconds, CPU seconds of all the process's threads, waits by reason)."""
    import copy

    model, loss_of = make()
    model = copy.deepcopy(model).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    while True:
        torch.neuron.synchronize()
        ae.reset_counters()
        start, start_cpu = time.perf_counter(), time.process_time()
        loss = loss_of(model, device)
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss.item()
        torch.neuron.synchronize()
        yield time.perf_counter() - start, time.process_time() - start_cpu, dict(ae.counters()["syncs"])


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--model", choices=["resnet", "unet", "both"], default="both")
    args = parser.parse_args()
    for name in (["resnet", "unet"] if args.model == "both" else [args.model]):
        # Alternating steps, each device's work finished before the other's starts: a load
        # that drifts on a shared machine touches both alike.
        runs = {device: trainer(MODELS[name], device) for device in ("cpu", "neuron")}
        times, cpu_seconds, waits = {"cpu": [], "neuron": []}, {"cpu": [], "neuron": []}, []
        for _ in range(args.steps):
            for device, run in runs.items():
                seconds, used, syncs = next(run)
                times[device].append(seconds)
                cpu_seconds[device].append(used)
                if device == "neuron":
                    waits.append(syncs)
        print(f"{name}: waits per step (by reason), first step {sum(waits[0].values())}, last step "
              f"{sum(waits[-1].values())}:")
        for why, n in collections.Counter(waits[-1]).most_common():
            print(f"    {n:4d}  {why}")
        cpu_t, dev_t = median(times["cpu"][1:]), median(times["neuron"][1:])
        ratios = [n / c for n, c in zip(times["neuron"][1:], times["cpu"][1:])]
        print(f"{name}: median step {dev_t * 1e3:.1f} ms neuron vs {cpu_t * 1e3:.1f} ms CPU eager: "
              f"{dev_t / cpu_t:.2f}x; per-round ratios {[round(r, 2) for r in ratios]} "
              f"(threads {torch.get_num_threads()})")
        # CPU seconds used (both devices' threads): less sensitive than wall time to other
        # processes on a shared machine.
        cpu_used, dev_used = median(cpu_seconds["cpu"][1:]), median(cpu_seconds["neuron"][1:])
        print(f"{name}: median CPU seconds per step {dev_used:.2f} neuron vs {cpu_used:.2f} CPU eager: "
              f"{dev_used / cpu_used:.2f}x")


if __name__ == "__main__":
    main()
