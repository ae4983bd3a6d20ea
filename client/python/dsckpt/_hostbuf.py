"""_hostbuf.py — host memory the daemon reads without a copy (:class:`HostBuffer`), and the
register of live buffers that tells whether a pointer lies inside one (:func:`in_host_buffer`:
memory a save plan may point into)."""
from __future__ import annotations

import bisect
import ctypes
import threading
from typing import List, Tuple

from . import _lib



class HostBuffer:
    """Host memory the daemon reads without a copy (``dsckpt_host_alloc``, a memfd).

    Tensors placed in it are handed over by reference, so a save of them costs no copy in
    the trainer; they must stay unchanged until SNAPSHOT. View it with :meth:`numpy`,
    ``torch.frombuffer(buf.ctypes_array(), dtype=...)`` or :func:`dsckpt.torch.host_empty`.
    The memory is freed when the buffer and every view of it are gone.
    """

    def __init__(self, size: int):
        if size <= 0:
            raise ValueError("HostBuffer size must be positive")
        ptr = _lib.lib().dsckpt_host_alloc(int(size))
        if not ptr:
            raise MemoryError(f"dsckpt_host_alloc({size}) failed")
        self.ptr: int = ptr
        self.size = int(size)
        with _host_lock:
            bisect.insort(_host_blocks, (ptr, ptr + self.size))

    def ctypes_array(self) -> ctypes.Array:
        """The bytes as a ctypes array (buffer protocol). The array, and every numpy or
        torch view made from it, keeps this buffer (and so the memory) alive."""
        if not self.ptr:
            raise ValueError("HostBuffer was freed")
        array = (ctypes.c_uint8 * self.size).from_address(self.ptr)
        array._owner = self
        return array

    def numpy(self, dtype="uint8"):
        """A writable numpy view of the whole buffer with ``dtype``."""
        import numpy as np
        return np.frombuffer(self.ctypes_array(), dtype=dtype)

    def __len__(self) -> int:
        return self.size

    def __del__(self) -> None:
        if getattr(self, "ptr", None) and _lib is not None:
            with _host_lock:
                _host_blocks.remove((self.ptr, self.ptr + self.size))
            _lib.lib().dsckpt_host_free(self.ptr)
            self.ptr = 0


_host_lock = threading.Lock()
_host_blocks: List[Tuple[int, int]] = []  # (start, end) of every live HostBuffer, sorted


def in_host_buffer(ptr: int, nbytes: int) -> bool:
    """Whether [ptr, ptr + nbytes) lies inside one live :class:`HostBuffer` (memory a save
    plan may point into)."""
    with _host_lock:
        i = bisect.bisect_right(_host_blocks, (ptr, float("inf"))) - 1
        return i >= 0 and ptr + nbytes <= _host_blocks[i][1]
