"""DTensor on a 1-D mesh of two neuron ranks, against plain tensors on the CPU.

- ``distribute_tensor`` with Shard(0), Shard(1), Replicate (uneven shards too; the data
  comes from rank 0), ``full_tensor()``;
- ``redistribute`` between Shard, Replicate and Partial (sum and avg);
- elementwise ops, softmax, reductions and matmuls (one giving a Partial result) and
  their gradients;
- random ops: ``torch.nn.init.normal_``/``uniform_``, ``rand_like`` and dropout on sharded
  and replicated DTensors, first with no opt-in (the generators in their CPU form, as a
  user's program has them), then with the device's generators put in the offset form by
  hand. Each rank's shard is checked against a draw from an explicit generator at the
  offset DTensor's RNG tracker gives that shard; the ranks must end at the same offset.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

from fsdp_tp_common import chunk, max_diff, run_cases, setup

DEVICE = setup()
RANK, WORLD = dist.get_rank(), dist.get_world_size()
MESH = init_device_mesh("neuron", (WORLD,))
SEED = 1234


def cpu_randn(*shape: int, seed: int = 5) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def case_distribute() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for shape in ((6, 4), (5, 3)):  # even and uneven shards
        base = torch.arange(shape[0] * shape[1], dtype=torch.float32).reshape(shape)
        mine = base + 100 * RANK  # distribute_tensor sends rank 0's data (src_data_rank=0)
        for placement in (Shard(0), Shard(1), Replicate()):
            d = distribute_tensor(mine.to(DEVICE), MESH, [placement])
            expected = chunk(base, WORLD, RANK, placement.dim) if isinstance(placement, Shard) else base
            out[f"{placement}{list(shape)}"] = {
                "local_shape": list(d.to_local().shape), "expected_shape": list(expected.shape),
                "local_diff": max_diff(d.to_local(), expected), "full_diff": max_diff(d.full_tensor(), base),
                "device": str(d.to_local().device)}
    return out


def case_redistribute() -> dict[str, Any]:
    base = cpu_randn(4, 6)
    out: dict[str, Any] = {}
    moves = [([Shard(0)], [Replicate()]), ([Shard(0)], [Shard(1)]), ([Shard(1)], [Shard(0)]),
             ([Replicate()], [Shard(0)]), ([Replicate()], [Shard(1)])]  # to Partial: torch-internal only
    for source, target in moves:
        moved = distribute_tensor(base.to(DEVICE), MESH, source).redistribute(MESH, target)
        expected_local = chunk(base, WORLD, RANK, target[0].dim) if target[0].is_shard() else None
        out[f"{source[0]}->{target[0]}"] = {
            "placements": str(moved.placements), "full_diff": max_diff(moved.full_tensor(), base),
            "local_diff": max_diff(moved.to_local(), expected_local) if expected_local is not None else 0.0}
    # Partial: each rank holds a contribution; the value is their sum (or mean).
    for reduce, expected in (("sum", base * 3), ("avg", base * 1.5)):
        partial = DTensor.from_local((base * (RANK + 1)).to(DEVICE), MESH, [Partial(reduce)])
        replicated = partial.redistribute(MESH, [Replicate()])
        sharded = partial.redistribute(MESH, [Shard(0)])
        out[f"Partial({reduce})"] = {
            "full_diff": max_diff(partial.full_tensor(), expected),
            "replicate_local_diff": max_diff(replicated.to_local(), expected),
            "shard_local_diff": max_diff(sharded.to_local(), chunk(expected, WORLD, RANK))}
    return out


def case_ops() -> dict[str, Any]:
    a, b, w = cpu_randn(8, 6, seed=1), cpu_randn(8, 6, seed=2), cpu_randn(6, 4, seed=3)
    da, db = (distribute_tensor(t.to(DEVICE), MESH, [Shard(0)]) for t in (a, b))
    dw = distribute_tensor(w.to(DEVICE), MESH, [Replicate()])
    columns = distribute_tensor(a.to(DEVICE), MESH, [Shard(1)])
    rows_of_w = distribute_tensor(w.to(DEVICE), MESH, [Shard(0)])
    pairs: dict[str, tuple[Callable[[], torch.Tensor], torch.Tensor]] = {
        "add_mul_exp": (lambda: (da + db) * 2 - da.exp(), (a + b) * 2 - a.exp()),
        "where": (lambda: torch.where(da > 0, da, db), torch.where(a > 0, a, b)),
        "gelu": (lambda: F.gelu(da), F.gelu(a)),
        "softmax": (lambda: da.softmax(dim=1), a.softmax(dim=1)),
        "sum": (lambda: da.sum(), a.sum()),
        "mean_dim0": (lambda: da.mean(dim=0), a.mean(dim=0)),
        "amax_dim1": (lambda: da.amax(dim=1), a.amax(dim=1)),
        "matmul_shard_replicate": (lambda: da @ dw, a @ w),
        "matmul_partial": (lambda: columns @ rows_of_w, a @ w),
    }
    out: dict[str, Any] = {}
    for name, (compute, expected) in pairs.items():
        result = compute()
        out[name] = {"diff": max_diff(result, expected), "placements": str(result.placements)}
    # Gradients through a DTensor expression.
    x = distribute_tensor(a.to(DEVICE), MESH, [Shard(0)]).requires_grad_()
    v = distribute_tensor(w.to(DEVICE), MESH, [Replicate()]).requires_grad_()
    (x @ v).tanh().sum().full_tensor().backward()
    ref_x, ref_v = a.clone().requires_grad_(), w.clone().requires_grad_()
    (ref_x @ ref_v).tanh().sum().backward()
    out["backward"] = {"diff": max(max_diff(x.grad, ref_x.grad), max_diff(v.grad, ref_v.grad)),
                       "placements": f"{x.grad.placements} {v.grad.placements}"}
    return out


# ---- random ops ----------------------------------------------------------------------------
def offset_of_state() -> list[int]:
    """This core's default generator state as [seed, offset]."""
    return torch.neuron.get_rng_state().view(torch.int64).tolist()


