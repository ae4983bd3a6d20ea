"""dsckpt._files — the files dsckptd writes, read without the daemon: safetensors files as
CPU tensors (one storage each, or all in one buffer read by several threads at once, pinned
for a fast copy to a GPU) and ``.meta`` blob files, and the dtype names they share with torch.
:mod:`dsckpt.torch` re-exports all of it.

Every tensor read is checked against the XXH3-64 checksum dsckptd recorded for it in the
header's ``__metadata__`` (``dsckpt.xxh3.<name>``, 16 lowercase hex digits, seed 0), as the
daemon checks what it loads: bytes that differ raise :class:`dsckpt.LoadFailed` (cause
``ECHECKSUM``) naming the tensor and the file, and so does a checksum that cannot be read (not
16 hex digits, one for a tensor the file lacks, a tensor without one where others have one).
A file with no checksum at all (written by another tool) loads unchecked, with a
:class:`dsckpt.UncheckedLoad` warning that says so.
"""
from __future__ import annotations

import gc
import json
import os
import re
import struct
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Tuple

import torch

from . import _xxh3
from .errors import Errno, UncheckedLoad, error_for

# torch dtype ↔ safetensors dtype name; the optional ones only where this torch has them.
DTYPES: Dict[torch.dtype, str] = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
    torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
    torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
}
for _attr, _name in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2"),
                     ("uint16", "U16"), ("uint32", "U32"), ("uint64", "U64")):
    if isinstance(getattr(torch, _attr, None), torch.dtype):
        DTYPES[getattr(torch, _attr)] = _name
ST_DTYPES: Dict[str, torch.dtype] = {v: k for k, v in DTYPES.items()}
_SIZES: Dict[torch.dtype, int] = {dt: torch.empty(0, dtype=dt).element_size() for dt in DTYPES}


READ_PIECE = 64 << 20  # bytes one thread reads at a time into the one buffer
READ_THREADS = 8


KEY_TENSOR = "dsckpt.xxh3."  # + a tensor's name (format/format.h's CHECKSUM_KEY_TENSOR)
KEY_DATA = "dsckpt.data_xxh3"  # the whole data region (CHECKSUM_KEY_DATA)
_HEX16 = re.compile(r"[0-9a-f]{16}")


def _bad_checksum(path: str, what: str) -> Exception:
    """The error of a tensor whose bytes or checksum are wrong: LoadFailed, cause ECHECKSUM,
    as a load through the daemon raises it."""
    return error_for(Errno.EFAILED, "EFAILED", f"{path}: {what}", Errno.ECHECKSUM, load=True)


def _checksums(path: str, meta: dict, names: Dict[str, dict]) -> Optional[Dict[str, int]]:
    """Each tensor's recorded checksum, None for a file without any; raises where one that is
    there cannot be read (format/st_parse.c's rules). names: the header's tensors, by name."""
    sums: Dict[str, int] = {}
    for key, value in meta.items():
        if not key.startswith(KEY_TENSOR):
            continue
        name = key[len(KEY_TENSOR):]
        if name not in names:
            raise _bad_checksum(path, f"__metadata__ has {key}, the checksum of tensor "
                                      f"'{name}', but there is no such tensor")
        if not isinstance(value, str) or not _HEX16.fullmatch(value):
            raise _bad_checksum(path, f"tensor '{name}': checksum {value!r} in __metadata__ "
                                      "is not 16 lowercase hex digits")
        sums[name] = int(value, 16)
    if not sums and KEY_DATA not in meta:
        return None
    lacking = [n for n in names if n not in sums]
    if lacking:
        raise _bad_checksum(path, f"tensor '{lacking[0]}' has no checksum in __metadata__, "
                                  "where others have one")
    if not isinstance(meta.get(KEY_DATA), str) or not _HEX16.fullmatch(meta[KEY_DATA]):
        raise _bad_checksum(path, f"data region: checksum {meta.get(KEY_DATA)!r} in "
                                  f"__metadata__ {KEY_DATA} is missing or not 16 lowercase "
                                  "hex digits")
    return sums


