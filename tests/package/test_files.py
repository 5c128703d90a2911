"""Files neuron_lab writes: one private cache directory (mode 0700, owner checked) for
everything it or TorchInductor keeps, and exports that never write through a symbolic
link planted at their path."""

from __future__ import annotations

import os
import stat
import sys

import pytest
import torch

import neuron_lab
from neuron_lab import files


OTHER_UID = 54321  # a local user that is not the one running the tests


@pytest.fixture
def cache_env(tmp_path, monkeypatch):
    """neuron_lab's cache and Inductor's variable as a fresh process would see them."""
    monkeypatch.delenv(files.CACHE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(files.INDUCTOR_CACHE_ENV, raising=False)
    return tmp_path


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _hostile(path) -> None:
    """A directory another local user made first: theirs if we can say so (root), else
    open to everyone."""
    path.mkdir(parents=True)
    path.chmod(0o777)
    if os.getuid() == 0:
        os.chown(path, OTHER_UID, OTHER_UID)


# ---- the cache directory ------------------------------------------------------------------


def test_the_cache_directory_is_created_private_and_owned(cache_env):
    directory = files.cache_dir()
    assert directory == cache_env / "xdg" / "neuron_lab"
    assert _mode(directory) == 0o700 and os.stat(directory).st_uid == os.getuid()
    inductor = files.inductor_cache_dir()
    assert inductor == directory / "inductor" and _mode(inductor) == 0o700


def test_the_cache_directory_variable_is_honoured(cache_env, monkeypatch):
    monkeypatch.setenv(files.CACHE_DIR_ENV, str(cache_env / "mine"))
    assert files.cache_dir() == cache_env / "mine" and _mode(cache_env / "mine") == 0o700


def test_a_cache_directory_someone_else_made_is_refused(cache_env, monkeypatch):
    planted = cache_env / "shared" / "neuron_lab"
    _hostile(planted)
    monkeypatch.setenv(files.CACHE_DIR_ENV, str(planted))
    with pytest.raises(files.UnsafeDirectoryError) as error:
        files.cache_dir()
    message = str(error.value)
    assert str(planted) in message and "Fix:" in message and files.CACHE_DIR_ENV in message
    assert ("owned by uid 54321" in message) if os.getuid() == 0 else ("mode is 0777" in message)


def test_a_readable_cache_directory_of_ours_is_refused(cache_env):
    (cache_env / "xdg" / "neuron_lab").mkdir(parents=True)
    (cache_env / "xdg" / "neuron_lab").chmod(0o755)
    with pytest.raises(files.UnsafeDirectoryError, match=r"mode is 0755.*chmod 700"):
        files.cache_dir()


def test_an_unsafe_cache_never_breaks_import_torch(tmp_path, monkeypatch):
    """NEURON_LAB_COMPILE=1 with a cache directory others may write: ``import torch`` and
    the device work, the compiled tier stays off, and a warning says why."""
    from conftest import run_python

    # An earlier compile in this process pointed Inductor at the private cache through the
    # environment, which the child would inherit (and rightly keep).
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)

    hostile = tmp_path / "cache"
    _hostile(hostile)
    result = run_python("""
    import torch
    import neuron_lab
    print((torch.ones(2, device="neuron") + 1).cpu().tolist(), neuron_lab.adaptive_eager.policy()["compile"])
    """, env={files.CACHE_DIR_ENV: str(hostile), "NEURON_LAB_COMPILE": "1"})
    assert result.returncode == 0, result.stderr
    assert "[2.0, 2.0] False" in result.stdout, result.stdout
    assert "the compiled tier stays off" in result.stderr and str(hostile) in result.stderr, result.stderr


def test_inductor_moves_to_the_private_cache_unless_the_user_chose_a_safe_directory(cache_env, monkeypatch):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    # Not chosen, or Inductor's own default (which Inductor writes into the variable): ours.
    assert files.use_private_inductor_cache() == cache_env / "xdg" / "neuron_lab" / "inductor"
    assert os.environ[files.INDUCTOR_CACHE_ENV] == str(cache_env / "xdg" / "neuron_lab" / "inductor")
    monkeypatch.setenv(files.INDUCTOR_CACHE_ENV, default_cache_dir())
    assert files.use_private_inductor_cache() == cache_env / "xdg" / "neuron_lab" / "inductor"
    # The user's own directory is kept...
    chosen = cache_env / "chosen"
    chosen.mkdir(mode=0o755)
    monkeypatch.setenv(files.INDUCTOR_CACHE_ENV, str(chosen))
    assert files.use_private_inductor_cache() == chosen
    # ...unless others may write into it.
    shared = cache_env / "shared"
    _hostile(shared)
    monkeypatch.setenv(files.INDUCTOR_CACHE_ENV, str(shared))
    with pytest.raises(files.UnsafeDirectoryError, match=r"TORCHINDUCTOR_CACHE_DIR.*Fix:"):
        files.use_private_inductor_cache()


