"""The modelled NeuronCore time (neuron_lab.observability.cost_model): FLOPs and bytes of
known ops, the roofline, the launch overhead, the core description and its sources, and the
modelled columns of the table, the exports and explain()."""

from __future__ import annotations

import math
import re

import pytest
import torch

import neuron_lab
from neuron_lab.observability import cost_model
from neuron_lab.observability.cost_model import TRAINIUM2, CoreSpec

pytestmark = pytest.mark.usefixtures("adaptive")

# Round figures, so that every expected time below is plain arithmetic.
SPEC = CoreSpec(name="test core", tensor_tflops={torch.float32: 10.0, torch.bfloat16: 40.0}, vector_tflops=1.0,
                memory_gb_per_s=100.0, launch_overhead_us=7.0)


@pytest.fixture
def adaptive():
    with neuron_lab.mode("adaptive"):
        yield
    torch.neuron.synchronize()


@pytest.fixture
def spec():
    previous = cost_model.set_core(SPEC)
    yield SPEC
    cost_model.set_core(previous)


def tensor(*shape, dtype=torch.float32):
    return ("tensor", dtype, shape)


def the_op(prof, name):
    """(the launch, the op, its modelled cost) of the only recorded op called ``name``."""
    found = [(l, i, o) for l in prof.launches for i, o in enumerate(l.ops) if o.name == name]
    assert len(found) == 1, [o.name for l in prof.launches for o in l.ops]
    launch, index, op = found[0]
    return launch, op, prof.costs()[launch.id][1][index]


def test_a_matmul_is_2mnk_flops_on_the_tensor_engine(spec):
    m, k, n = 48, 40, 24
    a, b = torch.randn(m, k, device="neuron"), torch.randn(k, n, device="neuron")
    torch.neuron.synchronize()
    with neuron_lab.profiler.profile() as prof:
        c = a @ b
        c.sum().item()
    _, op, cost = the_op(prof, "aten::mm")
    assert cost.flops == 2 * m * n * k
    assert cost.bytes == 4 * (m * k + k * n + m * n)  # both inputs read, the result written
    assert cost.engine == "tensor"
    roofline_ns = max(2 * m * n * k / 10e12, 4 * (m * k + k * n + m * n) / 100e9) * 1e9
    assert cost.modelled_ns == pytest.approx(roofline_ns)
    assert cost.utilisation == pytest.approx(2 * m * n * k / (10e12 * roofline_ns * 1e-9))


def test_flop_rules_are_torchs_and_follow_the_dtype():
    bf16 = cost_model.op_cost("aten::bmm", "", [tensor(3, 8, 16, dtype=torch.bfloat16),
                                                 tensor(3, 16, 4, dtype=torch.bfloat16)],
                              [tensor(3, 8, 4, dtype=torch.bfloat16)], SPEC)
    assert bf16.flops == 2 * 3 * 8 * 16 * 4 and bf16.peak_flops == 40e12
    addmm = cost_model.op_cost("aten::addmm", "", [tensor(4), tensor(8, 16), tensor(16, 4), 1, 1],
                               [tensor(8, 4)], SPEC)
    assert addmm.flops == 2 * 8 * 16 * 4 and addmm.engine == "tensor"  # keyword-only beta, alpha by name
    conv = cost_model.op_cost("aten::convolution", "", [tensor(2, 3, 10, 10), tensor(5, 3, 3, 3), None, [1, 1],
                                                        [0, 0], [1, 1], False, [0, 0], 1], [tensor(2, 5, 8, 8)], SPEC)
    assert conv.flops == 2 * (2 * 5 * 8 * 8) * (3 * 3 * 3)
    pointwise = cost_model.op_cost("aten::add", "Tensor", [tensor(1000), tensor(1000), 1], [tensor(1000)], SPEC)
    assert (pointwise.flops, pointwise.engine, pointwise.bytes) == (1000, "vector", 3 * 4000)


