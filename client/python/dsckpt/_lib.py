"""_lib.py — finds libdsckpt.so and declares the C signatures of client/dsckpt.h for ctypes.

The library is searched in this order, first hit wins:

1. ``$DSCKPT_LIB`` (a path to the shared object);
2. next to the package: ``dsckpt/libdsckpt.so.0`` or ``dsckpt/libdsckpt.so`` (what
   ``pip install client/python`` builds into the package, or a copied bundle carries);
3. the repository's build tree: ``<repo>/build/libdsckpt.so`` (when the package is used
   from ``<repo>/client/python/dsckpt``, not once pip installed it elsewhere);
4. the system loader: ``libdsckpt.so.0`` (``make install`` puts it in ``$PREFIX/lib`` and
   runs ``ldconfig``), for a package copied without its library.

Nothing is compiled for the binding: ctypes releases the GIL around every foreign call, so a
blocking ``dsckpt_wait`` lets other Python threads run.

One optional C module speeds up the warm save of ``dsckpt.torch`` (``dsckpt._match``, from
``_match.c``: one stable-ABI ``_match.abi3.so`` for Python 3.11 and later); without it the
package does the same in Python. :func:`match_module` looks for it, first hit wins:

1. inside the package, imported as usual (what ``pip install client/python`` builds where a
   compiler and the Python headers are);
2. beside the library ``$DSCKPT_LIB`` names (``make`` builds ``build/_match.abi3.so`` beside
   ``build/libdsckpt.so``, ``make gpu-bundle`` ``build/gpu/lib/_match.abi3.so`` beside
   ``build/gpu/lib/libdsckpt.so.0``);
3. without ``$DSCKPT_LIB``: the repository's build tree, ``<repo>/build/_match.abi3.so``.
"""
from __future__ import annotations

import ctypes
import importlib
import importlib.machinery
import importlib.util
import logging
import os
import sys
import threading
from types import ModuleType
from typing import List, Optional, Tuple

_HERE = os.path.dirname(os.path.abspath(__file__))


class Progress(ctypes.Structure):
    """dsckpt_progress_t: level and byte counters of one save."""

    _fields_ = [
        ("level", ctypes.c_int),
        ("bytes_total", ctypes.c_uint64),
        ("bytes_snapshot", ctypes.c_uint64),
        ("bytes_flushed", ctypes.c_uint64),
    ]


class PrefetchInfo(ctypes.Structure):
    """dsckpt_prefetch_info_t: what a prefetch read (see dsckpt_prefetch)."""

    _fields_ = [
        ("dir", ctypes.c_char * 4097),
        ("tag", ctypes.c_char * 257),
        ("bytes_pulled", ctypes.c_uint64),
        ("bytes_cached", ctypes.c_uint64),
        ("seconds", ctypes.c_double),
    ]


_vp, _cp, _i, _sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_size_t

# name: (restype, argtypes), exactly as client/dsckpt.h declares them.
_SIGNATURES = {
    "dsckpt_version": (_cp, []),
    "dsckpt_strerror": (_cp, [_i]),
    "dsckpt_err_name": (_cp, [_i]),
    "dsckpt_level_name": (_cp, [_i]),
    "dsckpt_connect": (_i, [_cp, ctypes.POINTER(_vp)]),
    "dsckpt_identify": (_i, [_vp, _cp, _i, _i]),
    "dsckpt_identify_run": (_i, [_vp, _cp, _i, _i, _cp]),
    "dsckpt_run": (_cp, [_vp]),
    "dsckpt_max_tensors": (ctypes.c_int64, [_vp]),
    "dsckpt_close": (None, [_vp]),
    "dsckpt_last_error": (_cp, [_vp]),
    "dsckpt_last_cause": (_i, [_vp]),
    "dsckpt_seal": (_i, [_vp, _cp]),
    "dsckpt_save_begin": (_i, [_vp, _cp, _cp, ctypes.POINTER(_vp)]),
    "dsckpt_save_begin_flags": (_i, [_vp, _cp, _cp, ctypes.c_uint, ctypes.POINTER(_vp)]),
    "dsckpt_add_tensor": (_i, [_vp, _cp, _cp, ctypes.POINTER(ctypes.c_int64), _i, _vp, _sz]),
    "dsckpt_add_tensors": (_i, [_vp, _vp, _sz, ctypes.POINTER(_sz)]),
    "dsckpt_plan_create": (_i, [_vp, _vp, _sz, ctypes.POINTER(_vp)]),
    "dsckpt_add_plan": (_i, [_vp, _vp]),
    "dsckpt_plan_prepare": (_i, [_vp, _vp]),
    "dsckpt_plan_free": (None, [_vp]),
    "dsckpt_add_blob": (_i, [_vp, _cp, _vp, _sz]),
    "dsckpt_save_set_stream": (_i, [_vp, _vp]),
    "dsckpt_save_end": (_i, [_vp]),
    "dsckpt_wait": (_i, [_vp, _i, _i]),
    "dsckpt_save_progress": (_i, [_vp, ctypes.POINTER(Progress)]),
    "dsckpt_save_free": (None, [_vp]),
    "dsckpt_load_begin": (_i, [_vp, _cp, _cp, ctypes.POINTER(_vp)]),
    "dsckpt_load_source": (_cp, [_vp]),
    "dsckpt_load_add_tensors": (_i, [_vp, _vp, _sz, ctypes.POINTER(_sz)]),
    "dsckpt_load_set_stream": (_i, [_vp, _vp]),
    "dsckpt_load_end": (_i, [_vp]),
    "dsckpt_load_wait": (_i, [_vp, _i]),
    "dsckpt_load_progress": (None, [_vp, ctypes.POINTER(ctypes.c_uint64),
                                    ctypes.POINTER(ctypes.c_uint64)]),
    "dsckpt_load_free": (None, [_vp]),
    "dsckpt_prefetch": (_i, [_vp, _cp, _cp, _i, ctypes.POINTER(PrefetchInfo)]),
    "dsckpt_job_nodes": (_i, [_vp, _cp, ctypes.POINTER(_cp), ctypes.c_uint,
                              ctypes.POINTER(ctypes.c_uint), ctypes.c_uint]),
    "dsckpt_commit": (_i, [_vp, _cp, _i]),
    "dsckpt_release_gpu": (_i, [_vp]),
    "dsckpt_host_alloc": (_vp, [_sz]),
    "dsckpt_host_free": (None, [_vp]),
}


