"""The layers depend one way (README, "Layers"): the device knows nothing of the runtime
above it, in C++ and in Python."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEVICE_CSRC = ROOT / "neuron_lab" / "device" / "csrc"
# What lies above the device: the runtime, the workbench and their top-level shims.
UPPER_PACKAGES = ("adaptive_eager", "observability", "magics", "compile", "kernels", "integrations", "distributed", "launch",
                  "metrics",
                  "profiler")


def test_the_native_device_includes_and_declares_nothing_of_adaptive_eager() -> None:
    offending = []
    for path in sorted(DEVICE_CSRC.rglob("*.[ch]*")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("//", 1)[0]
            if re.search(r'#include\s+".*adaptive_eager', code) or re.search(r"\blazy::|namespace\s+neuron::lazy", code):
                offending.append(f"{path.relative_to(DEVICE_CSRC)}:{number}: {line.strip()}")
    assert not offending, "the device reaches into the runtime above it:\n" + "\n".join(offending)
    # The runtime plugs in through the one interface the device offers.
    assert "class OpInterceptor" in (DEVICE_CSRC / "runtime" / "interceptor.h").read_text()


# The device's native code lives in rooms, one per layer (runtime/runtime.h's layout note),
# and each room may include the headers of the rooms listed here only: the runtime (device,
# streams, memory, generators, hooks, the interceptor) and the tracing it writes to are the
# base; the ATen glue (kernels, the fallback, what the device registers) builds on them; the
# Python bindings sit on top.
ROOM_INCLUDES = {
    "runtime": {"runtime", "tracing"},
    "tracing": {"tracing", "runtime"},
    "aten": {"aten", "runtime", "tracing"},
    "python": {"python", "aten", "runtime", "tracing"},
}


def _included_rooms(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, header, room) of each of the file's project includes: a bare name is in the
    file's own room, ``device/csrc/<room>/x.h`` in that room; anything else has room None."""
    found = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        match = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
        if match is None:
            continue
        header = match.group(1)
        parts = header.split("/")
        if len(parts) == 1:
            found.append((number, header, path.parent.name if (path.parent / header).exists() else None))
        elif len(parts) == 4 and parts[:2] == ["device", "csrc"] and (DEVICE_CSRC / parts[2] / parts[3]).exists():
            found.append((number, header, parts[2]))
        else:
            found.append((number, header, None))
    return found


def test_each_device_room_includes_only_the_rooms_below_it() -> None:
    """Every file of the device's csrc lives in a room, and includes only its own room's
    headers and those of the rooms it builds on (ROOM_INCLUDES): the runtime includes
    nothing of the ATen glue or the bindings, the ATen glue nothing of the bindings."""
    stray = [p.name for p in DEVICE_CSRC.iterdir() if p.is_file() or p.name not in ROOM_INCLUDES]
    assert not stray, f"files or folders outside the rooms {sorted(ROOM_INCLUDES)}: {stray}"
    offending = []
    for room, allowed in ROOM_INCLUDES.items():
        for path in sorted((DEVICE_CSRC / room).rglob("*.[ch]*")):
            for number, header, included in _included_rooms(path):
                if included not in allowed:
                    offending.append(f"{room}/{path.name}:{number}: includes {header!r}"
                                     f" ({'not a header of the rooms' if included is None else included})")
    assert not offending, "a room includes what lies above it:\n" + "\n".join(offending)


def test_the_room_check_sees_an_include_from_above(tmp_path: Path) -> None:
    """The check resolves both spellings of an include to the room it names."""
    source = tmp_path / "runtime" / "x.cpp"
    source.parent.mkdir()
    source.write_text('#include "device/csrc/python/python_submodules.h"\n#include "runtime.h"\n'
                      '#include "device/csrc/aten/dense_layout.h"\n')
    (tmp_path / "runtime" / "runtime.h").write_text("")
    rooms = [room for _, _, room in _included_rooms(source)]
    assert rooms == ["python", "runtime", "aten"]