def draw_at(offset: int, shape: torch.Size, fill: Callable[[torch.Tensor, torch.Generator], torch.Tensor],
            dtype: torch.dtype = torch.float32, seed: int = SEED) -> torch.Tensor:
    """What a neuron generator in the offset form at (seed, offset) draws into a tensor of ``shape``."""
    g = torch.Generator(DEVICE)
    g.set_state(torch.neuron.offset_rng_state(seed, offset))
    return fill(torch.empty(shape, device=DEVICE, dtype=dtype), g)


def shard_offset(local_numel: int, shard_index: int) -> int:
    return (shard_index * local_numel + 3) // 4 * 4


def case_random() -> dict[str, Any]:
    torch.neuron.set_rng_state(torch.neuron.offset_rng_state(SEED))
    out: dict[str, Any] = {"start_state": offset_of_state()}
    numel = 8 * 6

    sharded = distribute_tensor(torch.zeros(8, 6, device=DEVICE), MESH, [Shard(0)])
    torch.nn.init.normal_(sharded)
    local = sharded.to_local()
    expected = draw_at(shard_offset(local.numel(), RANK), local.shape, lambda t, g: t.normal_(generator=g))
    full = sharded.full_tensor().cpu()
    halves = full.chunk(WORLD)
    out["normal_shard0"] = {"local_diff": max_diff(local, expected), "state_after": offset_of_state(),
                            "shards_differ": bool(not torch.equal(halves[0], halves[1])),
                            "full": full.flatten().tolist()}

    replicated = distribute_tensor(torch.zeros(8, 6, device=DEVICE), MESH, [Replicate()])
    torch.nn.init.normal_(replicated)
    expected = draw_at(numel, replicated.shape, lambda t, g: t.normal_(generator=g))
    out["normal_replicate"] = {"local_diff": max_diff(replicated.to_local(), expected),
                               "local": replicated.to_local().cpu().flatten().tolist(),
                               "state_after": offset_of_state()}

    columns = distribute_tensor(torch.zeros(4, 10, device=DEVICE), MESH, [Shard(1)])
    torch.nn.init.uniform_(columns, -1.0, 1.0)
    local = columns.to_local()
    expected = draw_at(2 * numel + shard_offset(local.numel(), RANK), local.shape,
                       lambda t, g: t.uniform_(-1.0, 1.0, generator=g))
    out["uniform_shard1"] = {"local_diff": max_diff(local, expected), "state_after": offset_of_state(),
                             "full": columns.full_tensor().cpu().flatten().tolist()}
    after_uniform = 2 * numel + 40

    ones = distribute_tensor(torch.ones(8, 6, device=DEVICE), MESH, [Shard(0)])
    dropped = F.dropout(ones, p=0.5, training=True)
    mask = draw_at(after_uniform + shard_offset(24, RANK), torch.Size([4, 6]),
                   lambda t, g: t.bernoulli_(0.5, generator=g), dtype=torch.bool)
    out["dropout_shard0"] = {"local_diff": max_diff(dropped.to_local(), mask.float() * 2.0),
                             "kept": int(mask.sum()), "state_after": offset_of_state(),
                             "placements": str(dropped.placements)}

    same = F.dropout(distribute_tensor(torch.ones(8, 6, device=DEVICE), MESH, [Replicate()]), p=0.5)
    out["dropout_replicate"] = {"local": same.to_local().cpu().flatten().tolist(), "state_after": offset_of_state()}

    # The same seed and offset again: the same sharded tensor.
    torch.neuron.set_rng_state(torch.neuron.offset_rng_state(SEED))
    again = distribute_tensor(torch.zeros(8, 6, device=DEVICE), MESH, [Shard(0)])
    torch.nn.init.normal_(again)
    out["repeat_diff"] = max_diff(again.full_tensor(), torch.tensor(out["normal_shard0"]["full"]).view(8, 6))

    # An explicit generator in the offset form: it advances, the default one does not.
    before = offset_of_state()
    g = torch.Generator(DEVICE)
    g.set_state(torch.neuron.offset_rng_state(SEED + 1))
    explicit = distribute_tensor(torch.zeros(8, 6, device=DEVICE), MESH, [Shard(0)])
    torch.nn.init.normal_(explicit, generator=g)
    g_after = g.get_state().view(torch.int64).tolist()
    out["explicit_generator"] = {"generator_after": g_after, "default_before": before,
                                 "default_after": offset_of_state()}
    return out