def _header(f, path: str) -> Tuple[int, List[Tuple[str, dict]], Optional[Dict[str, int]]]:
    """Where the data starts, the tensors in file order (name, header entry) and their
    checksums (None for a file without any)."""
    raw = f.read(8)
    if len(raw) != 8:
        raise ValueError(f"{path}: not a safetensors file (shorter than 8 bytes)")
    (hlen,) = struct.unpack("<Q", raw)
    header = _json(f.read(hlen))
    meta = header.pop("__metadata__", None) or {}
    for name, info in header.items():
        if ST_DTYPES.get(info["dtype"]) is None:
            raise ValueError(f"{path}: tensor {name}: dtype {info['dtype']} unknown to "
                             f"torch {torch.__version__}")
    sums = _checksums(path, meta, header)
    return 8 + hlen, sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]), sums


_gc_lock = threading.Lock()
_gc_paused = 0  # _json calls under way that paused the collector


def _json(raw: bytes):
    """json.loads of a header, the cyclic garbage collector paused meanwhile: the thousands
    of dicts and lists a model's header makes would otherwise start full collections of a
    trainer's heap (tens of ms each, as much as the parse itself many times over); nothing
    the parse makes is garbage."""
    global _gc_paused
    with _gc_lock:
        pause = _gc_paused > 0 or gc.isenabled()  # else the caller's choice: left alone
        if pause:
            _gc_paused += 1
            gc.disable()
    if not pause:
        return json.loads(raw)
    try:
        return json.loads(raw)
    finally:
        with _gc_lock:
            _gc_paused -= 1
            if _gc_paused == 0:
                gc.enable()


def _unchecked(path: str) -> None:
    """Warns that a file without checksums was loaded unchecked (once per file and caller)."""
    warnings.warn(f"{path} has no dsckpt checksums (not written by dsckptd): its tensors "
                  "were loaded unchecked", UncheckedLoad, stacklevel=4)


def _verify(path: str, name: str, view: memoryview, want: int) -> None:
    """Raises LoadFailed (cause ECHECKSUM) unless view's XXH3-64 is want."""
    got = _xxh3.digest(view)
    if got != want:
        raise _bad_checksum(path, f"tensor '{name}': checksum mismatch (file says "
                                  f"{want:016x}, data hashes to {got:016x})")


def read_header(path: str) -> Dict[str, Tuple[str, List[int]]]:
    """The tensors of a safetensors file without their data: name → (safetensors dtype,
    shape), in file order."""
    with open(path, "rb") as f:
        return header_of(f, path)


def header_of(f, path: str) -> Dict[str, Tuple[str, List[int]]]:
    """read_header of the file open as f (at its start)."""
    _, tensors, _ = _header(f, path)
    return {name: (info["dtype"], info["shape"]) for name, info in tensors}


