"""``neuron_lab.compare`` and ``%%neuron_compare``: the code run on the device and on a
reference, op by op, naming the first op whose result leaves the reference: its line, its
shapes and the size of the difference; the caller's objects and random numbers untouched."""

from __future__ import annotations

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

import neuron_lab
from neuron_lab.observability.compare import Comparison


def make_model(device: str = "neuron") -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8)).to(device)


def step(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    h = model(x) + 10.0
    var = (h * h).mean(dim=0) - h.mean(dim=0) ** 2  # planted: E[h^2] - E[h]^2 cancels in low precision
    z = (h - h.mean(dim=0)) / (var + 1e-5).sqrt()
    loss = z.square().mean()
    loss.backward()
    return loss


VAR_LINE = step.__code__.co_firstlineno + 2


def test_the_device_gives_the_cpus_numbers_op_by_op() -> None:
    model, x = make_model(), torch.randn(64, 16, device="neuron")
    result = neuron_lab.compare(step, model, x, against="cpu", rtol=0.0, atol=0.0)
    assert isinstance(result, Comparison)
    assert result.first is None, str(result)
    assert result.compared >= 30 and not result.only_subject and not result.only_reference  # forward and backward
    assert "all" in result.headline() and "agree" in result.headline()


def test_autocast_against_float32_names_the_planted_cancellation() -> None:
    model, x = make_model(), torch.randn(64, 16, device="neuron")
    result = neuron_lab.compare(step, model, x, against="float32")
    first = result.first
    assert first is not None, str(result)
    assert first.subject.name == "aten::sub.Tensor" and first.subject.line == VAR_LINE, str(result)
    assert first.subject.text.startswith("var = (h * h).mean(dim=0) - h.mean(dim=0) ** 2"), first.subject.text
    assert first.subject.shapes == ((8,),) and first.relative > 0.1
    assert result.agreed_before > 0  # the bfloat16 matmuls before it stay within bfloat16's tolerance
    assert {c.name for c in result.only_subject} >= {"aten::_to_copy"}  # autocast's casts: not compared
    text = str(result)
    assert f"line {VAR_LINE}, in step: var = (h * h)" in text and "max |difference|" in text


def test_a_kernel_that_differs_on_the_device_is_named_with_its_line() -> None:
    """A planted device bug: an op whose neuron kernel scales by 2.001 instead of 2."""
    library = torch.library.Library("neuron_lab_test_compare", "DEF")
    library.define("double(Tensor x) -> Tensor")
    library.impl("double", lambda x: x * 2, "CPU")
    library.impl("double", lambda x: (x.cpu() * 2.001).to(x.device), "PrivateUse1")

    def compute(x: torch.Tensor) -> torch.Tensor:
        y = x.exp()
        z = torch.ops.neuron_lab_test_compare.double(y)
        return z.sum()

    result = neuron_lab.compare(compute, torch.randn(5, 3, device="neuron"), against="cpu")
    assert result.first is not None and result.first.subject.name == "neuron_lab_test_compare::double"
    assert result.first.subject.line == compute.__code__.co_firstlineno + 2
    assert result.agreed_before == 1  # exp agreed
    assert abs(result.first.relative - 0.0005) < 1e-4


def test_the_callers_objects_and_random_numbers_are_untouched() -> None:
    model, x = make_model(), torch.randn(64, 16, device="neuron")
    weights = [p.detach().cpu().clone() for p in model.parameters()]
    state = torch.neuron.get_rng_state()

    def train(model: torch.nn.Module, x: torch.Tensor) -> None:
        noise = torch.randn_like(x)  # the same numbers in both runs: seeded alike
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x + noise).square().mean().backward()
        opt.step()

    result = neuron_lab.compare(train, model, x, against="cpu", rtol=0.0, atol=0.0)
    assert result.first is None, str(result)
    assert all(torch.equal(p.detach().cpu(), w) for p, w in zip(model.parameters(), weights))
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.neuron.get_rng_state(), state)


def test_the_compiled_tier_against_replay() -> None:
    def chain(x: torch.Tensor) -> torch.Tensor:
        for _ in range(4):
            x = torch.sin(x) * 1.01 + torch.cos(x) * 0.5
        return x.sum()

    result = neuron_lab.compare(chain, torch.randn(4096, device="neuron"), against="replay")
    assert result.subject == "compiled tier" and result.reference == "replay tier"
    assert result.compared >= 16
    assert any("launches ran compiled code" in n and not n.startswith("in the compiled run, 0 ") for n in result.notes), \
        result.notes
    assert result.first is None, str(result)  # TorchInductor rounds differently, within float32's tolerance


def test_against_fastpath_off_compares_the_fast_kernels_with_atens() -> None:
    """The fast host kernels give ATen's bits: against the fast path off, a decode-sized chain
    of small ops (the kernels' inputs) has no difference at all, and the reference really ran
    with the kernels off."""
    from neuron_lab import fastpath
    from neuron_lab.device.trace import device_counters

    def chain(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        y = (x * 1.5 + 0.25).sin().masked_fill(mask, 0.0)
        return torch.softmax(y, dim=-1).sum(dim=0) + y.amax(dim=-1).mean()

    x = torch.randn(8, 16, device="neuron")
    mask = torch.rand(8, 16, device="neuron") > 0.5
    before = device_counters()["host_kernel_ops"]
    result = neuron_lab.compare(chain, x, mask, against="fastpath-off", rtol=0.0, atol=0.0)
    assert result.reference == "fast path off" and result.subject.startswith("fast path ")
    assert result.compared >= 6, str(result)
    assert result.first is None, str(result)
    if fastpath.get_mode() != "off":
        assert device_counters()["host_kernel_ops"] > before  # the subject used the kernels
    assert fastpath.get_mode() in ("on", "off", "validate")  # restored after the reference run


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="compare against one of cpu, replay, float32"):
        neuron_lab.compare(lambda: None, against="gpu")
    with pytest.raises(ValueError, match="rtol must be a number >= 0"):
        neuron_lab.compare(lambda: None, rtol=-1)
    with pytest.raises(TypeError, match="a function or a code string"):
        neuron_lab.compare(42)


# ---- the magic -------------------------------------------------------------------------------


CELL = """\
%%neuron_compare --against float32 -o found
h = model(x) + 10.0
var = (h * h).mean(dim=0) - h.mean(dim=0) ** 2
var.sum()
"""


def test_the_magic_names_the_cell_line(ip: InteractiveShell) -> None:
    ip.user_ns.update(model=make_model(), x=torch.randn(64, 16, device="neuron"))
    with capture_output() as captured:
        result = ip.run_cell(CELL, store_history=True)
    assert result.error_in_exec is None, captured.stdout + captured.stderr
    found = ip.user_ns["found"]
    assert isinstance(result.result, Comparison) and result.result is found
    assert found.first.subject.name == "aten::sub.Tensor"
    assert found.first.subject.where == f"Cell In[{result.execution_count}], line 3"
    assert "var" not in ip.user_ns  # the runs used copies: the notebook's variables are as they were


@pytest.mark.parametrize("line, message", [
    ("--against gpu", "compare against one of"),
    ("--rtol -1", "--rtol must be a number >= 0"),
    ("-o 1x", "-o needs a variable name"),
])
def test_magic_bad_options_are_usage_errors(ip: InteractiveShell, line: str, message: str) -> None:
    with capture_output() as captured:
        result = ip.run_cell(f"%%neuron_compare {line}\nx = 1\n", store_history=True)
    assert isinstance(result.error_in_exec, UsageError), captured.stdout + captured.stderr
    assert message in str(result.error_in_exec)
