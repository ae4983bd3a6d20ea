"""dsckpt._blob — the ``dsckpt.torch`` blob of a ``.meta`` file: everything of a state dict
but its tensors' bytes. This module owns the blob's format; ``dsckpt.torch`` writes and
reads it only through these functions.

Version 3 (written) holds no pickle unless the state dict has values of other types. It is
``MAGIC``, a u32 version (3), then five sections, each a u32 length and its bytes:

* ``header``: JSON ``{"torch": writer's torch version, "pickled": [type names]}``, the
  types of the objects in the pickled section (empty: there is none), and ``"safe": [type
  names]`` when the skeleton or leaves hold objects of allowed classes (``_tree``'s tag
  ``O``), so that a load refuses classes it does not allow before reading any tensor;
* ``tables``: JSON ``[views, entries]``, zlib-compressed, each a dict of columns: one view
  per tensor of the file (``name``, ``dtype``, ``shape``, ``stride``, ``offset``, ``group``:
  views of one storage share a group, ``device``), one entry per tensor object (``view``,
  ``param``, ``requires_grad``);
* ``skeleton``: the structure as a :mod:`dsckpt._tree`, whose slot ``i`` is the tensor of
  entry ``i`` and slot ``len(entries) + j`` is ``leaves[j]`` (so a cached skeleton takes
  fresh leaves without being encoded again);
* ``leaves``: a tree of a list of values (empty unless the skeleton is a cached frame, see
  :mod:`dsckpt._handover`);
* ``pickled``: empty, or the pickled list of the skeleton's objects of other types (custom
  classes, namedtuples, tensors of dtypes the file cannot hold, ...), pickled with memo slot
  ``i`` seeded with the tensor of entry ``i``.

:func:`read` refuses a blob that holds a pickle (a v3 blob with a pickled section, or a blob
of version 1 or 2, which were pickles whole) unless the caller passes ``weights_only=False``:
unpickling runs whatever code the checkpoint's author put there, and a blob whose header names
classes not allowed (:func:`dsckpt.add_safe_types`) unless the caller passes
``weights_only=False``. Everything else is decoded without constructing any object but plain
values and objects of allowed classes (see :mod:`dsckpt._tree`, which refuses those not
allowed again while decoding), and malformed input raises ValueError.

Version 2 (read with the opt-in) was a pickled dict of the same tables (pickled), a pickled
skeleton unpickled with its memo seeded (tensors, then leaves) and pickled leaves. Version 1
held ``views`` and ``entries`` inline and a skeleton whose tensors were
``_flatten._TensorRef`` placeholders resolved through ``_flatten._resolving``.
"""
from __future__ import annotations

import io
import json
import pickle
import struct
import zlib
from itertools import chain
from typing import Any, List, Sequence, Tuple

import torch

from . import _tree
from ._files import DTYPES
from ._flatten import _resolving
from .errors import PickleRefused

BLOB = "dsckpt.torch"
VERSION = 3
MAGIC = b"\x00dsckpt.torch\x00"  # a pickle starts with 0x80: old blobs never match
SECTIONS = ("header", "tables", "skeleton", "leaves", "pickled")
MAX_INFLATE = 256  # the most a tables section may grow by when decompressed
EMPTY = _tree.encode([])
_U32 = struct.Struct("<I")
_ST_NAMES = {_tree.DTYPE_NAMES[d] for d in DTYPES}  # dtypes a view may have


VIEW_KEYS = ("name", "dtype", "shape", "stride", "offset", "group", "device")
ENTRY_KEYS = ("view", "param", "requires_grad")


def dump_tables(views: List[dict], entries: List[dict]) -> bytes:
    """The views and entries tables as compressed JSON columns (they repeat themselves, and
    a cached one is sent again with every save)."""
    columns = [{k: [v[k] for v in views] for k in VIEW_KEYS},
               {k: [e[k] for e in entries] for k in ENTRY_KEYS}]
    return zlib.compress(json.dumps(columns, separators=(",", ":")).encode(), 1)


def dump_seeded(obj: Any, seeds: Sequence[Any]) -> bytes:
    """obj pickled with ``seeds[i]`` written as a reference to memo slot ``i`` (the seeds
    must be distinct objects; a reader seeds the same slots, see :func:`_unpickle_seeded`)."""
    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, protocol=4)
    pickler.memo = dict(enumerate(zip(range(len(seeds)), seeds)))  # keys unused
    pickler.dump(obj)
    return buf.getvalue()