def case_random_with_no_opt_in() -> dict[str, Any]:
    """What a user's program does: seed, then random ops on DTensors, with the default
    generator in its CPU form (the first DTensor random op of the process, so the RNG
    tracker starts here). Outside DTensor the generator keeps the CPU form (the CPU's
    numbers, its state restores exactly); DTensor's tracker puts it into the offset form
    at (seed, 0), so each shard draws what a generator at that shard's offset draws, as
    with the opt-in. A user-passed generator in the CPU form likewise."""
    torch.manual_seed(SEED)
    saved = torch.neuron.get_rng_state()
    plain = torch.randn(5, device=DEVICE).cpu()
    torch.neuron.set_rng_state(saved)
    out: dict[str, Any] = {"outside": {
        "state_bytes": saved.numel(), "cpu_numbers": torch.equal(plain, torch.randn(5, generator=torch.Generator()
                                                                                    .manual_seed(SEED))),
        "restores": torch.equal(torch.randn(5, device=DEVICE).cpu(), plain)}}
    torch.neuron.set_rng_state(saved)

    sharded = distribute_tensor(torch.zeros(8, 6, device=DEVICE), MESH, [Shard(0)])
    torch.nn.init.normal_(sharded)
    local = sharded.to_local()
    halves = sharded.full_tensor().cpu().chunk(WORLD)
    out["normal_shard0"] = {
        "local_diff": max_diff(local, draw_at(shard_offset(24, RANK), local.shape, lambda t, g: t.normal_(generator=g))),
        "shards_differ": bool(not torch.equal(halves[0], halves[1])), "state_after": offset_of_state()}

    replicated = distribute_tensor(torch.zeros(8, 6, device=DEVICE), MESH, [Replicate()])
    torch.nn.init.uniform_(replicated)
    out["uniform_replicate"] = {
        "local_diff": max_diff(replicated.to_local(), draw_at(48, replicated.shape, lambda t, g: t.uniform_(generator=g))),
        "local": replicated.to_local().cpu().flatten().tolist(), "state_after": offset_of_state()}

    like = torch.rand_like(distribute_tensor(torch.zeros(8, 6, device=DEVICE), MESH, [Shard(0)]))
    out["rand_like_shard0"] = {
        "local_diff": max_diff(like.to_local(), draw_at(96 + shard_offset(24, RANK), torch.Size([4, 6]),
                                                        lambda t, g: t.uniform_(generator=g))),
        "state_after": offset_of_state()}

    dropped = F.dropout(distribute_tensor(torch.ones(8, 6, device=DEVICE), MESH, [Replicate()]), p=0.5)
    out["dropout_replicate"] = {"local": dropped.to_local().cpu().flatten().tolist(), "state_after": offset_of_state()}

    g = torch.Generator(DEVICE).manual_seed(SEED + 1)  # a user's generator, in the CPU form
    g_bytes = g.get_state().numel()
    explicit = distribute_tensor(torch.zeros(8, 6, device=DEVICE), MESH, [Shard(0)])
    torch.nn.init.normal_(explicit, generator=g)
    out["explicit_generator"] = {
        "bytes_before": g_bytes, "generator_after": g.get_state().view(torch.int64).tolist(),
        "local_diff": max_diff(explicit.to_local(), draw_at(shard_offset(24, RANK), torch.Size([4, 6]),
                                                            lambda t, g: t.normal_(generator=g), seed=SEED + 1)),
        "default_after": offset_of_state()}
    return out


if __name__ == "__main__":
    run_cases({"distribute": case_distribute, "redistribute": case_redistribute, "ops": case_ops,
               "random_no_opt_in": case_random_with_no_opt_in, "random": case_random})
