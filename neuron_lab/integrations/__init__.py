"""Libraries that do not know the neuron device, taught what it is.

On CUDA these work with no configuration; on neuron each needed one small adapter:

* **Hugging Face accelerate and the transformers Trainer** pick their device from a
  fixed list and recognise Neuron only through the ``torch_neuronx`` package, so they
  trained on the CPU. neuron_lab sets accelerate's documented device variable,
  ``ACCELERATE_TORCH_DEVICE=neuron``, when it is unset (``huggingface.py``).
* **FlexAttention** (``torch.nn.attention.flex_attention``) refuses tensors of devices
  outside a fixed list. Its dense implementation is device-generic: it runs on neuron,
  forward and backward (``flex_attention.py``).
* **DTensor's random ops** read the device generator's state as CUDA's philox state (seed,
  offset); a neuron generator starts in its CPU form (the CPU's numbers). When DTensor's
  RNG tracker runs on a neuron mesh it puts the generator into the offset form first
  (``dtensor_random.py``).
* **torch.compile's default backend, TorchInductor,** has no code generator for the
  neuron device. Graphs on neuron tensors compile for the host (whose memory the
  emulated cores use) and run as inline launches: the ``neuron`` backend's inline path
  (``inductor.py``). Hugging Face's FlexAttention and block masks compile this way.

The accelerate default is set at ``import torch`` (a Trainer decides its device before
any tensor exists); the others wait for the first use of the device, and for the
library's own import (``wrapt``'s post-import hooks): a program that never uses neuron,
or never imports Inductor, is left as it was.
"""

from __future__ import annotations

__all__ = ["install_at_import", "install_on_first_use"]


def install_at_import() -> None:
    """What must be in place before the device is first used (cheap: no imports)."""
    from neuron_lab.integrations import huggingface

    huggingface.default_accelerate_device()


def install_on_first_use() -> None:
    """Adapters of libraries, each applied when its library is imported (or now, if it is)."""
    from wrapt import register_post_import_hook

    from neuron_lab.integrations import dtensor_random, flex_attention, inductor

    register_post_import_hook(flex_attention.accept_neuron_tensors, "torch.nn.attention.flex_attention")
    register_post_import_hook(dtensor_random.draw_as_philox, "torch.distributed.tensor._random")
    register_post_import_hook(inductor.compile_neuron_graphs_for_the_host, "torch._inductor.compile_fx")
