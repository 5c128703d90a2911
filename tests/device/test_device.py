"""Registration, device selection and the torch.neuron / torch.accelerator device APIs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from conftest import run_python

TORCH_NEURON_API = """
is_available is_initialized device_count current_device set_device device get_device_name
get_device_properties synchronize manual_seed manual_seed_all seed initial_seed get_rng_state
set_rng_state Stream Event stream current_stream default_stream set_stream memory_allocated
max_memory_allocated memory_reserved max_memory_reserved reset_peak_memory_stats memory_stats
memory_summary mem_get_info empty_cache is_bf16_supported
""".split()


def test_torch_neuron_has_the_cuda_like_api() -> None:
    missing = [name for name in TORCH_NEURON_API if not hasattr(torch.neuron, name)]
    assert missing == []
    assert set(torch.neuron.__all__) >= set(TORCH_NEURON_API)


def test_device_strings_and_tensor_methods() -> None:
    assert torch.device("neuron:1").type == "neuron"
    x = torch.ones(2, device="neuron:1")
    assert x.device == torch.device("neuron", 1)
    assert x.is_neuron and not torch.ones(1).is_neuron
    y = torch.ones(2).neuron()
    assert y.device == torch.device("neuron", 0)
    assert torch.ones(2).neuron(1).device.index == 1
    m = torch.nn.Linear(2, 2).neuron()
    assert all(p.device.type == "neuron" for p in m.parameters())


def test_default_configuration() -> None:
    assert torch.neuron.is_available()
    assert torch.neuron.is_initialized()
    assert torch.neuron.device_count() == 2
    props = torch.neuron.get_device_properties(1)
    assert props.index == 1 and props.total_memory == 16 * 2**30
    assert "NeuronCore" in torch.neuron.get_device_name()
    assert torch.neuron.is_bf16_supported()


def test_current_device_and_context_manager() -> None:
    assert torch.neuron.current_device() == 0
    with torch.neuron.device(1):
        assert torch.neuron.current_device() == 1
        assert torch.empty(1, device="neuron").device.index == 1
    assert torch.neuron.current_device() == 0
    torch.neuron.set_device("neuron:1")
    try:
        assert torch.zeros(1, device="neuron").device.index == 1
    finally:
        torch.neuron.set_device(0)
    with torch.neuron.device_of(torch.ones(1, device="neuron:1")):
        assert torch.neuron.current_device() == 1


def test_bad_device_index_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="neuron:5 does not exist.*2 NeuronCore"):
        torch.neuron.set_device(5)
    with pytest.raises((RuntimeError, IndexError), match="neuron:7 does not exist"):
        torch.ones(1, device="neuron:7")
    with pytest.raises(ValueError, match="expected a neuron device"):
        torch.neuron.get_device_properties("cpu")
    assert torch.ones(1, device="neuron").item() == 1.0  # still usable


def test_torch_accelerator_runs_unchanged() -> None:
    acc = torch.accelerator
    assert acc.is_available()
    assert acc.current_accelerator() == torch.device("neuron")
    assert acc.device_count() == 2
    acc.set_device_index(1)
    try:
        assert acc.current_device_index() == 1
    finally:
        acc.set_device_index(0)
    with acc.device_index(1):
        assert torch.empty(1, device="neuron").device.index == 1
    stream = torch.Stream(device="neuron")
    acc.set_stream(stream)
    try:
        assert acc.current_stream() == stream
    finally:
        acc.set_stream(torch.neuron.default_stream())
    acc.synchronize()
    x = torch.empty(1024, device="neuron")
    assert acc.memory.memory_allocated() >= 4096
    del x


def test_accelerator_device_agnostic_training_loop() -> None:
    device = torch.accelerator.current_accelerator()
    model = torch.nn.Linear(4, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        loss = model(torch.randn(8, 4, device=device)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.accelerator.synchronize()
    assert loss.device.type == "neuron"


def test_import_torch_alone_autoloads_the_device() -> None:
    result = run_python(
        """
        import torch
        x = torch.randn(2, device="neuron")
        print(x.device, "neuron_lab" in __import__("sys").modules)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["neuron:0", "True"]


@pytest.mark.parametrize("first", ["import torch", "import neuron_lab", "import neuron_lab.device",
                                   "from neuron_lab.device import autograd_threads"])
def test_any_first_import_loads_the_device_cleanly(first: str) -> None:
    result = run_python(
        f"""
        {first}
        import torch
        from neuron_lab.device import is_backward_on_calling_thread
        print(torch.randn(2, device="neuron").device, is_backward_on_calling_thread())
        """
    )
    assert result.returncode == 0, result.stderr
    assert "not loaded" not in result.stderr and "Warning" not in result.stderr, result.stderr
    assert result.stdout.split() == ["neuron:0", "True"]


