"""Files neuron_lab writes: one private cache directory, and exports that never write
through a planted symbolic link.

**The cache.** Everything neuron_lab, or TorchInductor on its behalf, keeps on disk lives
in one directory: ``$NEURON_LAB_CACHE_DIR``, else ``$XDG_CACHE_HOME/neuron_lab``, else
``~/.cache/neuron_lab``. It is created with mode 0700 and, before each use, must be a
directory owned by this user that no one else can read or write; otherwise neuron_lab
refuses it, with the path, what it found and the fix. Inductor's own default,
``/tmp/torchinductor_<user>``, is shared ground: Inductor accepts that directory when
another local user created it first, and unpickles what it finds there. So when the
compiled tier or the ``neuron`` backend first runs, Inductor's cache moves to the
``inductor`` folder of the private cache (``TORCHINDUCTOR_CACHE_DIR``), unless the user
chose a directory of their own, which is kept but refused if others may write to it.

**Exports** (Chrome traces, CSV and Parquet tables, memory snapshots) go through
``replace_file``: the data is written to a new file beside the target and renamed over
it, so a symbolic link someone planted at the target path is never written through; a
link found there is refused with an error that says so.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path
from typing import IO, Iterator, Union

__all__ = ["CACHE_DIR_ENV", "INDUCTOR_PATCHES", "UnsafeDirectoryError", "cache_dir", "cache_subdir",
           "inductor_cache_dir", "use_private_inductor_cache", "replace_file", "refuse_link", "open_private_log"]

CACHE_DIR_ENV = "NEURON_LAB_CACHE_DIR"
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"

PathLike = Union[str, "os.PathLike[str]"]


class UnsafeDirectoryError(PermissionError):
    """A directory neuron_lab would keep code or pickles in is not private to this user."""


def _default_cache_root() -> Path:
    chosen = os.environ.get(CACHE_DIR_ENV)
    if chosen:
        return Path(chosen).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg and os.path.isabs(os.path.expanduser(xdg)) else Path.home() / ".cache"
    return base / "neuron_lab"


def _owner_name(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _check_private(path: Path, *, forbidden_bits: int, what: str, fix: str) -> None:
    """Raises UnsafeDirectoryError unless ``path`` is a directory owned by this user whose
    mode has none of ``forbidden_bits``."""
    st = os.stat(path)
    problems = []
    if not stat.S_ISDIR(st.st_mode):
        problems.append("it is not a directory")
    if st.st_uid != os.getuid():
        problems.append(f"it is owned by {_owner_name(st.st_uid)}, not by you ({_owner_name(os.getuid())})")
    if st.st_mode & forbidden_bits:
        problems.append(f"its mode is {stat.S_IMODE(st.st_mode):04o}")
    if problems:
        raise UnsafeDirectoryError(
            f"neuron_lab: refusing to use {path} as {what}: {'; '.join(problems)}. Code and pickles kept there "
            f"could be planted by another user and run as you. {fix}")


def _private_directory(path: Path, what: str) -> Path:
    """``path``, created with mode 0700 if missing, and checked to be private."""
    path = Path(os.path.abspath(path))
    try:
        os.makedirs(path.parent, mode=0o700, exist_ok=True)
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    _check_private(path, forbidden_bits=0o077, what=what,
                   fix=f"Fix: `chmod 700 {path}` if it is yours and you trust its contents, else remove it, "
                       f"or point {CACHE_DIR_ENV} at a directory of your own.")
    return path


def cache_dir() -> Path:
    """neuron_lab's private cache directory (see the module docstring), checked now."""
    return _private_directory(_default_cache_root(), "neuron_lab's cache directory")


def cache_subdir(name: str) -> Path:
    """A private folder of the cache directory, e.g. ``compiled`` or ``inductor``."""
    return _private_directory(cache_dir() / name, f"neuron_lab's {name} cache")


def _users_inductor_dir() -> Union[Path, None]:
    """TORCHINDUCTOR_CACHE_DIR when the user chose it: Inductor itself writes its default
    (``/tmp/torchinductor_<user>``) into the variable on first use, which is no choice."""
    value = os.environ.get(INDUCTOR_CACHE_ENV)
    if not value:
        return None
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir  # torch-free, cheap

    if os.path.abspath(value) == os.path.abspath(default_cache_dir()):
        return None
    return Path(os.path.abspath(value))


def inductor_cache_dir() -> Path:
    """Where TorchInductor caches for neuron_lab (the compile worker's and the ``neuron``
    backend's code): the user's TORCHINDUCTOR_CACHE_DIR if set and not writable by
    others, else the ``inductor`` folder of the private cache."""
    chosen = _users_inductor_dir()
    if chosen is None:
        return cache_subdir("inductor")
    os.makedirs(chosen, mode=0o700, exist_ok=True)
    _check_private(chosen, forbidden_bits=0o022, what=f"TorchInductor's cache ({INDUCTOR_CACHE_ENV})",
                   fix=f"Fix: `chmod go-w {chosen}` if it is yours and you trust its contents, or unset "
                       f"{INDUCTOR_CACHE_ENV} to use neuron_lab's private cache.")
    return chosen


def use_private_inductor_cache() -> Path:
    """Points TorchInductor at ``inductor_cache_dir()`` for the rest of the process (and
    for processes it starts); returns that directory. Raises UnsafeDirectoryError if it
    is not private."""
    directory = inductor_cache_dir()
    os.environ[INDUCTOR_CACHE_ENV] = str(directory)
    return directory


# TorchInductor keeps precompiled C++ headers in its default directory whatever
# TORCHINDUCTOR_CACHE_DIR says (``/tmp/torchinductor_<user>/precompiled_headers``) and
# includes a header it finds there into the kernels it compiles. Compiles and loads in the
# user's process go without them (the same code, a little slower to build); the compile
# worker has a private temporary directory, so its headers are private.
INDUCTOR_PATCHES = {"cpp_cache_precompile_headers": False}


def open_private_log(path: PathLike, append: bool = False) -> IO[bytes]:
    """``path`` opened for writing (emptied first unless ``append``), mode 0600, never
    through a link."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    return os.fdopen(fd, "wb")


def refuse_link(path: PathLike, what: str) -> None:
    """Raises if ``path`` is a symbolic link or a directory (``what`` names the export)."""
    path = Path(path)
    if path.is_symlink():
        raise FileExistsError(
            errno.EEXIST,
            f"neuron_lab: not writing the {what} to {path}: it is a symbolic link (to {os.readlink(path)}), and "
            "writing through it would overwrite the link's target. Remove the link or choose another path.",
            str(path))
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, f"neuron_lab: cannot write the {what} to {path}: it is a directory; "
                                              "give a file name", str(path))


@contextlib.contextmanager
def replace_file(path: PathLike, what: str, binary: bool = False) -> Iterator[IO]:
    """A file object whose content replaces ``path`` when the block ends without error.

    The data goes to a new file beside ``path`` (created exclusively, never through a
    link, with the permissions a plain ``open`` would give) that is then renamed over
    ``path``: a symbolic link at ``path`` is refused up front (``what`` names the export
    in the error), and one planted meanwhile is replaced, never written through. On an
    error the new file is removed and ``path`` keeps its old content."""
    path = Path(path)
    refuse_link(path, what)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(100):
        temporary = path.with_name(f".{path.name}.{secrets.token_hex(6)}.partial")
        try:
            fd = os.open(temporary, flags, 0o666)  # the umask applies, as for open(path, "w")
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(errno.EEXIST, f"neuron_lab: could not create a new file beside {path}", str(path))
    try:
        with (os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8", newline="")) as f:
            yield f
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