def _imported_modules(source: str, package: list[str]) -> list[tuple[int, str]]:
    """(line, module) of every import in the source of a module of ``package`` (its dotted
    parts): ``import a.b`` gives ``a.b``; ``from a import b`` gives ``a`` and ``a.b`` (``b``
    may be a module); relative imports are resolved against ``package``; and
    ``importlib.import_module("a.b")`` / ``__import__("a.b")`` with a literal name count too."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            if module:
                found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{a.name}" if module else a.name) for a in node.names]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id in ("__import__", "import_module")))):
            found.append((node.lineno, node.args[0].value))
    return found


def _imports_of(path: Path) -> list[tuple[int, str]]:
    """``_imported_modules`` of a file of the repository (its package is its folder)."""
    return _imported_modules(path.read_text(), list(path.relative_to(ROOT).parts[:-1]))


def _is_in(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def test_the_python_device_layer_imports_nothing_above_it() -> None:
    offending = []
    for path in sorted((ROOT / "neuron_lab" / "device").rglob("*.py")):
        for line, name in _imports_of(path):
            if any(_is_in(name, f"neuron_lab.{p}") for p in UPPER_PACKAGES):
                offending.append(f"{path.relative_to(ROOT)}:{line}: imports {name}")
    assert not offending, "\n".join(offending)


# The modules above the device that may use the extension, and the submodule each owns: the
# runtime's C++ half (_C.adaptive) and the fast host kernels (_C.fast_path) are compiled
# into it.
NATIVE_OWNERS = {"neuron_lab/adaptive_eager/_native.py": "adaptive", "neuron_lab/fastpath/_native.py": "fast_path"}


def test_only_the_device_layer_imports_its_extension() -> None:
    """The layers above the device use its public Python modules (``device.trace``,
    ``device.host_kernels``, ``device.streams``, ``torch.neuron``) and the runtime's
    package API, never ``neuron_lab.device._C``; adaptive eager reaches its own native
    half through ``adaptive_eager/_native.py`` alone, the fast path through ``fastpath/_native.py``."""
    package = ROOT / "neuron_lab"
    offending = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if _is_in(relative.removesuffix(".py").replace("/", "."), "neuron_lab.device") or relative in NATIVE_OWNERS:
            continue
        for line, name in _imports_of(path):
            if _is_in(name, "neuron_lab.device._C"):
                offending.append(f"{relative}:{line}: imports {name}")
    assert not offending, "use the device's public Python API instead:\n" + "\n".join(offending)
    for owner, submodule in NATIVE_OWNERS.items():  # its own half of the extension, nothing of the device's
        assert (ROOT / owner).exists(), f"{owner} moved: update NATIVE_OWNERS"
        beyond = [name for _, name in _imports_of(ROOT / owner) if _is_in(name, "neuron_lab.device._C")
                  and name not in ("neuron_lab.device._C", f"neuron_lab.device._C.{submodule}")]
        assert not beyond, f"{owner} imports more than _C.{submodule}: {beyond}"


def test_the_distributed_backend_knows_only_the_device() -> None:
    """The c10d backend is a layer over the device's host-kernel interface: it knows
    nothing of the runtime (flushes reach it through the device's interceptor) nor of the
    workbench that shows its records or runs cells on ranks (``neuron_lab.launch``)."""
    offending = []
    for path in sorted((ROOT / "neuron_lab" / "distributed").rglob("*.py")):
        for line, name in _imports_of(path):
            if _is_in(name, "neuron_lab") and not (_is_in(name, "neuron_lab.device")
                                                   or _is_in(name, "neuron_lab.distributed")):
                offending.append(f"{path.relative_to(ROOT)}:{line}: imports {name}")
    assert not offending, "\n".join(offending)


def test_the_cell_runner_never_imports_the_magics() -> None:
    """``%%neuron_distributed`` wraps ``neuron_lab.launch.run_on_ranks``, not the reverse."""
    offending = [f"{path.name}:{line}: imports {module}"
                 for path in sorted((ROOT / "neuron_lab" / "launch").glob("*.py"))
                 for line, module in _imports_of(path)
                 if _is_in(module, "neuron_lab.magics") or _is_in(module, "IPython")]
    assert not offending, "\n".join(offending)


def test_the_import_check_sees_every_way_of_importing_the_extension() -> None:
    source = ("import neuron_lab.device._C\nfrom neuron_lab.device import _C\nfrom ..device import _C\n"
              "from ..device._C import trace\nimport importlib\nimportlib.import_module('neuron_lab.device._C')\n"
              "from neuron_lab.device import trace, streams\nfrom . import records\n")
    names = [name for _, name in _imported_modules(source, ["neuron_lab", "observability"])]
    assert [n for n in names if _is_in(n, "neuron_lab.device._C")] == [
        "neuron_lab.device._C", "neuron_lab.device._C", "neuron_lab.device._C", "neuron_lab.device._C",
        "neuron_lab.device._C.trace", "neuron_lab.device._C"]
    assert "neuron_lab.observability.records" in names and "neuron_lab.device.streams" in names


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


def test_one_file_lists_everything_the_device_registers() -> None:
    """Every TORCH_LIBRARY / TORCH_LIBRARY_IMPL block of the extension is in
    aten/registrations.cpp, and it calls every registration function the ATen glue's files
    offer (aten/registrations.h): what the device does for an op is read in one file."""
    registrations = DEVICE_CSRC / "aten" / "registrations.cpp"
    elsewhere = []
    for path in sorted((ROOT / "neuron_lab").rglob("*.[ch]*")):
        if path.suffix not in (".cpp", ".h") or path == registrations:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.match(r"\s*TORCH_LIBRARY(_IMPL|_FRAGMENT)?\s*\(", line):
                elsewhere.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not elsewhere, "register in aten/registrations.cpp instead:\n" + "\n".join(elsewhere)
    offered = re.findall(r"void (register_\w+)\(torch::Library& m\);", (DEVICE_CSRC / "aten" / "registrations.h").read_text())
    text = registrations.read_text()
    assert offered and not [name for name in offered if f"{name}(m)" not in text], offered


def test_no_op_is_registered_twice() -> None:
    """registrations.cpp's lists never name an op twice: a second registration for the same
    op and key would silently override the first (the dispatcher only warns)."""
    from conftest import run_python

    result = run_python("import torch, neuron_lab; print(torch.ones(2, device='neuron').add(1).sum().item())")
    assert result.returncode == 0, result.stderr
    assert "Overriding a previously registered kernel" not in result.stderr, result.stderr
