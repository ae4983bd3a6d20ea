"""dsckpt._blob — the ``dsckpt.torch`` blob of a ``.meta`` file: everything of a state dict
but its tensors' bytes. This module owns the blob's format; ``dsckpt.torch`` writes and
reads it only through these functions.

Version 2 (written) is a pickled dict of plain values and three pickles:

* ``format`` ``"dsckpt.torch"``, ``version`` 2, ``torch`` (the writer's torch version);
* ``tables``: ``(views, entries)``, pickled and zlib-compressed: one view per tensor of the
  file (``name``, ``dtype``, ``shape``, ``stride``, ``offset``, ``group``: views of one
  storage share a group, ``device``), one entry per tensor object (``view``, ``param``,
  ``requires_grad``);
* ``skeleton``: the structure, unpickled with its memo seeded: ``memo[i]`` is the tensor of
  entry ``i``, ``memo[len(entries) + j]`` is ``leaves[j]`` (so a tensor costs the pickle a
  memo reference, and a cached skeleton takes fresh leaves without being pickled again);
* ``leaves``: a pickled list of values (empty unless the skeleton is a cached frame, see
  :mod:`dsckpt._handover`).

Version 1 (still read) held ``views`` and ``entries`` inline and a skeleton whose tensors
were ``_flatten._TensorRef`` placeholders resolved through ``_flatten._resolving``.
"""
from __future__ import annotations

import io
import pickle
import struct
import zlib
from typing import Any, List, Sequence, Tuple

import torch

from ._flatten import _resolving

BLOB = "dsckpt.torch"
VERSION = 2
_EMPTY = pickle.dumps([], protocol=4)


def dump_tables(views: List[dict], entries: List[dict]) -> bytes:
    """The views and entries tables, pickled and compressed (they repeat themselves: about
    a sixth of the size, and a cached one is sent again with every save)."""
    return zlib.compress(pickle.dumps((views, entries), protocol=4), 1)


def dump_seeded(obj: Any, seeds: Sequence[Any]) -> bytes:
    """obj pickled with ``seeds[i]`` written as a reference to memo slot ``i`` (the seeds
    must be distinct objects; a reader seeds the same slots, see :func:`load`)."""
    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, protocol=4)
    pickler.memo = dict(enumerate(zip(range(len(seeds)), seeds)))  # keys unused
    pickler.dump(obj)
    return buf.getvalue()


def dump(tables: bytes, skeleton: bytes, leaves: bytes = _EMPTY) -> bytes:
    """The blob of version 2 from its three pickles."""
    return pickle.dumps({"format": BLOB, "version": VERSION, "torch": torch.__version__,
                         "tables": tables, "skeleton": skeleton, "leaves": leaves},
                        protocol=4)


def read(blob: bytes, where: str) -> dict:
    """The unpickled blob (version 1 or 2); ValueError for anything else."""
    info = pickle.loads(blob)
    if not isinstance(info, dict) or info.get("format") != BLOB \
            or info.get("version") not in (1, VERSION):
        raise ValueError(f"{where}: not a {BLOB} v1 or v{VERSION} blob")
    return info


def tables(info: dict) -> Tuple[List[dict], List[dict]]:
    """The views and entries of a blob read by :func:`read`."""
    if info["version"] == 1:
        return info["views"], info["entries"]
    return pickle.loads(zlib.decompress(info["tables"]))


def skeleton(info: dict, table: List[torch.Tensor]) -> Any:
    """The state dict, its tensors taken from table (one per entry)."""
    if info["version"] == 1:
        _resolving.table = table
        try:
            return pickle.loads(info["skeleton"])
        finally:
            _resolving.table = None
    seeds = table + pickle.loads(info["leaves"])
    # C's Unpickler cannot be given a memo (its setter drops a dict), so a first pickle
    # fills memo slots 0..n-1 with the seeds through persistent ids; the memo survives into
    # the second load, the skeleton's, on the same unpickler.
    unpickler = pickle.Unpickler(io.BytesIO(_seed_prefix(len(seeds)) + info["skeleton"]))
    unpickler.persistent_load = seeds.__getitem__
    unpickler.load()
    return unpickler.load()


def _seed_prefix(n: int) -> bytes:
    """A pickle that memoizes persistent ids 0..n-1 in slots 0..n-1 and loads None."""
    step = [b"J" + struct.pack("<i", i) + b"Q\x940" for i in range(n)]  # BININT BINPERSID
    return b"\x80\x04" + b"".join(step) + b"N."                        # MEMOIZE POP
