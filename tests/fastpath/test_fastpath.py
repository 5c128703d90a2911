"""The fast host kernels' seam (neuron_lab/device/csrc/aten/host_kernel_table.h) and their package
(neuron_lab.fastpath): NEURON_LAB_FASTPATH=off runs ATen's kernels only, validate compares
each kernel's result with ATen's and names the kernel and the inputs where a bit differs, an
unvalidated torch turns the kernels off with one warning, and KERNELS.md lists every kernel."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import neuron_lab
from conftest import run_python
from neuron_lab import fastpath
from neuron_lab.device import trace

KERNELS_MD = Path(fastpath.__file__).with_name("KERNELS.md")


def host_kernel_ops(fn) -> int:
    """How many ops of ``fn`` a fast host kernel took (device_counters' host_kernel_ops)."""
    torch.neuron.synchronize()
    before = trace.device_counters()["host_kernel_ops"]
    fn()
    torch.neuron.synchronize()
    return trace.device_counters()["host_kernel_ops"] - before


def decode_like_step() -> None:
    """Ops of a decoding loop that the fast path takes, on every path that reads the table:
    at once (add, neg, cat, mm, clone, argmax), boxed (eager mode's one-op graphs of small
    arithmetic, their out= twins through the fallback) and recorded arithmetic (empty results)."""
    with neuron_lab.mode("eager"):
        a = torch.arange(12.0, device="neuron").reshape(3, 4)
        b = a + a
        (-b).sum(-1)
        torch.cat([a, b], 0).clone().argmax(-1)
        (a @ a.T).tanh()
        F.layer_norm(a, (4,))
    mask = torch.rand(2, 3, 3).gt(0.3).to("neuron")
    scores = torch.randn(2, 3, 3).to("neuron")
    torch.ops.aten._safe_softmax(scores.masked_fill(~mask, float("-inf")), -1)
    (a * b - a).cpu()


@pytest.fixture
def restore_mode():
    previous = fastpath.get_mode()
    yield
    fastpath.set_mode(previous)
    fastpath._native._perturb_kernel_for_tests("")


# ---- off, on, validate -----------------------------------------------------------------------


def test_off_runs_no_fast_kernel_and_on_does(restore_mode):
    fastpath.set_mode("on")
    assert host_kernel_ops(decode_like_step) > 0
    fastpath.set_mode("off")
    assert host_kernel_ops(decode_like_step) == 0


def test_off_from_the_environment_keeps_host_kernel_ops_at_zero():
    result = run_python(
        """
        import torch, neuron_lab
        from neuron_lab import fastpath
        from neuron_lab.device import trace
        a = torch.arange(12.0, device="neuron").reshape(3, 4)
        ((a + a) @ a.T).argmax(-1).cpu()
        torch.cat([a, -a]).clone().sum(-1).cpu()
        print(fastpath.get_mode(), trace.device_counters()["host_kernel_ops"])
        """,
        env={"NEURON_LAB_FASTPATH": "off"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["off", "0"]


def test_results_are_the_same_bits_with_the_fast_path_on_off_and_validating(restore_mode):
    def step():
        with neuron_lab.mode("eager"):
            x = torch.linspace(-3, 3, 24, device="neuron").reshape(4, 6)
            y = torch.cat([x * x - x, x.rsqrt(), x.pow(2)], 0)
            return (F.layer_norm(y, (6,)) @ x.T.contiguous()).neg().cpu()

    outs = {}
    for m in fastpath.MODES:
        fastpath.set_mode(m)
        outs[m] = step()
    for m in ("on", "validate"):
        assert outs[m].dtype == outs["off"].dtype and outs[m].shape == outs["off"].shape
        assert torch.equal(outs[m].view(torch.int32), outs["off"].view(torch.int32)), m


def _inputs() -> dict[str, torch.Tensor]:
    return {"x": torch.tensor([1.0, 2.0, 3.0], device="neuron"), "y": torch.tensor([0.5, 0.25, 4.0], device="neuron"),
            "cache": torch.randn(1, 4, 6, 8, device="neuron"), "token": torch.randn(1, 4, 1, 8, device="neuron"),
            "w": torch.randn(96, 32, device="neuron"), "v": torch.randn(1, 32, device="neuron")}


@pytest.mark.parametrize("kernel, op, run", [
    ("small_arith", "aten::add", lambda t: t["x"] + t["y"]),
    ("dense_cat", "aten::cat", lambda t: torch.cat([t["cache"], t["token"]], -2)),
    ("blas_matmul", "aten::mm", lambda t: t["v"] @ t["w"].t()),
])
def test_validate_raises_at_a_differing_bit_naming_the_kernel_and_inputs(restore_mode, kernel, op, run):
    fastpath.set_mode("validate")
    t = _inputs()
    with neuron_lab.mode("blocking"):
        assert host_kernel_ops(lambda: run(t).cpu()) == 1  # the true kernel runs and passes validation
        fastpath._native._perturb_kernel_for_tests(kernel)
        with pytest.raises(RuntimeError) as caught:
            run(t).cpu()
    message = str(caught.value)
    assert f"kernel '{kernel}'" in message and op in message
    assert "differs first at element 0" in message
    assert re.search(r"Inputs: \(\[?Tensor\(Float, sizes \[", message)
    assert "NEURON_LAB_FASTPATH=off" in message


def test_validate_checks_the_boxed_path_too(restore_mode):
    """Eager mode runs small arithmetic as one-op graphs, their out= twin boxed (the fallback,
    replay): a differing bit there raises as well, naming the boxed kernel."""
    fastpath.set_mode("validate")
    t = _inputs()
    fastpath._native._perturb_kernel_for_tests("small_arith")
    with pytest.raises(RuntimeError, match=r"kernel 'small_arith'.*aten::add\.out"):
        with neuron_lab.mode("eager"):
            (t["x"] + t["y"]).cpu()


def test_a_family_switched_off_runs_none_of_its_kernels(restore_mode):
    fastpath.set_mode("on")
    t = _inputs()
    mm = lambda: t["v"] @ t["w"].t()  # noqa: E731
    with neuron_lab.mode("blocking"):
        assert host_kernel_ops(mm) == 1
        with fastpath.families_enabled(set(fastpath.families()) - {"matmul"}):
            assert host_kernel_ops(mm) == 0
        assert host_kernel_ops(mm) == 1
    with pytest.raises(ValueError, match="no fast-path families named"):
        with fastpath.families_enabled({"no_such_family"}):
            pass


def test_a_bad_mode_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="off, on, validate"):
        fastpath.start({"NEURON_LAB_FASTPATH": "fast"})
    with pytest.raises(ValueError, match="off, on, validate"):
        fastpath.set_mode("fast")


# ---- the torch versions the kernels were validated on ----------------------------------------


def test_validated_on_compares_the_release_series():
    assert fastpath.validated_on(fastpath.VALIDATED_TORCH[0] + ".0")
    assert fastpath.validated_on(fastpath.VALIDATED_TORCH[0] + ".7+cpu")
    assert not fastpath.validated_on("1.0.0")
    assert not fastpath.validated_on("99.1.0+cu999")


def test_an_unvalidated_torch_turns_the_fast_path_off_with_one_warning(restore_mode, monkeypatch):
    monkeypatch.setattr(torch, "__version__", "99.1.0")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert fastpath.start({}) == "off"
    assert fastpath.get_mode() == "off"
    relevant = [w for w in caught if "fast host kernels" in str(w.message)]
    assert len(relevant) == 1 and "99.1.0" in str(relevant[0].message)
    # validate stays validate there: it is how a new version is validated
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert fastpath.start({"NEURON_LAB_FASTPATH": "validate"}) == "validate"
    assert not [w for w in caught if "fast host kernels" in str(w.message)]


def test_a_validated_torch_starts_on_without_a_warning(restore_mode, monkeypatch):
    # the suite also runs on torches the fast path was not validated on (scripts/matrix.py)
    monkeypatch.setattr(torch, "__version__", fastpath.VALIDATED_TORCH[-1] + ".0+cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fastpath.start({}) == "on"


# ---- the document ----------------------------------------------------------------------------


def test_kernels_md_lists_every_registered_kernel_with_its_family_and_what_it_mirrors():
    text = KERNELS_MD.read_text()
    rows = {}
    family = None
    for line in text.splitlines():
        heading = re.match(r"Family \*\*(\w+)\*\*", line)
        if heading:
            family = heading.group(1)
        cell = re.match(r"\| `(\w+)` \|", line)
        if cell:
            rows[cell.group(1)] = family
    registered = {k["kernel"]: k["family"] for k in fastpath.kernels()}
    assert registered, "no fast host kernel is registered"
    assert rows == registered, "KERNELS.md and the registered kernels differ"
    for k in fastpath.kernels():
        assert k["mirrors"], k
    assert re.search(r"\| {}\b".format(re.escape(fastpath.VALIDATED_TORCH[0])), text)


def test_validate_checks_a_recorded_results_layout_against_the_cpu_kernel(restore_mode):
    """Recorded small arithmetic sizes its result with an empty-result kernel; validate checks
    that layout against the CPU kernel's, which keeps a size-1 dim's own stride where meta's
    does not ([1, 4, 1, 8] of strides [32, 8, 32, 1] times a number: the CPU's result keeps 32)."""
    fastpath.set_mode("validate")
    x = torch.randn(32).as_strided((1, 4, 1, 8), (32, 8, 32, 1))
    d = torch.empty_strided(x.shape, x.stride(), device="neuron").copy_(x)
    with neuron_lab.mode("eager"):
        got = (d * 2).cpu()
    expected = x * 2
    assert got.stride() == expected.stride() == (32, 8, 32, 1)
    assert torch.equal(got, expected)
