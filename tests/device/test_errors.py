"""Bad input gets a clear error and loses nothing: the runtime and every tensor stay intact."""

from __future__ import annotations

import pytest
import torch

from conftest import run_python


@pytest.fixture
def survivor() -> torch.Tensor:
    return torch.arange(10.0, device="neuron")


def assert_intact(t: torch.Tensor) -> None:
    assert t.cpu().tolist() == [float(i) for i in range(10)]
    assert (t * 2).sum().item() == 90.0


BAD_CALLS = {
    "shape mismatch": lambda: torch.ones(3, device="neuron") + torch.ones(4, device="neuron"),
    "matmul shapes": lambda: torch.ones(2, 3, device="neuron") @ torch.ones(2, 3, device="neuron"),
    "index out of range": lambda: torch.ones(3, device="neuron")[torch.tensor([7], device="neuron")],
    "bad dim": lambda: torch.ones(3, device="neuron").sum(dim=5),
    "mixed devices": lambda: torch.ones(3, device="neuron") * torch.ones(3),
    "wrong core": lambda: torch.ones(3, device="neuron:9"),
    "sparse": lambda: torch.ones(2, device="neuron").to_sparse(),
    "out of memory": lambda: torch.empty(2**40, device="neuron"),
    "pin neuron memory": lambda: torch.empty(2, device="neuron", pin_memory=True),
    "bad view": lambda: torch.ones(2, 3, device="neuron").t().view(6),
    "numpy": lambda: torch.ones(2, device="neuron").numpy(),
    "item of many": lambda: torch.ones(2, device="neuron").item(),
    "in-place on leaf": lambda: torch.ones(2, device="neuron", requires_grad=True).add_(1),
    "bad dtype op": lambda: torch.ones(2, device="neuron", dtype=torch.bool).neg(),
}


@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_bad_input_raises_and_loses_nothing(name: str, survivor: torch.Tensor) -> None:
    with pytest.raises(Exception) as info:
        BAD_CALLS[name]()
        # Errors only a kernel detects are raised at the next wait in the asynchronous modes.
        torch.neuron.synchronize()
    assert not isinstance(info.value, AssertionError)
    assert str(info.value)  # a message, not a bare exception
    assert_intact(survivor)


def test_error_paths_never_crash_the_process() -> None:
    """Everything above, plus known crashers of naive backends, in a fresh process."""
    result = run_python(
        """
        import copy, torch
        keep = torch.arange(4.0, device="neuron")
        attempts = [
            lambda: torch.UntypedStorage(16, device="neuron"),
            lambda: copy.deepcopy(torch.ones(2, device="neuron")),
            lambda: torch.ones(2, dtype=torch.complex64, device="neuron").conj().cpu(),
            lambda: torch.ones(2, dtype=torch.complex64, device="neuron").conj().neg().clone().cpu(),
            lambda: torch.ones(2, device="neuron").to_sparse(),
            lambda: torch.empty(2**45, dtype=torch.uint8, device="neuron"),
            lambda: torch.ones(3, device="neuron", requires_grad=True).split(1)[0].sum().backward(),
            lambda: torch.ones(2, device="neuron").resize_(10**6).sum(),
            lambda: torch.empty(0, device="neuron").max(),
        ]
        for attempt in attempts:
            try:
                attempt()
            except Exception:
                pass
        print(keep.cpu().tolist())
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[0.0, 1.0, 2.0, 3.0]"


@pytest.mark.parametrize(
    "mutate",
    [
        lambda x: x.resize_(-1),
        lambda x: x.resize_(2**62),
        lambda x: x.resize_(2**33),  # 32 GiB: more than a core holds
        lambda x: x.resize_(3, memory_format=torch.channels_last),
        lambda x: torch.empty(0, device="neuron").set_(x.untyped_storage(), 2**40, (4,), (1,)),
        lambda x: torch.empty(0, device="neuron").set_(x.untyped_storage(), -5, (4,), (1,)),
    ],
    ids=["negative", "overflow", "oom", "bad-memory-format", "set-oom", "set-negative-offset"],
)
def test_failed_resize_or_set_leaves_the_tensor_as_it_was(mutate) -> None:
    x = torch.arange(4.0, device="neuron")
    with pytest.raises((RuntimeError, torch.OutOfMemoryError)):
        mutate(x)
    assert x.shape == (4,) and x.stride() == (1,)
    assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_resize_keeps_data_and_supports_memory_formats() -> None:
    x = torch.arange(6.0, device="neuron")
    x.resize_(2, 3)
    assert x.cpu().tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    y = torch.empty(0, device="neuron").resize_(2, 3, 4, 5, memory_format=torch.channels_last)
    assert y.is_contiguous(memory_format=torch.channels_last)
    z = torch.empty(2, 3, device="neuron")
    strides = z.t().stride()
    w = z.t()
    w.resize_(3, 2)  # same sizes, no format: strides kept, as on the CPU
    assert w.stride() == strides
