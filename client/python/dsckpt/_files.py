"""dsckpt._files — the files dsckptd writes, read without the daemon: safetensors files as
CPU tensors and ``.meta`` blob files, and the dtype names they share with torch.
:mod:`dsckpt.torch` re-exports all of it.
"""
from __future__ import annotations

import json
import struct
from typing import Dict, Tuple

import torch

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


def read_safetensors(path: str) -> Dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, as CPU tensors (read in file order)."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (hlen,) = struct.unpack("<Q", raw)
        header = json.loads(f.read(hlen))
        header.pop("__metadata__", None)
        out = {}
        for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            begin, end = info["data_offsets"]
            dtype = ST_DTYPES.get(info["dtype"])
            if dtype is None:
                raise ValueError(f"{path}: tensor {name}: dtype {info['dtype']} unknown to "
                                 f"torch {torch.__version__}")
            buf = torch.empty(end - begin, dtype=torch.uint8)
            f.seek(8 + hlen + begin)
            if end > begin and f.readinto(memoryview(buf.numpy())) != end - begin:
                raise ValueError(f"{path}: tensor {name} is truncated")
            out[name] = buf.view(dtype).reshape(info["shape"])
        return out


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
