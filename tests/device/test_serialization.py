"""torch.save / torch.load, deepcopy and pickle of neuron tensors and modules."""

from __future__ import annotations

import copy
import io
import pickle

import torch


def roundtrip(obj, **load_kwargs):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, **load_kwargs)


def test_save_load_keeps_device_and_values() -> None:
    x = torch.randn(3, 4, device="neuron:1")
    y = roundtrip(x)
    assert y.device == torch.device("neuron", 1)
    assert torch.equal(y.cpu(), x.cpu())


def test_map_location() -> None:
    x = torch.arange(5.0, device="neuron:1")
    assert roundtrip(x, map_location="cpu").device.type == "cpu"
    assert roundtrip(x, map_location="neuron:0").device == torch.device("neuron", 0)
    assert roundtrip(x.cpu(), map_location="neuron").device.type == "neuron"


def test_state_dict_roundtrip() -> None:
    model = torch.nn.Linear(4, 2).neuron()
    state = roundtrip(model.state_dict())
    fresh = torch.nn.Linear(4, 2).neuron()
    fresh.load_state_dict(state)
    for a, b in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(a.cpu(), b.cpu())


def test_shared_storage_is_preserved() -> None:
    base = torch.arange(6.0, device="neuron")
    a, b = roundtrip((base, base[2:]))
    b.add_(10)
    assert a[2].item() == 12.0  # views still share storage after loading


def test_deepcopy_and_pickle() -> None:
    x = torch.arange(4.0, device="neuron:1")
    y = copy.deepcopy(x)
    assert y.device == x.device and torch.equal(y.cpu(), x.cpu())
    y.add_(1)
    assert x[0].item() == 0.0
    z = pickle.loads(pickle.dumps(x))
    assert z.device == x.device and torch.equal(z.cpu(), x.cpu())
    model = copy.deepcopy(torch.nn.Linear(2, 2).neuron())
    assert next(model.parameters()).device.type == "neuron"


def test_untyped_storage() -> None:
    x = torch.arange(4, dtype=torch.int32, device="neuron")
    storage = x.untyped_storage()
    assert storage.device.type == "neuron" and storage.nbytes() == 16
    assert storage.cpu().tolist()[:4] == [0, 0, 0, 0]  # little-endian bytes of 0
    resized = torch.UntypedStorage(8, device="neuron")
    resized.resize_(64)
    assert resized.nbytes() == 64


def test_pickle_and_the_legacy_format_wait_for_values_still_being_computed() -> None:
    """``pickle.dumps``, the legacy ``torch.save`` format and object collectives write a
    storage from its raw memory, and ``torch.load`` of that format fills one through a
    copy over the raw pointer: a tensor still pending in adaptive eager used to be
    written as zeros, and a loaded one read before its bytes arrived (both most times)."""
    import io
    import pickle

    expected = torch.linspace(0, 1, 5).exp()
    for _ in range(20):
        x = torch.arange(4.0, device="neuron") + 1  # recorded, not yet computed
        assert torch.equal(pickle.loads(pickle.dumps(x)).cpu(), torch.tensor([1.0, 2.0, 3.0, 4.0]))
        y = torch.linspace(0, 1, 5, device="neuron").exp()
        buffer = io.BytesIO()
        torch.save({"y": y}, buffer, _use_new_zipfile_serialization=False)
        buffer.seek(0)
        assert torch.equal(torch.load(buffer)["y"].cpu(), expected)
        torch.neuron.synchronize()  # the device idle: what remains is the load's copy
        buffer.seek(0)
        assert torch.equal(torch.load(buffer)["y"].cpu(), expected)


def test_the_storage_writer_is_wrapped_only_once_the_device_is_used() -> None:
    from conftest import run_python

    done = run_python("""
        import torch
        before = getattr(torch.UntypedStorage._write_file, "_waits_for_neuron", False)
        torch.ones(1, device="neuron")
        print(before, getattr(torch.UntypedStorage._write_file, "_waits_for_neuron", False))
        """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]