def read_safetensors(path: str) -> Dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, as CPU tensors (read in file order, each checked
    against its checksum)."""
    with open(path, "rb") as f:
        start, tensors, sums = _header(f, path)
        out = {}
        for name, info in tensors:
            begin, end = info["data_offsets"]
            buf = torch.empty(end - begin, dtype=torch.uint8)
            view = memoryview(buf.numpy())
            f.seek(start + begin)
            if end > begin and f.readinto(view) != end - begin:
                raise ValueError(f"{path}: tensor {name} is truncated")
            if sums is not None:
                _verify(path, name, view, sums[name])
            out[name] = buf.view(ST_DTYPES[info["dtype"]]).reshape(info["shape"])
    if sums is None:
        _unchecked(path)
    return out


def _read_into(fd: int, view: memoryview, offset: int, path: str) -> None:
    """Fills view from fd at offset (os.preadv, retried until whole)."""
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise ValueError(f"{path}: truncated at byte {offset + done}")
        done += n


def _typed(buf: torch.Tensor, begin: int, end: int, dtype: torch.dtype,
           shape) -> torch.Tensor:
    """Bytes [begin, end) of the uint8 buffer as a tensor of dtype and shape: a view where the
    offset suits the dtype, else a copy (safetensors packs tensors without alignment)."""
    raw = buf[begin:end]
    if begin % _SIZES[dtype]:
        raw = raw.clone()
    return raw.view(dtype).reshape(shape)


def read_safetensors_buffer(path: str, pin: bool = False, threads: int = READ_THREADS,
                            piece: int = READ_PIECE) -> Tuple[torch.Tensor, list]:
    """The whole data region of a safetensors file in one buffer (pinned when asked, for one
    fast copy to a GPU), read by several threads at once (piece bytes at a time), every
    tensor checked against its checksum by the same threads, and its tensors as (name,
    begin, end, dtype, shape) in file order."""
    with open(path, "rb") as f:
        start, tensors, sums = _header(f, path)
        size = max((info["data_offsets"][1] for _, info in tensors), default=0)
        buf = torch.empty(size, dtype=torch.uint8, pin_memory=pin)
        mem = memoryview(buf.numpy()) if size else memoryview(b"")
        pieces = [(off, min(piece, size - off)) for off in range(0, size, piece)]
        fd = f.fileno()
        with ThreadPoolExecutor(max(1, min(threads, len(pieces)))) as pool:
            for _ in pool.map(lambda p: _read_into(fd, mem[p[0]:p[0] + p[1]], start + p[0],
                                                   path), pieces):
                pass
            if sums is not None:
                for _ in pool.map(lambda t: _verify(path, t[0], mem[slice(*t[1]["data_offsets"])],
                                                    sums[t[0]]), tensors):
                    pass
    if sums is None:
        _unchecked(path)
    entries = [(name, info["data_offsets"][0], info["data_offsets"][1],
                ST_DTYPES[info["dtype"]], info["shape"]) for name, info in tensors]
    return buf, entries


def tensors_of(buf: torch.Tensor, entries: list) -> Dict[str, torch.Tensor]:
    """The tensors read_safetensors_buffer described, from buf or a copy of it elsewhere."""
    return {name: _typed(buf, b, e, dtype, shape) for name, b, e, dtype, shape in entries}


def read_safetensors_to(path: str, device: torch.device) -> Dict[str, torch.Tensor]:
    """Every tensor of a safetensors file on device (a GPU): the data region read by several
    threads into one pinned buffer, copied to the device at once, the tensors views of it."""
    buf, entries = read_safetensors_buffer(path, pin=True)
    return tensors_of(buf.to(device, non_blocking=True), entries)


def read_meta(path: str) -> Dict[str, bytes]:
    """The blobs of a .meta file (a msgpack map of str → bin, as the daemon writes it)."""
    with open(path, "rb") as f:
        data = f.read()
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        if pos + n > len(data):
            raise ValueError(f"{path}: truncated msgpack")
        pos += n
        return data[pos - n:pos]

    def length(fix: Tuple[int, int], sized: Dict[int, str]) -> int:
        tag = take(1)[0]
        if fix[0] <= tag <= fix[1]:
            return tag - fix[0]
        if tag not in sized:
            raise ValueError(f"{path}: unexpected msgpack byte 0x{tag:02x}")
        fmt = sized[tag]
        return struct.unpack(fmt, take(struct.calcsize(fmt)))[0]

    blobs = {}
    for _ in range(length((0x80, 0x8f), {0xde: ">H", 0xdf: ">I"})):
        key = take(length((0xa0, 0xbf), {0xd9: ">B", 0xda: ">H", 0xdb: ">I"}))
        blobs[key.decode()] = take(length((1, 0), {0xc4: ">B", 0xc5: ">H", 0xc6: ">I"}))
    return blobs
