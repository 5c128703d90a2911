"""TorchTitan's trainer on the CPU over gloo: the reference the neuron run is compared with.

Run it with torchrun in place of ``-m torchtitan.train``, with the same arguments:

    torchrun --standalone --nproc-per-node 2 examples/torchtitan/cpu_reference.py \
        --module llama3 --config llama3_debugmodel ...

TorchTitan 0.3 trains on an accelerator only, so this launcher adapts three things, all
on the CPU side and none of them numerical:

* the device: TorchTitan asks torch for the available accelerator and its module; here
  that is the CPU, with the few memory queries its metrics make answered (no peak stats);
* FlexAttention: torch refuses its backward on the CPU (no CPU kernel), and Inductor has no
  CPU lowering of it, so the compiled call is replaced by FlexAttention's own eager
  implementation, the dense decomposition (the one the neuron device runs too);
* gradient reduction: TorchTitan sets FSDP2's gradient divide factor to 1 (it scales the
  loss itself), which FSDP2 sends as ``PREMUL_SUM(1.0)``; gloo has no PREMUL_SUM, so FSDP2
  is told to reduce with SUM and divide by that factor afterwards (x * 1.0 and x / 1.0 are
  exact, so the sums are the same).

Set ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` so that the neuron device is not loaded at all.
"""

from __future__ import annotations

import os
import runpy
import types

import torch
import torch._utils
from eager_attention import use_eager_flex_attention


def _cpu_device_module() -> types.ModuleType:
    """``torch.cpu`` plus the queries TorchTitan's memory monitor makes of a device module."""
    module = types.ModuleType("torch_cpu_for_torchtitan")
    module.__dict__.update({k: getattr(torch.cpu, k) for k in dir(torch.cpu) if not k.startswith("__")})
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    module.get_device_name = lambda device=None: "cpu"
    module.current_device = lambda: 0
    module.get_device_properties = lambda device=None: types.SimpleNamespace(total_memory=total)
    module.reset_peak_memory_stats = lambda device=None: None
    module.empty_cache = lambda: None
    module.memory_stats = lambda device=None: {}
    return module


def use_the_cpu() -> None:
    """Points TorchTitan at the CPU; call before anything imports torchtitan."""
    cpu = _cpu_device_module()
    torch._utils._get_available_device_type = lambda: "cpu"
    torch._utils._get_device_module = lambda device_type=None: cpu

    import torch.nn.attention.flex_attention as flex
    from torch.distributed.fsdp import FSDPModule

    flex._validate_device = lambda query, key, value: None
    use_eager_flex_attention()

    set_factor = FSDPModule.set_gradient_divide_factor

    def set_gradient_divide_factor(self: FSDPModule, factor: float) -> None:
        set_factor(self, factor)
        self.set_force_sum_reduction_for_comms(True)

    FSDPModule.set_gradient_divide_factor = set_gradient_divide_factor


if __name__ == "__main__":
    use_the_cpu()
    runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)
