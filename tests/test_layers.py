"""The layers depend one way (README, "Layers"): the device knows nothing of the runtime
above it, in C++ and in Python."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEVICE_CSRC = ROOT / "neuron_lab" / "device" / "csrc"
UPPER_PACKAGES = ("adaptive_eager", "observability", "magics", "compile", "kernels", "integrations")


def test_the_native_device_includes_and_declares_nothing_of_adaptive_eager() -> None:
    offending = []
    for path in sorted(DEVICE_CSRC.glob("*.[ch]*")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("//", 1)[0]
            if re.search(r'#include\s+".*adaptive_eager', code) or re.search(r"\blazy::|namespace\s+neuron::lazy", code):
                offending.append(f"{path.name}:{number}: {line.strip()}")
    assert not offending, "the device reaches into the runtime above it:\n" + "\n".join(offending)
    # The runtime plugs in through the one interface the device offers.
    assert "class OpInterceptor" in (DEVICE_CSRC / "interceptor.h").read_text()


def test_the_python_device_layer_imports_nothing_above_it() -> None:
    offending = []
    for path in sorted((ROOT / "neuron_lab" / "device").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                if any(name == f"neuron_lab.{p}" or name.startswith(f"neuron_lab.{p}.") for p in UPPER_PACKAGES):
                    offending.append(f"{path.name}:{node.lineno}: imports {name}")
    assert not offending, "\n".join(offending)


def test_the_device_runs_alone_without_the_recorder() -> None:
    """With no interceptor registered the device runs every op at once, on its own: a
    training step, copies, streams and events give the CPU's numbers and nothing is
    recorded; registering the recorder again brings recording back."""
    from conftest import run_python

    result = run_python("""
        import torch
        from neuron_lab.device import _C
        from neuron_lab.adaptive_eager import stats

        def step(device):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1)).to(device)
            opt = torch.optim.AdamW(model.parameters(), lr=0.1)
            x = torch.arange(32.0).reshape(4, 8).to(device) / 10
            for _ in range(3):
                opt.zero_grad()
                loss = model(x).square().mean()
                loss.backward()
                opt.step()
            side = torch.neuron.Stream() if device == "neuron" else None
            if side is not None:
                side.wait_stream(torch.neuron.current_stream())  # as on CUDA: the weights come from it
                with torch.neuron.stream(side):
                    y = model(x) * 2
                torch.neuron.current_stream().wait_stream(side)
            else:
                y = model(x) * 2
            return [p.detach().cpu() for p in model.parameters()] + [y.cpu(), loss.cpu()]

        expected = step("cpu")
        _C.adaptive.install_recorder(False)
        before = stats.counters()["ops_recorded"]
        alone = step("neuron")
        recorded_alone = stats.counters()["ops_recorded"] - before
        _C.adaptive.install_recorder(True)
        with_recorder = step("neuron")
        recorded = stats.counters()["ops_recorded"] - before
        for a, b, c in zip(expected, alone, with_recorder):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(c, a, rtol=1e-5, atol=1e-6)
        print(recorded_alone, recorded > 0)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "True"], result.stdout
