"""dsckpt._xxh3 — XXH3-64 (seed 0) of bytes in place, as dsckptd records it per tensor in a
safetensors header, for the loads that read files without the daemon.

Two well-kept implementations, first found wins: the ``xxhash`` package (a dependency of
``pip install client/python``), else the system's ``libxxhash.so.0`` through ctypes (Debian's
libxxhash0, which ``make deps`` installs). Both hash the caller's buffer without a copy, and
ctypes releases the GIL around the call. Without either, :func:`digest` raises, naming what
to install: a load never goes on unchecked for want of a hash.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Callable, Optional

_lock = threading.Lock()
_impl: Optional[Callable[[memoryview], int]] = None
name: Optional[str] = None  # which implementation digest uses, once it has run


def _from_package() -> Optional[Callable[[memoryview], int]]:
    """xxhash.xxh3_64_intdigest, or None without the package (or one older than XXH3)."""
    try:
        import xxhash
    except ImportError:
        return None
    return getattr(xxhash, "xxh3_64_intdigest", None)


def _from_system() -> Optional[Callable[[memoryview], int]]:
    """XXH3_64bits of libxxhash.so.0 over a writable buffer's address, or None."""
    try:
        lib = ctypes.CDLL("libxxhash.so.0")
        fn = lib.XXH3_64bits
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_uint64
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t]

    def digest(view: memoryview) -> int:
        """XXH3_64bits(view): the address of its first byte (none for an empty view)."""
        if not view.nbytes:
            return fn(None, 0)
        return fn(ctypes.addressof(ctypes.c_char.from_buffer(view)), view.nbytes)
    return digest


def _load() -> Callable[[memoryview], int]:
    """The implementation, found once (see the module docstring)."""
    global _impl, name
    with _lock:
        if _impl is None:
            for what, find in (("xxhash", _from_package), ("libxxhash.so.0", _from_system)):
                fn = find()
                if fn is not None:
                    _impl, name = fn, what
                    break
            else:
                raise ImportError("dsckpt: no XXH3 implementation to check the tensors' "
                                  "checksums with: pip install xxhash (or install the "
                                  "system's libxxhash0)")
        return _impl


def digest(view: memoryview) -> int:
    """XXH3-64 with seed 0 of a contiguous, writable byte buffer, hashed in place."""
    return (_impl or _load())(view)