def header(pickled_types: Sequence[str] = (), safe_types: Sequence[str] = ()) -> bytes:
    """The header section of a blob whose pickled section holds objects of pickled_types and
    whose trees hold objects of the allowed safe_types."""
    head: dict = {"torch": torch.__version__, "pickled": list(pickled_types)}
    if safe_types:
        head["safe"] = sorted(safe_types)
    return json.dumps(head).encode()


HEADER = header()  # a blob without a pickled section


def dump(tables: bytes, skeleton: bytes, leaves: bytes = EMPTY, pickled: bytes = b"",
         head: bytes = HEADER) -> bytes:
    """The blob of version 3 from its sections."""
    parts = [MAGIC, _U32.pack(VERSION)]
    for section in (head, tables, skeleton, leaves, pickled):
        parts += (_U32.pack(len(section)), section)
    return b"".join(parts)


def dump_state(state_dict: Any, tables: bytes, objects: List[torch.Tensor]) -> bytes:
    """The blob of a walked state dict (objects: each entry's tensor object): the skeleton a
    tree, values of other types in the pickled section."""
    opaque: List[Any] = []
    safe: set = set()
    skeleton = _tree.encode(state_dict, {id(t): i for i, t in enumerate(objects)}, opaque,
                            safe)
    if not opaque:
        return dump(tables, skeleton, head=header((), safe) if safe else HEADER)
    names = sorted({_tree.type_name(type(o)) for o in opaque})
    return dump(tables, skeleton, EMPTY, dump_seeded(opaque, objects), header(names, safe))


def read(blob: bytes, where: str, weights_only: bool = True) -> dict:
    """The sections of a blob (version 3), or with ``weights_only=False`` also an unpickled
    blob of version 1 or 2. Raises PickleRefused for a blob holding a pickle unless opted in,
    ValueError for anything malformed."""
    if not blob.startswith(MAGIC):
        if weights_only:
            raise PickleRefused(f"{where}: its {BLOB} blob is a pickle (written by dsckpt "
                                f"before blob version {VERSION}), and unpickling runs whatever "
                                "code the checkpoint's author put in it. "
                                + PickleRefused.HOW)
        info = pickle.loads(blob)
        if not isinstance(info, dict) or info.get("format") != BLOB \
                or info.get("version") not in (1, 2):
            raise ValueError(f"{where}: not a {BLOB} blob")
        return info
    info, at = {}, len(MAGIC)
    try:
        (info["version"],) = _U32.unpack_from(blob, at)
        at += 4
        if info["version"] != VERSION:
            raise ValueError(f"version {info['version']}; this dsckpt reads {VERSION}")
        for name in SECTIONS:
            (n,) = _U32.unpack_from(blob, at)
            if n > len(blob) - at - 4:
                raise ValueError(f"section {name} of {n} bytes, {len(blob) - at - 4} left")
            info[name] = blob[at + 4:at + 4 + n]
            at += 4 + n
        if at != len(blob):
            raise ValueError(f"{len(blob) - at} bytes after the last section")
        head = json.loads(info["header"])
        if not isinstance(head, dict) or not isinstance(head.get("pickled"), list) \
                or not all(isinstance(n, str) for n in head["pickled"]) \
                or not isinstance(head.get("safe", []), list) \
                or not all(isinstance(n, str) for n in head.get("safe", [])):
            raise ValueError("a header without its lists of pickled and allowed types")
    except (struct.error, ValueError, RecursionError) as e:
        raise ValueError(f"{where}: malformed {BLOB} blob: {e}") from None
    if info["pickled"] and weights_only:
        types = ", ".join(head["pickled"]) or "objects of unnamed types"
        raise PickleRefused(f"{where}: its state dict holds values of types that load only by "
                            f"unpickling ({types}), and unpickling runs whatever code the "
                            "checkpoint's author put in it. " + PickleRefused.HOW)
    refused = [n for n in head.get("safe", []) if not _tree.is_safe(n)]
    if refused and weights_only:
        raise PickleRefused(f"{where}: its state dict holds objects of classes not allowed to "
                            f"load ({', '.join(refused)}). dsckpt.add_safe_types([cls]) allows "
                            "a class you trust; weights_only=False trusts the checkpoint's "
                            "author and imports them as unpickling would.")
    info["trusted"] = not weights_only
    return info