def candidates() -> List[str]:
    """Paths tried for libdsckpt, in order (see the module docstring)."""
    env = os.environ.get("DSCKPT_LIB")
    if env:
        return [env]  # an explicit choice is never second-guessed
    repo = os.path.normpath(os.path.join(_HERE, "..", "..", ".."))
    return [
        os.path.join(_HERE, "libdsckpt.so.0"),
        os.path.join(_HERE, "libdsckpt.so"),
        os.path.join(repo, "build", "libdsckpt.so"),
        "libdsckpt.so.0",
    ]


def match_module(plan_version: int) -> Optional[ModuleType]:
    """dsckpt._match when it is found and reads plans of plan_version, else None (see the
    module docstring; why it was not loaded is logged at debug level)."""
    log = logging.getLogger("dsckpt.torch")
    if sys.version_info < (3, 11):  # built against the limited API of 3.11
        return None
    try:
        mod = importlib.import_module("dsckpt._match")
    except ImportError:
        env = os.environ.get("DSCKPT_LIB")
        where = os.path.dirname(env) if env else os.path.normpath(
            os.path.join(_HERE, "..", "..", "..", "build"))
        path = os.path.join(where, "_match.abi3.so")
        if not os.path.exists(path):
            log.debug("dsckpt: no %s, the warm save matches in Python", path)
            return None
        try:
            loader = importlib.machinery.ExtensionFileLoader("dsckpt._match", path)
            spec = importlib.util.spec_from_file_location("dsckpt._match", path, loader=loader)
            mod = importlib.util.module_from_spec(spec)
            loader.exec_module(mod)
        except ImportError as e:
            log.debug("dsckpt: %s not loaded, the warm save matches in Python: %s", path, e)
            return None
    if getattr(mod, "PLAN_VERSION", None) != plan_version:
        log.debug("dsckpt: %s reads other plans, the warm save matches in Python", mod.__file__)
        return None
    return mod


_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
path: Optional[str] = None  # the file actually loaded, once lib() has run


def lib() -> ctypes.CDLL:
    """The loaded library with its signatures declared (loaded once, on first use)."""
    global _lib, path
    with _lock:
        if _lib is None:
            _lib, path = _load()
        return _lib


def _load() -> Tuple[ctypes.CDLL, str]:
    """Loads the first candidate that exists and declares every function's signature."""
    tried = []
    for cand in candidates():
        if os.sep in cand and not os.path.exists(cand):
            tried.append(f"{cand} (missing)")
            continue
        try:
            handle = ctypes.CDLL(cand)
        except OSError as e:
            tried.append(f"{cand} ({e})")
            continue
        for name, (res, args) in _SIGNATURES.items():
            fn = getattr(handle, name)
            fn.restype, fn.argtypes = res, args
        return handle, cand
    raise ImportError(
        "libdsckpt.so.0 not found. `pip install client/python` builds it into the package; "
        "else install it from the repository (make && sudo make install; "
        "`make install` runs ldconfig as root, run it yourself after a DESTDIR install), or "
        "point DSCKPT_LIB at the library (DSCKPT_LIB=/path/to/build/libdsckpt.so). Tried: "
        + "; ".join(tried))
