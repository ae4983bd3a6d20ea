"""dsckpt.dcp.meta — DCP's Metadata as blob ``dcp.metadata``, without pickle.

The blob is ``MAGIC``, a u32 version (1), a u32 length and a JSON header ``{"pickled": [type
names]}``, a u32 length and a :mod:`dsckpt._tree` of the Metadata's plain form, then the
pickled section (empty unless the planner's ``planner_data`` holds values the tree cannot).
The plain form is a dict: ``state_dict_metadata`` (fqn → ``["tensor", properties, size,
[[offsets, sizes], ...]]`` or ``["bytes"]``, properties a dict of dtype, layout and memory
format by name, requires_grad and pin_memory), ``planner_data``, ``storage_data`` (a list of
``[fqn, offset, index, file, name, kind]``: a MetadataIndex and its :class:`Location`),
``storage_meta`` (None or a dict of checkpoint_id, save_id, load_id, modules) and ``version``.
:func:`load` checks every field's type and builds DCP's dataclasses from it; malformed input
raises ValueError, a pickled section (or an older tag's blob, a pickle whole) raises
:class:`dsckpt.PickleRefused` unless ``weights_only=False``, and so does an object of a class
not allowed (:func:`dsckpt.add_safe_types`) in ``planner_data``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pickle
import struct
from typing import Any, Dict, List

import torch
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata,
                                                   Metadata, MetadataIndex,
                                                   TensorProperties, TensorStorageMetadata)

from .. import _tree
from ..errors import PickleRefused
from .layout import Location

MAGIC = b"\x00dsckpt.dcp\x00"  # a pickle starts with 0x80: older tags never match
VERSION = 1
KINDS = ("tensor", "bytes", "pickled")
_U32 = struct.Struct("<I")
_LAYOUTS = {str(v): v for v in vars(torch).values() if isinstance(v, torch.layout)}
_FORMATS = {str(v): v for v in vars(torch).values() if isinstance(v, torch.memory_format)}
_FIELDS = {f.name for f in dataclasses.fields(Metadata)}


def _plain(md: Metadata) -> Dict[str, Any]:
    """md as plain values (see the module docstring)."""
    sdm = {}
    for fqn, m in md.state_dict_metadata.items():
        if isinstance(m, BytesStorageMetadata):
            sdm[fqn] = ["bytes"]
            continue
        p = m.properties
        sdm[fqn] = ["tensor", {"dtype": p.dtype, "layout": str(p.layout),
                               "requires_grad": p.requires_grad,
                               "memory_format": str(p.memory_format),
                               "pin_memory": p.pin_memory},
                    torch.Size(m.size), [[torch.Size(c.offsets), torch.Size(c.sizes)]
                                         for c in m.chunks]]
    storage = [[i.fqn, None if i.offset is None else torch.Size(i.offset), i.index,
                loc.file, loc.name, loc.kind] for i, loc in (md.storage_data or {}).items()]
    meta = getattr(md, "storage_meta", None)
    return {"state_dict_metadata": sdm, "planner_data": md.planner_data,
            "storage_data": storage, "version": getattr(md, "version", None),
            "storage_meta": None if meta is None else {
                "checkpoint_id": None if meta.checkpoint_id is None
                else os.fspath(meta.checkpoint_id),
                "save_id": meta.save_id, "load_id": meta.load_id,
                "modules": list(getattr(meta, "modules", []) or [])}}


def dump(md: Metadata) -> bytes:
    """The blob of md."""
    opaque: List[Any] = []
    tree = _tree.encode(_plain(md), opaque=opaque)
    head = json.dumps({"pickled": sorted({_tree.type_name(type(o)) for o in opaque})}).encode()
    return b"".join([MAGIC, _U32.pack(VERSION), _U32.pack(len(head)), head,
                     _U32.pack(len(tree)), tree,
                     pickle.dumps(opaque, protocol=4) if opaque else b""])


def load(blob: bytes, where: str, weights_only: bool = True) -> Metadata:
    """DCP's Metadata from a blob of :func:`dump` (or, with ``weights_only=False``, a pickled
    one of an older dsckpt)."""
    if not blob.startswith(MAGIC):
        if weights_only:
            raise PickleRefused(f"{where}: DCP's metadata there is a pickle (written by dsckpt "
                                "before it encoded it), and unpickling runs whatever code "
                                "the checkpoint's author put in it. " + PickleRefused.HOW)
        md = pickle.loads(blob)
        if not isinstance(md, Metadata):
            raise ValueError(f"{where}: not DCP's Metadata")
        return md
    try:
        at = len(MAGIC)
        (version,) = _U32.unpack_from(blob, at)
        if version != VERSION:
            raise ValueError(f"version {version}; this dsckpt reads {VERSION}")
        (n,) = _U32.unpack_from(blob, at + 4)
        head = json.loads(blob[at + 8:at + 8 + n])
        at += 8 + n
        (m,) = _U32.unpack_from(blob, at)
        if m > len(blob) - at - 4 or not isinstance(head, dict) \
                or not isinstance(head.get("pickled"), list):
            raise ValueError("a truncated tree or a header without its pickled types")
        tree, pickled = blob[at + 4:at + 4 + m], blob[at + 4 + m:]
    except (struct.error, ValueError, RecursionError) as e:
        raise ValueError(f"{where}: malformed dcp.metadata blob: {e}") from None
    if pickled and weights_only:
        raise PickleRefused(f"{where}: DCP's planner_data there holds values that load only by "
                            f"unpickling ({', '.join(map(str, head['pickled']))}), and "
                            "unpickling runs whatever code the checkpoint's author put in it. "
                            + PickleRefused.HOW)
    try:
        opaque = pickle.loads(pickled) if pickled else None
        return _metadata(_tree.decode(tree, opaque=opaque, trusted=not weights_only))
    except (_tree.Malformed, TypeError, ValueError, KeyError, IndexError) as e:
        raise ValueError(f"{where}: malformed dcp.metadata: {e!r}") from None


def _want(ok: bool, what: Any) -> None:
    """Raises ValueError naming what unless ok."""
    if not ok:
        raise ValueError(f"unexpected {what!r}")


def _size(v: Any) -> torch.Size:
    """A torch.Size of non-negative entries."""
    _want(type(v) is torch.Size and all(x >= 0 for x in v), v)
    return v


def _metadata(d: Any) -> Metadata:
    """The Metadata of a decoded plain form, every field checked."""
    _want(type(d) is dict and type(d["state_dict_metadata"]) is dict
          and type(d["storage_data"]) is list, "form")
    sdm: Dict[str, Any] = {}
    for fqn, m in d["state_dict_metadata"].items():
        _want(type(fqn) is str and type(m) is list and m and m[0] in ("tensor", "bytes"), m)
        if m[0] == "bytes":
            _want(len(m) == 1, m)
            sdm[fqn] = BytesStorageMetadata()
            continue
        _want(len(m) == 4 and type(m[1]) is dict and type(m[3]) is list, m)
        p = m[1]
        _want(type(p["dtype"]) is torch.dtype and p["layout"] in _LAYOUTS
              and p["memory_format"] in _FORMATS and type(p["requires_grad"]) is bool
              and type(p["pin_memory"]) is bool, p)
        chunks = []
        for c in m[3]:
            _want(type(c) is list and len(c) == 2, c)
            chunks.append(ChunkStorageMetadata(offsets=_size(c[0]), sizes=_size(c[1])))
        sdm[fqn] = TensorStorageMetadata(
            properties=TensorProperties(dtype=p["dtype"], layout=_LAYOUTS[p["layout"]],
                                        requires_grad=p["requires_grad"],
                                        memory_format=_FORMATS[p["memory_format"]],
                                        pin_memory=p["pin_memory"]),
            size=_size(m[2]), chunks=chunks)
    storage: Dict[MetadataIndex, Location] = {}
    for row in d["storage_data"]:
        _want(type(row) is list and len(row) == 6, row)
        fqn, offset, index, file, name, kind = row
        _want(type(fqn) is str and (offset is None or type(offset) is torch.Size)
              and (index is None or type(index) is int) and type(file) is str
              and type(name) is str and kind in KINDS, row)
        storage[MetadataIndex(fqn=fqn, offset=offset, index=index)] = Location(file, name, kind)
    kw: Dict[str, Any] = {"state_dict_metadata": sdm, "planner_data": d["planner_data"],
                          "storage_data": storage}
    if "version" in _FIELDS:
        _want(d["version"] is None or type(d["version"]) is str, d["version"])
        kw["version"] = d["version"]
    if "storage_meta" in _FIELDS and d["storage_meta"] is not None:
        from torch.distributed.checkpoint.metadata import StorageMeta
        s = d["storage_meta"]
        _want(type(s) is dict and all(s[k] is None or type(s[k]) is str
                                      for k in ("checkpoint_id", "save_id", "load_id"))
              and type(s["modules"]) is list and all(type(x) is str for x in s["modules"]), s)
        names = {f.name for f in dataclasses.fields(StorageMeta)}
        kw["storage_meta"] = StorageMeta(**{k: v for k, v in s.items() if k in names})
    return Metadata(**kw)