_STATE_OF_THE_PROCESS = """
    import os, sys, threading
    import torch
    import torch.fx._symbolic_trace as fx_trace
    def state():
        patched = getattr(fx_trace.is_fx_symbolic_tracing, "_neuron_lab", False) or \\
            getattr(fx_trace._Patcher.patch, "_neuron_lab", False)
        return [len(os.listdir("/proc/self/task")), sorted(t.name for t in threading.enumerate()),
                torch._C._is_multithreading_enabled(), patched, "torch._dynamo" in sys.modules]
"""


def test_import_torch_starts_no_thread_and_changes_nothing() -> None:
    """With neuron_lab installed, ``import torch`` registers the device and nothing else:
    no thread, no patched torch function, autograd's threading as PyTorch sets it; the
    same process without the device looks the same."""
    code = _STATE_OF_THE_PROCESS + "\n    print(state(), getattr(torch._tensor_str._str, '_releases_guards_on_error', False))"
    with_device = run_python(code)
    without = run_python(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert with_device.returncode == 0 and without.returncode == 0, with_device.stderr + without.stderr
    assert with_device.stdout == without.stdout, (with_device.stdout, without.stdout)
    assert "neuron-compiler" not in with_device.stdout


def test_the_device_starts_at_first_use_and_the_compiler_when_something_may_compile() -> None:
    result = run_python(_STATE_OF_THE_PROCESS + """
    import neuron_lab
    before = state()
    (torch.ones(2, device="neuron") + 1).cpu()
    used = state()
    neuron_lab.configure(compile=True)
    compiling = state()
    print(before[0] < used[0], used[1], used[2], used[3], compiling[1], compiling[3])
    """)
    assert result.returncode == 0, result.stderr
    # a device thread, backward on the calling thread (autograd's threads off), no compiler yet;
    # then the compiler thread, and FX never patched (the compile worker process traces)
    assert result.stdout.split(maxsplit=1)[0] == "True"
    assert "['MainThread'] False False ['MainThread', 'neuron-compiler'] False" in result.stdout, result.stdout


def test_the_first_tensor_starts_the_current_cores_device_thread_before_any_launch() -> None:
    """The device's first use (a tensor made on it, nothing launched yet) starts the current
    core's device thread, which sets itself up while the host goes on; no other core's."""
    result = run_python(_STATE_OF_THE_PROCESS + """
    import neuron_lab
    from neuron_lab import adaptive_eager as ae
    before = state()[0]
    x = torch.empty(3, device="neuron")
    print(state()[0] - before, ae.counters()["launches"])
    y = torch.empty(3, device="neuron:1")
    print(state()[0] - before, ae.counters()["launches"])
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "0", "1", "0"], result.stdout


_FIRST_VECTOR_MATH = """
import torch
torch.manual_seed(2)
x = torch.randn(512, 1024)
y = torch.tanh(x)  # the process's first parallel MKL VML call: the two OpenMP threads at once
torch.set_num_threads(1)
print(torch.equal(y, torch.tanh(x)))
"""


def test_the_first_vector_math_of_a_process_has_full_accuracy_on_every_thread() -> None:
    """MKL's VML, at its first call in a process, gives the second OpenMP thread's half
    low-accuracy results in ~1 of 4 fresh processes unless one thread set it up first
    (registration._initialize_vector_math). 16 fresh processes, one at a time (two at once
    on two cores hide the race): without the set-up, 1 in 4 processes was off when
    measured, and all 16 pass about 1% of the time."""
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    outputs = []
    for _ in range(16):
        result = subprocess.run([sys.executable, "-c", _FIRST_VECTOR_MATH], capture_output=True, text=True,
                                env=env, timeout=120)
        assert result.returncode == 0, result.stderr
        outputs.append(result.stdout.strip())
    off = outputs.count("False")
    assert off == 0, f"{off} of 16 fresh processes computed their first tanh off the single-threaded result"


def test_autoload_can_be_turned_off() -> None:
    result = run_python(
        "import torch; print(torch._C._get_privateuse1_backend_name())",
        env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "privateuseone"


def test_cores_and_memory_come_from_the_environment() -> None:
    result = run_python(
        """
        import torch
        print(torch.neuron.device_count(), torch.neuron.get_device_properties(3).total_memory)
        """,
        env={"NEURON_LAB_NUM_CORES": "4", "NEURON_LAB_CORE_MEMORY": "64MiB"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["4", str(64 * 2**20)]


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("NEURON_LAB_NUM_CORES", "two", "not a whole number"),
        ("NEURON_LAB_NUM_CORES", "0", "between 1 and 64"),
        ("NEURON_LAB_CORE_MEMORY", "lots", "not a memory size"),
    ],
)
def test_bad_configuration_names_the_variable(variable: str, value: str, message: str) -> None:
    result = run_python("import neuron_lab", env={variable: value, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert result.returncode != 0
    assert variable in result.stderr and message in result.stderr


def test_parse_size() -> None:
    from neuron_lab.device.config import MAX_CORE_MEMORY, parse_size

    assert parse_size("16GiB") == 16 * 2**30
    assert parse_size("512 MiB") == 512 * 2**20
    assert parse_size("2GB") == 2 * 10**9
    assert parse_size("1048576") == 2**20
    # Exactly, never through a float (2**53 + 1 is not a float).
    assert parse_size(str(2**53 + 1)) == 2**53 + 1
    assert parse_size("1.5KiB") == 1536
    assert parse_size("0.000000001GB") == 1
    assert parse_size(str(MAX_CORE_MEMORY)) == MAX_CORE_MEMORY
    for bad, message in [("-1GiB", "not a memory size"), ("0", "positive"), ("0.5", "whole number of bytes"),
                         (str(MAX_CORE_MEMORY + 1), "largest supported"), ("1e30", "not a memory size"),
                         ("9223372036854775807", "largest supported"), ("inf", "not a memory size"),
                         ("\uff11\uff12", "not a memory size"), ("", "not a memory size")]:
        with pytest.raises(ValueError, match=message):
            parse_size(bad)


# Values that once broke `import torch` itself (an int64 overflow in the extension's
# configure) or that a parser could take the wrong way.
_HOSTILE_CONFIGURATIONS = [
    ("NEURON_LAB_CORE_MEMORY", "9223372036854775807", "largest supported"),
    ("NEURON_LAB_CORE_MEMORY", "99999999999999999999999TiB", "largest supported"),
    ("NEURON_LAB_CORE_MEMORY", "nan", "not a memory size"),
    ("NEURON_LAB_CORE_MEMORY", "0.1", "whole number of bytes"),
    ("NEURON_LAB_NUM_CORES", "99999999999999999999", "between 1 and 64"),
    ("NEURON_LAB_NUM_CORES", "2.0", "not a whole number"),
    ("NEURON_LAB_NUM_CORES", "-1", "not a whole number"),
]


@pytest.mark.parametrize(("variable", "value", "message"), _HOSTILE_CONFIGURATIONS)
def test_a_bad_configuration_never_breaks_import_torch(variable: str, value: str, message: str) -> None:
    """`import torch` warns and works (CPU tensors and all); `import neuron_lab` raises the
    error, naming the variable."""
    result = run_python("""
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch
        print(torch.ones(2).sum().item())
        print(" | ".join(str(w.message) for w in caught))
        try:
            import neuron_lab
        except ValueError as e:
            print("ValueError:", e)
    """, env={variable: value})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "2.0"
    assert variable in lines[1] and message in lines[1], lines[1]
    assert lines[2].startswith("ValueError:") and variable in lines[2] and message in lines[2], lines[2]


def test_import_neuron_lab_before_torch() -> None:
    result = run_python("import neuron_lab, torch; print(torch.ones(1, device='neuron').device)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "neuron:0"


def test_an_extension_built_for_another_torch_says_so_and_torch_still_works() -> None:
    """Build and run time must agree on torch; a mismatch names both versions and the fix
    (instead of an undefined C++ symbol), and never breaks ``import torch``."""
    result = run_python("""
        import sys, types
        sys.modules["neuron_lab.device._built_with"] = types.SimpleNamespace(TORCH_VERSION="2.14.0")
        import torch
        print(torch.ones(2).sum().item())
        try:
            import neuron_lab
        except ImportError as e:
            print("ImportError:", e)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "2.0"
    import torch

    for text in (result.stderr, result.stdout):
        assert f"built against torch 2.14.0, but this is torch {torch.__version__}" in text, text
        assert "`pip install .` (or `pip install -e .`)" in text  # they build against this torch
        assert "python setup.py build_ext --inplace" in text
        assert "--no-build-isolation" not in text  # no longer needed: see _build_backend.py


def test_a_device_that_cannot_load_never_breaks_import_torch() -> None:
    result = run_python(
        "import torch; print(torch.ones(1).item())",
        env={"NEURON_LAB_NUM_CORES": "lots"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1.0"
    assert "the neuron device was not loaded" in result.stderr and "NEURON_LAB_NUM_CORES" in result.stderr
