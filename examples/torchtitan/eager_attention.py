"""TorchTitan's trainer with FlexAttention run eagerly instead of compiled, on any device.

    torchrun --standalone --nproc-per-node 2 examples/torchtitan/eager_attention.py \
        --module llama3 --config llama3_debugmodel ...   # torchtitan.train's arguments

TorchTitan always compiles FlexAttention; eagerly, it runs FlexAttention's own dense
implementation op by op, as the CPU reference (``cpu_reference.py``) must, so the two runs
do the same arithmetic and the neuron run's losses equal the CPU's bit for bit.
"""

from __future__ import annotations

import runpy


def use_eager_flex_attention() -> None:
    """TorchTitan's FlexAttention calls ``flex_attention`` itself rather than its compiled form."""
    import torch.nn.attention.flex_attention as flex
    from torchtitan.models.common import attention

    attention.FlexAttention._compiled_flex_attn = flex.flex_attention


if __name__ == "__main__":
    use_eager_flex_attention()
    runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)
