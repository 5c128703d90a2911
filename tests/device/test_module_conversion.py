"""Module conversion with CUDA's semantics: moving a module to ``neuron`` and back keeps
every Parameter object, so whatever refers to a parameter keeps working.

``nn.Module._apply`` (behind ``.to()``, ``.half()``, ``.cpu()``, ``to_empty()``) swaps a
parameter's data in place (``param.data = new``) only when PyTorch calls the two tensors
shallow-copy compatible; otherwise it builds new Parameter objects, which unties shared
weights and orphans optimizers, hooks and attributes. Every test here compares with the
same code on the CPU, and every one failed before neuron tensors were made compatible
with CPU tensors (``neuron_lab/device/csrc/aten/kernels.cpp``).
"""

from __future__ import annotations


import pytest
import torch
from torch import nn

pytestmark = pytest.mark.usefixtures("replay_tier")


def tied_lm() -> nn.Module:
    """An embedding and an output layer sharing one weight (GPT-2's, BERT's, T5's layout)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 16, bias=False))
    model[3].weight = model[0].weight
    return model


def lm_step(model: nn.Module, opt: torch.optim.Optimizer, device: str) -> float:
    tokens = torch.arange(12).remainder(16).view(3, 4).to(device)
    logits = model(tokens)
    loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


def test_shallow_copy_compatibility_is_cudas() -> None:
    cpu, dev = torch.ones(2), torch.ones(2, device="neuron")
    assert torch._has_compatible_shallow_copy_type(cpu, dev)
    assert torch._has_compatible_shallow_copy_type(dev, cpu)
    assert torch._has_compatible_shallow_copy_type(dev, dev.double())
    # As for CUDA: meta and sparse tensors are not interchangeable with dense ones.
    assert not torch._has_compatible_shallow_copy_type(torch.ones(2, device="meta"), dev)
    assert not torch._has_compatible_shallow_copy_type(torch.ones(2).to_sparse(), cpu)


def test_data_assignment_moves_a_parameter_between_devices() -> None:
    p = nn.Parameter(torch.arange(3.0))
    p.data = p.data.to("neuron")
    assert p.device.type == "neuron" and isinstance(p, nn.Parameter)
    p.data = p.data.cpu()
    torch.testing.assert_close(p.detach(), torch.arange(3.0))


@pytest.mark.parametrize("convert", ["to", "to_dtype", "half_after", "back_to_cpu"])
def test_tied_weights_stay_tied(convert: str) -> None:
    model = tied_lm()
    shared = model[0].weight
    if convert == "to":
        model.to("neuron")
    elif convert == "to_dtype":
        model.to("neuron", torch.float64)
    elif convert == "half_after":
        model.to("neuron").bfloat16()
    else:
        model.to("neuron").cpu()
    assert model[3].weight is model[0].weight is shared
    assert len(list(model.parameters())) == 3  # the shared weight counts once, as on the CPU


def test_tied_model_trains_as_on_the_cpu() -> None:
    cpu_model, dev_model = tied_lm(), tied_lm()
    dev_model.to("neuron")
    cpu_opt = torch.optim.AdamW(cpu_model.parameters(), lr=0.05)
    dev_opt = torch.optim.AdamW(dev_model.parameters(), lr=0.05)
    for _ in range(3):
        assert lm_step(dev_model, dev_opt, "neuron") == lm_step(cpu_model, cpu_opt, "cpu")
    for p_cpu, p_dev in zip(cpu_model.parameters(), dev_model.parameters()):
        assert torch.equal(p_cpu.detach(), p_dev.detach().cpu())
    assert dev_model[3].weight is dev_model[0].weight


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_optimizer_built_before_the_move_trains_the_moved_model(optimizer: str) -> None:
    make = {"sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
            "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.05)}[optimizer]
    cpu_model, dev_model = tied_lm(), tied_lm()
    cpu_opt, dev_opt = make(cpu_model.parameters()), make(dev_model.parameters())
    dev_model.to("neuron")  # after the optimizer was built, as CUDA scripts often do
    cpu_losses = [lm_step(cpu_model, cpu_opt, "cpu") for _ in range(3)]
    dev_losses = [lm_step(dev_model, dev_opt, "neuron") for _ in range(3)]
    assert dev_losses == cpu_losses
    assert cpu_losses[-1] < cpu_losses[0]  # it really trained
    assert all(p.device.type == "neuron" for group in dev_opt.param_groups for p in group["params"])


@pytest.mark.parametrize(("make", "shape"), [
    (lambda: nn.LazyLinear(5), (2, 3)),
    (lambda: nn.Sequential(nn.LazyConv2d(4, 3), nn.LazyBatchNorm2d()), (2, 2, 6, 6)),
    (lambda: nn.LazyConv1d(3, 2), (2, 2, 6)),
], ids=["LazyLinear", "LazyConv2d+LazyBatchNorm2d", "LazyConv1d"])
def test_lazy_modules_moved_before_their_first_forward(make, shape) -> None:
    cpu_model, dev_model = make(), make().to("neuron")
    lazy = [m for m in dev_model.modules() if isinstance(m, nn.modules.lazy.LazyModuleMixin)]
    assert lazy and all(m.has_uninitialized_params() for m in lazy)
    x = torch.randn(shape)
    torch.manual_seed(1)  # the first forward draws the initial weights
    expected = cpu_model(x)
    torch.manual_seed(1)
    actual = dev_model(x.to("neuron"))
    assert all(p.device.type == "neuron" for p in dev_model.parameters())
    assert all(not isinstance(p, nn.parameter.UninitializedParameter) for p in dev_model.parameters())
    torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0)


def test_parameter_attributes_and_hooks_survive() -> None:
    model = nn.Linear(3, 2)
    model.weight.no_weight_decay = True  # the way training scripts tag parameters
    grads, accumulated = [], []
    model.weight.register_hook(lambda g: grads.append(g.device.type))
    model.bias.register_post_accumulate_grad_hook(lambda p: accumulated.append(p.grad.device.type))
    model.to("neuron")
    assert model.weight.no_weight_decay is True
    model(torch.ones(4, 3, device="neuron")).sum().backward()
    assert grads == ["neuron"] and accumulated == ["neuron"]


def test_gradients_move_with_their_parameters() -> None:
    model = nn.Linear(3, 2)
    model(torch.ones(1, 3)).sum().backward()
    grad = model.weight.grad.clone()
    model.to("neuron")
    assert model.weight.grad.device.type == "neuron"
    torch.testing.assert_close(model.weight.grad.cpu(), grad)


@pytest.mark.parametrize("parametrize", ["weight_norm", "orthogonal", "spectral_norm"])
def test_parametrized_modules(parametrize: str) -> None:
    wrap = getattr(nn.utils.parametrizations, parametrize)

    def make() -> nn.Module:
        torch.manual_seed(0)
        return wrap(nn.Linear(4, 4))

    cpu_model, dev_model = make(), make()
    originals = list(dev_model.parametrizations.weight.parameters())
    cpu_opt = torch.optim.SGD(cpu_model.parameters(), lr=0.1)
    dev_opt = torch.optim.SGD(dev_model.parameters(), lr=0.1)
    dev_model.to("neuron")
    assert all(a is b for a, b in zip(dev_model.parametrizations.weight.parameters(), originals))
    x = torch.randn(3, 4)
    for _ in range(2):
        for model, opt, device in ((cpu_model, cpu_opt, "cpu"), (dev_model, dev_opt, "neuron")):
            torch.manual_seed(2)  # spectral_norm draws its power-iteration vectors
            model(x.to(device)).square().sum().backward()
            opt.step()
            opt.zero_grad()
    torch.testing.assert_close(dev_model.weight.cpu(), cpu_model.weight)


def test_to_empty_keeps_parameters() -> None:
    model = tied_lm()
    shared = model[0].weight
    model.to_empty(device="neuron")
    assert model[0].weight is shared and model[3].weight is shared
    assert shared.device.type == "neuron"


def test_meta_initialised_module_then_to_empty_and_init() -> None:
    with torch.device("meta"):
        meta_model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))
    meta_model.to_empty(device="neuron")
    torch.manual_seed(0)
    for layer in (meta_model[0], meta_model[2]):
        layer.reset_parameters()
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))
    x = torch.randn(3, 4)
    torch.testing.assert_close(meta_model(x.to("neuron")).cpu(), reference(x))


@pytest.mark.parametrize("source", ["cpu", "neuron"])
def test_load_state_dict_with_assign(source: str) -> None:
    """The Hugging Face loading path: a meta model takes a state dict by assignment, is
    tied, then moved to neuron; the tie and the values survive."""
    reference = tied_lm()
    state = {k: v.to(source) for k, v in reference.state_dict().items()}
    with torch.device("meta"):
        model = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 16, bias=False))
    model.load_state_dict(state, assign=True)
    assert model[0].weight.device.type == source
    model[3].weight = model[0].weight  # tie_weights()
    model.to("neuron")
    assert model[3].weight is model[0].weight
    tokens = torch.arange(8).view(2, 4)
    torch.testing.assert_close(model(tokens.to("neuron")).cpu(), reference(tokens), rtol=0, atol=0)


def test_swap_tensors_conversion_also_works() -> None:
    """PyTorch's opt-in future behaviour (swap_tensors) keeps identity as well."""
    previous = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        model = tied_lm()
        shared = model[0].weight
        model.to("neuron")
        assert model[3].weight is model[0].weight is shared and shared.device.type == "neuron"
    finally:
        torch.__future__.set_swap_module_params_on_conversion(previous)
