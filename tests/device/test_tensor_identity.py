"""Tensor identity: every live tensor's memory is its own, from creation, in every mode.

Libraries find shared storage by address: safetensors drops all but one of the tensors
it finds at one address ("shared" weights), ``torch.save`` keeps one copy of a storage it
has seen, DDP's buckets and FSDP compare ``data_ptr()``s. Results of recorded ops that
were not computed yet once all reported one address, so ``safetensors.save_model`` wrote
two of a fresh model's four tensors without a word. These tests check the rule itself
(distinct live storages never overlap; an address does not change once a value arrives)
and the libraries' round trips, in each mode, bit for bit.
"""

from __future__ import annotations

import gc
import io

import pytest
import torch

from hf_models import MODELS, make_batch


def _storage_span(t: torch.Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def _assert_disjoint(tensors: dict[str, torch.Tensor]) -> None:
    """Tensors of distinct storages occupy disjoint memory."""
    spans: dict[int, tuple[str, tuple[int, int]]] = {}
    for name, t in tensors.items():
        if t.untyped_storage().nbytes() == 0:
            continue
        key = t.untyped_storage()._cdata  # the StorageImpl: views of one storage share it
        spans.setdefault(key, (name, _storage_span(t)))
    ordered = sorted(spans.values(), key=lambda item: item[1])
    for (name_a, (_, end_a)), (name_b, (start_b, _)) in zip(ordered, ordered[1:]):
        assert end_a <= start_b, f"{name_a} and {name_b} are distinct storages at overlapping addresses"


def test_results_not_computed_yet_have_addresses_of_their_own(mode: str) -> None:
    x = torch.ones(4, device="neuron")
    y = x * 3
    z = x + 1
    addresses = [t.data_ptr() for t in (x, y, z)]
    storages = [t.untyped_storage().data_ptr() for t in (x, y, z)]
    assert len(set(addresses)) == 3 and len(set(storages)) == 3
    # Stable: computing the values does not move them.
    assert y.tolist() == [3.0] * 4 and z.tolist() == [2.0] * 4
    assert [t.data_ptr() for t in (x, y, z)] == addresses
    assert [t.untyped_storage().data_ptr() for t in (x, y, z)] == storages
    # A view's address is its base's plus its offset.
    assert y[1:].data_ptr() == y.data_ptr() + y.element_size()


def test_a_training_step_keeps_every_live_storage_apart(mode: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                                torch.nn.Linear(16, 4)).to("neuron")
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(5, 8, device="neuron")
    hidden = model[:3](x)  # an activation the step below keeps alive
    loss = model[3](hidden).square().mean()
    loss.backward()
    opt.step()
    live = {f"param {n}": p for n, p in model.named_parameters()}
    live |= {f"grad {n}": p.grad for n, p in model.named_parameters()}
    for i, state in enumerate(opt.state.values()):
        live |= {f"state {i} {k}": v for k, v in state.items() if isinstance(v, torch.Tensor) and v.is_neuron}
    live |= {"x": x, "hidden": hidden, "loss": loss}
    addresses = {name: t.data_ptr() for name, t in live.items()}
    _assert_disjoint(live)
    torch.neuron.synchronize()
    assert {name: t.data_ptr() for name, t in live.items()} == addresses


def _fresh_model() -> torch.nn.Module:
    """The issue's model: two Linear layers made on neuron, their values not computed yet."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4, device="neuron"), torch.nn.Linear(4, 4, device="neuron"))


def test_safetensors_save_model_keeps_every_weight(mode: str, tmp_path) -> None:
    safetensors_torch = pytest.importorskip("safetensors.torch")
    first = _fresh_model()
    first[0].weight.sum().item()  # the device is idle: the next model's weights are recorded
    model = _fresh_model()
    expected = {name: t.cpu() for name, t in model.state_dict().items()}
    path = tmp_path / "m.safetensors"
    safetensors_torch.save_model(model, str(path))
    loaded = safetensors_torch.load_file(str(path))
    assert sorted(loaded) == sorted(expected)
    for name, value in expected.items():
        assert torch.equal(loaded[name], value), name
    # save_file and load(bytes) too, and load_model back onto neuron.
    safetensors_torch.save_file(model.state_dict(), str(tmp_path / "f.safetensors"))
    again = safetensors_torch.load(path.read_bytes())
    assert all(torch.equal(again[n], v) for n, v in expected.items())
    target = _fresh_model()
    with torch.no_grad():
        for p in target.parameters():
            p.zero_()
    safetensors_torch.load_model(target, str(path))  # safetensors opens files for the CPU or CUDA only
    assert all(torch.equal(target.state_dict()[n].cpu(), v) for n, v in expected.items())


def test_safetensors_still_finds_weights_that_really_are_shared(mode: str, tmp_path) -> None:
    safetensors_torch = pytest.importorskip("safetensors.torch")
    model = _fresh_model()
    model[1].weight = model[0].weight  # tied, as an embedding and its output layer
    path = tmp_path / "tied.safetensors"
    safetensors_torch.save_model(model, str(path))
    loaded = safetensors_torch.load_file(str(path))
    assert len([n for n in loaded if n.endswith("weight")]) == 1  # stored once, as on the CPU
    assert torch.equal(loaded[next(n for n in loaded if n.endswith("weight"))], model[0].weight.cpu())


def test_torch_save_keeps_aliases_and_separates_distinct_tensors(mode: str) -> None:
    base = torch.arange(12.0, device="neuron") * 2  # not computed yet in the lazy modes
    other = base + 1
    third = base.clone()
    buffer = io.BytesIO()
    torch.save({"base": base, "tail": base[4:], "other": other, "third": third}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    assert loaded["tail"].untyped_storage().data_ptr() == loaded["base"].untyped_storage().data_ptr()
    assert loaded["tail"].data_ptr() == loaded["base"].data_ptr() + 4 * base.element_size()
    distinct = {loaded[k].untyped_storage().data_ptr() for k in ("base", "other", "third")}
    assert len(distinct) == 3
    assert torch.equal(loaded["other"].cpu(), torch.arange(12.0) * 2 + 1)
    assert torch.equal(loaded["third"].cpu(), torch.arange(12.0) * 2)
    assert torch.equal(loaded["tail"].cpu(), torch.arange(4.0, 12.0) * 2)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_save_pretrained_after_training_round_trips_bit_for_bit(mode: str, name: str, tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    spec = MODELS[name]
    torch.manual_seed(0)
    model = spec.build(attention_dropout=0.0) if name == "llama" else spec.build()
    model.to("neuron").train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = {k: v.to("neuron") for k, v in make_batch(spec.kind, torch.Generator().manual_seed(1)).items()}
    for _ in range(2):
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    expected = {n: t.detach().cpu() for n, t in model.state_dict().items()}
    model.save_pretrained(tmp_path)  # safetensors, shared weights found by address
    reloaded = getattr(transformers, spec.model_class).from_pretrained(tmp_path, device_map=None).to("neuron")
    got = {n: t.detach().cpu() for n, t in reloaded.state_dict().items()}
    assert sorted(got) == sorted(expected)
    for n, value in expected.items():
        assert torch.equal(got[n], value), n
    gc.collect()


def test_a_tensor_never_written_counts_and_keeps_its_address(mode: str, no_stray_frees) -> None:
    torch.neuron.synchronize()
    base = torch.neuron.memory_allocated()
    t = torch.empty(1000, device="neuron")  # pending in the lazy modes, and never written
    address = t.data_ptr()
    assert torch.neuron.memory_allocated() - base == 4096  # 4000 bytes, in 512-byte blocks
    assert t.data_ptr() == address
    t.fill_(1.0)
    assert t.sum().item() == 1000.0 and t.data_ptr() == address


def test_results_not_computed_yet_never_run_the_device_out_of_memory() -> None:
    """Each pending result holds its block from creation; when the blocks of intermediates
    nobody holds any more fill the core, their launch runs and gives them back before a
    request fails (the chain below records 40 results of 4 MiB on a 64 MiB core)."""
    from conftest import run_python

    result = run_python("""
        import torch, neuron_lab
        import neuron_lab.adaptive_eager as ae
        neuron_lab.configure(idle_flush_bytes=1 << 40, idle_flush_ops=10**6, max_ops=256, max_bytes=1 << 40)
        x = torch.ones(1 << 20, device="neuron")
        y = x
        for _ in range(40):
            y = y * 1.5 - 0.5          # two dead intermediates of 4 MiB a step
        print(y[:2].tolist(), torch.neuron.max_memory_allocated() <= 64 * 2**20,
              ae.counters()["syncs"].get("out of memory", 0) > 0,
              torch.neuron.memory_stats()["num_ooms"])   # a wait that frees enough is no OOM
        waits = ae.counters()["syncs"].get("out of memory", 0)
        try:
            torch.empty(1 << 30, device="neuron")     # beyond the core: one OOM, counted once
        except torch.OutOfMemoryError:
            pass
        print(torch.neuron.memory_stats()["num_ooms"],
              ae.counters()["syncs"].get("out of memory", 0) - waits)  # nothing recorded: no wait
    """, env={"NEURON_LAB_CORE_MEMORY": "64MiB"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["[1.0,", "1.0]", "True", "True", "0", "1", "0"]
