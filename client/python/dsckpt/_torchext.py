"""dsckpt._torchext — the C++ proof of a warm save's tensors (``_tproof.cpp``), built against
the installed torch when the package was (``pip install --no-build-isolation`` where torch
is, setup.py), else at run time.

A warm ``dsckpt.torch.save`` proves that the state dict's tensors are the recorded ones. In
Python that takes a C pointer check and torch's TensorGuards, which read each tensor and
records of their own kept apart (0.20-0.25 ms for 1,556 tensors on the H200's host); one
C++ pass over the TensorImpls takes 0.02-0.04 ms. It must be compiled against the torch in
use (its C++ ABI is torch's), as DeepSpeed's ops are: the first save of a process starts a
thread that runs ``torch.utils.cpp_extension.load`` in a process of its own (a C++ compiler
and ninja; 15-20 s, once per torch version: torch keeps the build in its extensions
directory, ``TORCH_EXTENSIONS_DIR``), and saves use the module once it is built and has
proven itself on a few tensors; until then, or when it cannot be built (logged at debug
level), they prove in Python. A build leaves a ``dsckpt-built`` file in the build directory
(this torch, Python and source, and the module's path): a later process loads that module
on its thread in milliseconds, without the build process (which imports torch and setuptools
again, seconds of a core).

A module the package carries (``dsckpt/dsckpt_tproof_1.*.so``) is used first, and without any
build, where its ``_tproof.built`` names the running torch, Python and source, and it passes
the same probe; else the build above.

``DSCKPT_TORCH_EXT``: unset, the build is tried unless it failed before for this torch and
this source (a ``dsckpt-failed`` file in the build directory says so; delete it to try
again); ``1`` tries it whatever failed before; ``0`` never builds nor uses it.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import subprocess
import sys
import threading
import time
from types import ModuleType
from typing import Optional

import torch

log = logging.getLogger("dsckpt.torch")

NAME = "dsckpt_tproof_1"  # _tproof.cpp's PyInit_ name: bump with the record's layout
FAILED = "dsckpt-failed"  # in the build directory: this torch and source did not build
BUILT = "dsckpt-built"  # in the build directory: this torch and source built, and where to
STALE_LOCK_S = 600  # torch's build lock older than this was left by a build that was killed
_HERE = os.path.abspath(__file__)
_SOURCE = os.path.join(os.path.dirname(_HERE), "_tproof.cpp")
_lock = threading.Lock()
_built = threading.Event()
_state: dict = {"started": False, "module": None}


class _Sub(torch.Tensor):
    """A tensor subclass, for the probe."""


def _probe(mod: ModuleType) -> bool:
    """Whether mod tells recorded tensors from every kind of other one, as the proof must."""
    base = torch.arange(24.0).reshape(4, 6)
    ts = [base, base[1:], base.t(), torch.nn.Parameter(torch.zeros(3)), torch.empty(0)]
    shared = [True, True, True, False, False]
    r = mod.record(ts, shared)
    others = [base.clone(), base[2:], base, torch.nn.Parameter(torch.zeros(3, 1)),
              torch.empty(0, dtype=torch.int32)]
    fresh = [t.detach() for t in ts[:3]] + [ts[3], ts[4].detach()]  # new objects, same tensors
    strangers = [None, torch.zeros(4, 6).to_sparse(), torch.zeros(4, 6, device="meta"),
                 torch.zeros(4, 6).as_subclass(_Sub), torch.zeros(4, 6, requires_grad=True)]
    return r is not None and mod.check(r, ts) and mod.check(r, fresh) and \
        not any(mod.check(r, ts[:i] + [o] + ts[i + 1:]) for i, o in enumerate(others)) and \
        not any(mod.check(r, [s] + ts[1:]) for s in strangers) and \
        not mod.check(r, ts[:-1]) and mod.record([None], [False]) is None


def _extension():
    """torch.utils.cpp_extension, imported without its warning of a machine without CUDA
    (the proof needs none)."""
    quiet = logging.getLogger("torch.utils.cpp_extension")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        from torch.utils import cpp_extension
    finally:
        quiet.setLevel(level)
    return cpp_extension


def _stamp() -> str:
    """What a build is recorded against: torch's version, the Python it runs in and the
    source's digest."""
    with open(_SOURCE, "rb") as f:
        return (f"{torch.__version__} {sys.implementation.cache_tag} "
                f"{hashlib.sha256(f.read()).hexdigest()}\n")


def _directory() -> str:
    """The build directory torch.utils.cpp_extension gives NAME (its _get_build_directory),
    worked out without importing it (a quarter of a second of the trainer's thread). Where
    a torch computes it otherwise, nothing is found there and the build process is run."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is None:
        from torch import _appdirs
        if getattr(torch.version, "hip", None) is not None:
            accel = "rocm" + torch.version.hip.replace(".", "")
        elif torch.version.cuda is not None:
            accel = "cu" + torch.version.cuda.replace(".", "")
        else:
            accel = "cpu"
        python = f"py{sys.version_info.major}{sys.version_info.minor}{sys.abiflags}"
        root = os.path.join(os.path.realpath(_appdirs.user_cache_dir(appname="torch_extensions")),
                            f"{python}_{accel}")
    return os.path.join(root, NAME)


def _record(directory: str, path: str) -> None:
    """Writes down in directory that this torch and source built the module at path (whole or
    not at all: other processes read it at any time)."""
    tmp = os.path.join(directory, f"{BUILT}.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(_stamp() + path + "\n")
    os.replace(tmp, os.path.join(directory, BUILT))


def _recorded() -> Optional[str]:
    """The path of the module a build of this torch and source left, or None; only a module
    in the build directory itself, as torch's own load would import."""
    try:
        directory = _directory()
        with open(os.path.join(directory, BUILT)) as f:
            stamp, path = f.readline(), f.readline().rstrip("\n")
    except Exception:  # noqa: BLE001 - no record, or a torch without what _directory reads
        return None
    inside = os.path.dirname(path) == directory
    return path if stamp == _stamp() and inside and os.path.isfile(path) else None


