"""_cargs.py — Python values as libdsckpt's C arguments: strings, timeouts, tensor records.

:mod:`dsckpt.core` hands these to the library: a str or path as NUL-free bytes, seconds as
milliseconds, and ``(name, dtype, shape, ptr, nbytes)`` tensors packed once as an array of
``dsckpt_tensor_t`` (:class:`PackedTensors`), whose names and shapes live in buffers the
packing keeps alive.
"""
from __future__ import annotations

import ctypes
import os
import struct
from typing import Dict, Iterable, Optional, Sequence, Tuple, Union

from .errors import Errno, error_for

# One tensor for Save.add_tensors: (name, safetensors dtype, shape, address, nbytes).
TensorSpec = Tuple[str, str, Sequence[int], int, int]

# dsckpt_tensor_t with the platform's alignment: name, dtype, shape, ndim, ptr, nbytes.
_TENSOR_T = "PPPiPN"
# The dtype names as C strings that live as long as the module (their addresses are reused).
_DTYPE_CSTR: Dict[str, ctypes.Array] = {}


def _timeout_ms(timeout: Optional[float]) -> int:
    """Seconds (None: forever) as the library's milliseconds (-1: forever)."""
    if timeout is None or timeout < 0:
        return -1
    return min(int(timeout * 1000), 2**31 - 1)


def _encode(s: Union[str, bytes, "os.PathLike[str]"], what: str) -> bytes:
    """A str or path as UTF-8 bytes for the C API (NUL bytes are refused here)."""
    b = os.fsencode(s) if not isinstance(s, bytes) else s
    if b"\0" in b:
        raise error_for(Errno.EINVAL, "EINVAL", f"{what} contains a NUL byte")
    return b


def _dtype_cstr(dtype: str) -> int:
    """Address of a NUL-terminated copy of a dtype name, made once per name."""
    buf = _DTYPE_CSTR.get(dtype)
    if buf is None:
        buf = _DTYPE_CSTR.setdefault(dtype, ctypes.create_string_buffer(
            _encode(dtype, "dtype")))
    return ctypes.addressof(buf)


class PackedTensors:
    """Tensors as an array of dsckpt_tensor_t, packed once and handed to the library as is
    (a save that adds the same tensors every time skips the packing): ``count`` records in
    ``records``, whose names and shapes live in the buffers ``keep`` holds."""

    __slots__ = ("count", "records", "keep")

    def __init__(self, count: int, records: ctypes.Array, keep: tuple):
        self.count = count
        self.records = records
        self.keep = keep


def pack_tensors(tensors: Iterable[TensorSpec]) -> Optional[PackedTensors]:
    """``(name, dtype, shape, ptr, nbytes)`` tensors as dsckpt_tensor_t records, or None when
    there are none. Names with a NUL byte are refused (InvalidArgument)."""
    names = bytearray()
    dims: list = []
    spans = []
    for name, dtype, shape, ptr, nbytes in tensors:
        b = name.encode() if isinstance(name, str) else bytes(name)
        if b"\0" in b:
            raise error_for(Errno.EINVAL, "EINVAL", "tensor name contains a NUL byte")
        spans.append((len(names), _dtype_cstr(dtype), len(dims), len(shape), ptr, nbytes))
        names += b
        names.append(0)
        dims.extend(shape)
    if not spans:
        return None
    name_buf = ctypes.create_string_buffer(bytes(names), len(names))
    dim_buf = (ctypes.c_int64 * max(len(dims), 1))(*dims)
    name_at, dim_at = ctypes.addressof(name_buf), ctypes.addressof(dim_buf)
    flat = []
    for name_off, dtype_at, dim_off, ndim, ptr, nbytes in spans:
        flat += (name_at + name_off, dtype_at, dim_at + 8 * dim_off, ndim, ptr or 0,
                 int(nbytes))
    packed = struct.pack(_TENSOR_T * len(spans), *flat)
    records = ctypes.create_string_buffer(packed, len(packed))
    return PackedTensors(len(spans), records, (name_buf, dim_buf))


# numpy dtype.str (without byte order) → safetensors dtype.
NUMPY_DTYPES = {
    "f8": "F64", "f4": "F32", "f2": "F16", "i8": "I64", "i4": "I32", "i2": "I16",
    "i1": "I8", "u8": "U64", "u4": "U32", "u2": "U16", "u1": "U8", "b1": "BOOL",
}