def tables(info: dict) -> Tuple[List[dict], List[dict]]:
    """The views and entries of a blob read by :func:`read` (ValueError when malformed)."""
    if info["version"] == 1:
        return info["views"], info["entries"]
    if info["version"] == 2:
        return pickle.loads(zlib.decompress(info["tables"]))
    try:
        z = zlib.decompressobj()
        raw = z.decompress(info["tables"], MAX_INFLATE * len(info["tables"]) + (1 << 20))
        if z.unconsumed_tail or not z.eof:
            raise ValueError("the tables inflate too far or are truncated")
        views, entries = json.loads(raw)
        return _views(_columns(views, VIEW_KEYS)), _entries(_columns(entries, ENTRY_KEYS),
                                                             len(views["name"]))
    except (zlib.error, ValueError, TypeError, KeyError, RecursionError) as e:
        raise ValueError(f"malformed {BLOB} tables: {e!r}") from None


def _columns(table: dict, keys: Tuple[str, ...]) -> dict:
    """The columns of a table, lists of one length (TypeError or ValueError)."""
    cols = {k: table[k] for k in keys}
    if not all(type(c) is list for c in cols.values()) or \
            len({len(c) for c in cols.values()}) > 1:
        raise ValueError(f"columns {keys} of other types or lengths")
    return cols


def _of(column: list, *types: type) -> bool:
    """Whether every item of a column is of one of types (exactly: True is no int)."""
    return set(map(type, column)) <= set(types)


def _views(c: dict) -> List[dict]:
    """The rows of the views' columns, every field checked (shapes and strides tuples)."""
    shapes, strides = c["shape"], c["stride"]
    dims = list(chain.from_iterable(shapes)) if _of(shapes, list) else None
    if not (_of(c["name"], str) and _of(c["device"], str) and set(c["dtype"]) <= _ST_NAMES
            and _of(c["offset"], int) and _of(c["group"], int)
            and min(c["offset"], default=0) >= 0 and dims is not None and _of(dims, int)
            and min(dims, default=0) >= 0 and _of(strides, list)
            and list(map(len, shapes)) == list(map(len, strides))
            and _of(list(chain.from_iterable(strides)), int)):
        raise ValueError("a view column of other types or values")
    c = dict(c, shape=list(map(tuple, shapes)), stride=list(map(tuple, strides)))
    return [dict(zip(VIEW_KEYS, row)) for row in zip(*(c[k] for k in VIEW_KEYS))]


def _entries(c: dict, nviews: int) -> List[dict]:
    """The rows of the entries' columns, every field checked."""
    if not (_of(c["view"], int) and min(c["view"], default=0) >= 0
            and max(c["view"], default=-1) < nviews and _of(c["param"], bool)
            and _of(c["requires_grad"], bool)):
        raise ValueError("an entry column of other types or values")
    return [dict(zip(ENTRY_KEYS, row)) for row in zip(*(c[k] for k in ENTRY_KEYS))]


def skeleton(info: dict, table: List[torch.Tensor]) -> Any:
    """The state dict, its tensors taken from table (one per entry)."""
    if info["version"] == 1:
        _resolving.table = table
        try:
            return pickle.loads(info["skeleton"])
        finally:
            _resolving.table = None
    if info["version"] == 2:
        return _unpickle_seeded(info["skeleton"], table + pickle.loads(info["leaves"]))
    try:
        leaves = _tree.decode(info["leaves"], trusted=info["trusted"])
        if type(leaves) is not list:
            raise _tree.Malformed("leaves that are not a list")
        opaque = _unpickle_seeded(info["pickled"], table) if info["pickled"] else None
        if opaque is not None and type(opaque) is not list:
            raise _tree.Malformed("a pickled section that is not a list")
        return _tree.decode(info["skeleton"], table + leaves, opaque, info["trusted"])
    except _tree.Malformed as e:
        raise ValueError(f"malformed {BLOB} skeleton: {e}") from None


def _unpickle_seeded(data: bytes, seeds: List[Any]) -> Any:
    """What dump_seeded pickled, its memo seeded with seeds."""
    # C's Unpickler cannot be given a memo (its setter drops a dict), so a first pickle
    # fills memo slots 0..n-1 with the seeds through persistent ids; the memo survives into
    # the second load, the data's, on the same unpickler.
    unpickler = pickle.Unpickler(io.BytesIO(_seed_prefix(len(seeds)) + data))
    unpickler.persistent_load = seeds.__getitem__
    unpickler.load()
    return unpickler.load()


def _seed_prefix(n: int) -> bytes:
    """A pickle that memoizes persistent ids 0..n-1 in slots 0..n-1 and loads None."""
    step = [b"J" + struct.pack("<i", i) + b"Q\x940" for i in range(n)]  # BININT BINPERSID
    return b"\x80\x04" + b"".join(step) + b"N."                        # MEMOIZE POP