def _fail(directory: str) -> None:
    """Writes down in directory that this torch and source did not make a usable module."""
    with open(os.path.join(directory, FAILED), "w") as f:
        f.write(_stamp())
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(directory, BUILT))


def _main(force: bool) -> int:
    """The build process (_build starts it): builds the module unless it failed before (or
    force), and prints its path; on failure, writes it down and says why on stderr. A lock
    left by a build that was killed is removed once stale."""
    cpp_extension = _extension()
    directory = cpp_extension._get_build_directory(NAME, False)
    failed = os.path.join(directory, FAILED)
    with contextlib.suppress(FileNotFoundError), open(failed) as f:
        if not force and f.read() == _stamp():
            print(f"{NAME} failed to build before ({failed})", file=sys.stderr)
            return 1
    lock = os.path.join(directory, "lock")
    with contextlib.suppress(FileNotFoundError):
        if time.time() - os.stat(lock).st_mtime > STALE_LOCK_S:
            os.unlink(lock)
    try:
        mod = cpp_extension.load(name=NAME, sources=[_SOURCE], extra_cflags=["-O2"],
                                 verbose=False)
    except Exception as e:  # noqa: BLE001 - no compiler, no ninja, no headers
        _fail(directory)
        print(f"{NAME} not built: {e!r}".replace("\n", " "), file=sys.stderr)
        return 1
    with contextlib.suppress(FileNotFoundError):
        os.unlink(failed)
    _record(directory, mod.__file__)
    print(mod.__file__)
    return 0


# Runs this file as the build process; unlike ``python _torchext.py``, without putting the
# package's directory first on sys.path (its torch.py would be taken for torch).
_RUN = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')"


def _packaged() -> Optional[str]:
    """The module the package carries when its _tproof.built names this torch, Python and
    source, else None."""
    here = os.path.dirname(_HERE)
    try:
        with open(os.path.join(here, "_tproof.built")) as f:
            stamp = f.read()
    except OSError:
        return None
    if stamp != _stamp():
        return None
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(here, NAME + suffix)
        if os.path.isfile(path):
            return path
    return None


def _load(path: str, record: bool = True) -> bool:
    """Loads the module at path and keeps it if its probe passes; else writes the failure
    down beside it (when record: a build directory's). Whether it is kept."""
    spec = importlib.util.spec_from_file_location(NAME, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if _probe(mod):
        _state["module"] = mod
        return True
    if record:
        _fail(os.path.dirname(path))
    log.debug("dsckpt: %s answers differently from torch; the proof stays in Python", NAME)
    return False


def _build(force: bool) -> None:
    """Loads the module the package carries for this torch, or one an earlier build recorded
    for this torch and source; else (or when neither loads) builds it in a process of its own
    session (which finishes the build, and releases torch's lock on its directory, even when
    this process exits first) and loads that. This process imports nothing of the build (setuptools and all), so that the
    trainer's thread does not wait for it. Logs why the proof stays in Python."""
    try:
        path = _packaged()
        if path is not None:
            try:
                if _load(path, record=False):
                    return
            except Exception as e:  # noqa: BLE001 - e.g. built against another libtorch
                log.debug("dsckpt: %s of the package does not load: %r", path, e)
        path = _recorded()
        if path is not None:
            try:
                _load(path)
                return
            except Exception as e:  # noqa: BLE001 - e.g. a library it needs is gone: build
                log.debug("dsckpt: %s recorded at %s does not load: %r", NAME, path, e)
        r = subprocess.run([sys.executable, "-c", _RUN, _HERE, "1" if force else "0"],
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, start_new_session=True, check=False)
        if r.returncode != 0:
            lines = r.stderr.decode(errors="replace").strip().splitlines()
            log.debug("dsckpt: the proof stays in Python: %s",
                      lines[-1] if lines else f"the build exited {r.returncode}")
            return
        _load(r.stdout.decode().strip().splitlines()[-1])
    except Exception as e:  # noqa: BLE001 - whatever stops it, saves prove in Python
        log.debug("dsckpt: %s not used, the proof stays in Python: %r", NAME, e)
    finally:
        _built.set()


def module() -> Optional[ModuleType]:
    """The built module when it is ready, else None; the first call starts the build (not
    with ``DSCKPT_TORCH_EXT=0``)."""
    mode = os.environ.get("DSCKPT_TORCH_EXT", "")
    if mode == "0":
        return None
    with _lock:
        if not _state["started"]:
            _state["started"] = True
            threading.Thread(target=_build, args=(mode == "1",), name="dsckpt-torch-ext",
                             daemon=True).start()
    return _state["module"]


def wait(timeout: Optional[float] = None) -> Optional[ModuleType]:
    """Starts the build if needed, waits up to timeout seconds for it, and returns the module
    or None (for tests and benchmarks)."""
    if module() is None and _state["started"]:
        _built.wait(timeout)
    return _state["module"]


if __name__ == "__main__":  # the build process (_RUN): its last argument is FORCE, 0 or 1
    sys.exit(_main(sys.argv[-1] == "1"))
