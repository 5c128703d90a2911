"""Hugging Face accelerate (and so the transformers ``Trainer``) on neuron.

accelerate chooses its device from a fixed list of backends and maps Neuron to the
``torch_neuronx`` package only; without it a Trainer silently trains on the CPU.
``ACCELERATE_TORCH_DEVICE`` is accelerate's documented way to name another device, and
transformers' ``TrainingArguments`` reads it too. neuron_lab sets it to ``neuron`` when it
is unset, so a Trainer, ``Accelerator()`` or PEFT fine-tune runs on neuron, as it would on
CUDA, with no configuration.

To train on the CPU, set ``ACCELERATE_TORCH_DEVICE=cpu`` before importing torch:
accelerate lets the variable win over ``TrainingArguments(use_cpu=True)``.
"""

from __future__ import annotations

import os

__all__ = ["ACCELERATE_DEVICE_VARIABLE", "default_accelerate_device"]

ACCELERATE_DEVICE_VARIABLE = "ACCELERATE_TORCH_DEVICE"


def default_accelerate_device() -> None:
    """``ACCELERATE_TORCH_DEVICE=neuron`` unless the user chose a device already."""
    os.environ.setdefault(ACCELERATE_DEVICE_VARIABLE, "neuron")