def test_compiled_code_never_uses_inductors_shared_tmp_cache(tmp_path):
    """The attack: another local user creates /tmp/torchinductor_<victim> first (open to
    all) and plants pickles there. torch.compile(backend="neuron") and the compiled tier
    compile with Inductor into the private cache instead, and never write to, or read
    from, the planted directory."""
    import getpass
    import subprocess
    import textwrap

    temp = tmp_path / "tmp"
    planted = temp / f"torchinductor_{getpass.getuser()}"
    _hostile(planted)
    (planted / "planted").write_text("")
    code = """
    import os, torch
    import neuron_lab
    f = torch.compile(lambda x: (x * 2).sin() + 1, backend="neuron", options={"neuron.launch": "inline"})
    x = torch.randn(8, device="neuron")
    assert torch.allclose(f(x).cpu(), (x.cpu() * 2).sin() + 1)
    neuron_lab.configure(compile=True, compile_after=2)
    for _ in range(4):
        (x.cos() * 3 + x).sum().item()
    assert neuron_lab.adaptive_eager.wait_for_compiles(300)
    assert neuron_lab.adaptive_eager.counters()["compiles_succeeded"] == 1, neuron_lab.adaptive_eager.graphs()
    print("CACHE", os.environ["TORCHINDUCTOR_CACHE_DIR"])
    """
    env = {k: v for k, v in os.environ.items() if k not in (files.INDUCTOR_CACHE_ENV, files.CACHE_DIR_ENV)}
    env.update(TMPDIR=str(temp), XDG_CACHE_HOME=str(tmp_path / "xdg"))
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    private = tmp_path / "xdg" / "neuron_lab" / "inductor"
    assert f"CACHE {private}" in result.stdout, result.stdout
    written = {p.parent.name for p in private.rglob("*.py")}
    assert len(written) >= 2, sorted(private.rglob("*"))  # the inline graph's code and the worker's
    assert sorted(str(p.relative_to(planted)) for p in planted.rglob("*")) == ["planted"], list(planted.rglob("*"))


# ---- exports never write through a link -----------------------------------------------------


@pytest.fixture
def victim(tmp_path):
    """A file someone wants overwritten, and a link to it planted where an export goes."""
    target = tmp_path / "precious"
    target.write_text("precious content")
    return target


def _plant(link, target) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)


def _assert_untouched(link, target) -> None:
    assert target.read_text() == "precious content"
    assert link.is_symlink()
    assert not [p for p in link.parent.iterdir() if p.name.endswith(".partial")], list(link.parent.iterdir())


@pytest.fixture
def profile():
    with neuron_lab.profiler.profile() as prof:
        (torch.randn(16, device="neuron") * 2).sum().item()
    return prof


@pytest.mark.parametrize("kind", ["chrome_trace", "csv", "csv_ops", "parquet", "parquet_ops"])
def test_profile_exports_refuse_a_planted_link(kind, profile, tmp_path, victim):
    if kind.startswith("parquet"):
        pytest.importorskip("pyarrow")
    suffix = {"chrome_trace": ".json", "csv": ".csv", "parquet": ".parquet"}[kind.split("_ops")[0]]
    path = tmp_path / "out" / f"run{suffix}"
    link = path.with_name(f"run_ops{suffix}") if kind.endswith("_ops") else path
    _plant(link, victim)
    export = {"chrome_trace": profile.export_chrome_trace, "csv": profile.export_csv,
              "parquet": profile.export_parquet}[kind.split("_ops")[0]]
    with pytest.raises(FileExistsError, match=r"is a symbolic link .*precious.*Remove the link"):
        export(path)
    _assert_untouched(link, victim)
    assert sorted(p.name for p in path.parent.iterdir()) == [link.name]  # the pair: neither file written


def test_memory_snapshot_refuses_a_planted_link(tmp_path, victim):
    link = tmp_path / "snapshot.pickle"
    _plant(link, victim)
    with pytest.raises(FileExistsError, match=r"memory snapshot .* is a symbolic link"):
        torch.neuron.memory._dump_snapshot(str(link))
    _assert_untouched(link, victim)


def test_exports_replace_a_regular_file_and_leave_nothing_beside_it(profile, tmp_path):
    path = tmp_path / "trace.json"
    path.write_text("old")
    profile.export_chrome_trace(path)
    assert path.read_text().startswith("{") and [p.name for p in tmp_path.iterdir()] == ["trace.json"]
    assert _mode(path) == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_failed_export_keeps_the_old_file(tmp_path):
    path = tmp_path / "table.csv"
    path.write_text("old")
    with pytest.raises(RuntimeError, match="half way"):
        with files.replace_file(path, "CSV table") as f:
            f.write("new, partial")
            raise RuntimeError("half way")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["table.csv"]


def test_a_link_planted_after_the_check_is_replaced_not_followed(tmp_path, victim):
    """The rename replaces whatever is at the path when the data is complete: a link
    planted while the export was being written is replaced, its target untouched."""
    path = tmp_path / "trace.json"
    with files.replace_file(path, "Chrome trace") as f:
        _plant(path, victim)
        f.write("{}")
    assert not path.is_symlink() and path.read_text() == "{}"
    assert victim.read_text() == "precious content"