def test_a_copy_moves_its_bytes_twice_and_computes_nothing(spec):
    src = torch.randn(300, 70, device="neuron")
    dst = torch.empty(300, 70, device="neuron")
    torch.neuron.synchronize()
    with neuron_lab.profiler.profile() as prof:
        dst.copy_(src)
        dst.sum().item()
    _, _, cost = the_op(prof, "aten::copy_")
    assert cost.bytes == 2 * 300 * 70 * 4  # read the source, write the destination
    assert cost.flops == 0 and cost.engine == "memory"
    assert cost.modelled_ns == pytest.approx(2 * 300 * 70 * 4 / 100e9 * 1e9)


def test_launch_overhead_times_the_launch_count(spec):
    x = torch.randn(64, device="neuron")
    torch.neuron.synchronize()
    with neuron_lab.mode("eager"), neuron_lab.profiler.profile() as prof:
        for _ in range(9):
            x = x * 1.5
        torch.neuron.synchronize()
    launches = [l for l in prof.launches if l.kind in ("op", "graph", "inline")]
    assert len([l for l in launches if l.ops and l.ops[0].name == "aten::mul"]) == 9
    costs = prof.costs()
    op_ns = sum(sum(c.modelled_ns for c in costs[l.id][1]) for l in launches)
    assert prof.modelled_device_s * 1e9 == pytest.approx(len(launches) * 7_000 + op_ns)
    for l in launches:
        assert costs[l.id][0].modelled_ns == pytest.approx(7_000 + sum(c.modelled_ns for c in costs[l.id][1]))


def test_the_default_core_is_trainium2_with_a_source_for_every_figure():
    assert cost_model.core() is TRAINIUM2
    assert TRAINIUM2.tensor_tflops[torch.bfloat16] == 79.0 and TRAINIUM2.tensor_tflops[torch.float8_e4m3fn] == 158.0
    assert TRAINIUM2.memory_gb_per_s == pytest.approx(2900 / 8)
    for figure in ("tensor_tflops", "vector_tflops", "memory_gb_per_s", "launch_overhead_us"):
        assert TRAINIUM2.sources[figure], figure
    assert all(re.search(r"https://awsdocs-neuron\S+", TRAINIUM2.sources[f])
               for f in ("tensor_tflops", "vector_tflops", "memory_gb_per_s"))
    assert "assumption" in TRAINIUM2.sources["launch_overhead_us"]  # no published figure: said so


@pytest.mark.parametrize("changes, message", [
    ({"memory_gb_per_s": 0}, "memory_gb_per_s must be a positive number"),
    ({"vector_tflops": -1.0}, "vector_tflops must be a positive number"),
    ({"launch_overhead_us": -2}, "launch_overhead_us must be >= 0"),
    ({"tensor_tflops": {"bf16": 1.0}}, "maps torch dtypes to positive TFLOPS"),
])
def test_a_bad_core_description_says_what_is_wrong(changes, message):
    with pytest.raises(ValueError, match=message):
        TRAINIUM2.replace(**changes)
    with pytest.raises(TypeError, match="takes a CoreSpec"):
        cost_model.set_core({"name": "x"})


def test_table_exports_and_explain_show_emulated_and_modelled_side_by_side(spec, tmp_path):
    a = torch.randn(64, 64, device="neuron")
    torch.neuron.synchronize()
    with neuron_lab.profiler.profile() as prof:
        for _ in range(3):
            (a @ a).relu().sum().item()
    table = prof.table(sort_by="modelled_time", top=0)
    text = str(table)
    assert "emulated" in text and "modelled" in text and "test core" in text
    mm = next(r for r in table.op_rows if r.name == "aten::mm")
    assert mm.modelled_ns == pytest.approx(3 * max(2 * 64 ** 3 / 10e12, 3 * 64 * 64 * 4 / 100e9) * 1e9)
    assert [r.modelled_ns for r in table.op_rows] == sorted((r.modelled_ns for r in table.op_rows), reverse=True)
    rows = prof.op_table()
    mm_rows = [r for r in rows if r["op"] == "aten::mm"]
    assert len(mm_rows) == 3 and all(r["flops"] == 2 * 64 ** 3 and r["modelled_us"] > 0 for r in mm_rows)
    explained = prof.explain()
    assert explained.modelled_device_s == pytest.approx(prof.modelled_device_s)
    assert "emulated" in explained.summary_line() and "modelled" in explained.summary_line()
    assert "test core" in str(explained)
    assert math.isfinite(prof.modelled_device_s) and prof.modelled_device_s > 0
