"""dsckpt._shape — the containers of a state dict, recorded once and matched again in C-level
calls, for :mod:`dsckpt._handover`.

A :class:`Shape` records a state dict's containers that hold tensors (dicts, lists, tuples,
walked as ``_flatten`` walks them) level by level, breadth first: each level's container
types and lengths, the keys of its dicts (``str`` and ``int`` only: their ``str()``, the
tensors' names, follows from type and value), the instance attributes of containers that
have some (an ``OrderedDict`` from ``state_dict()`` carries ``_metadata``), and which child
is a tensor, a container that holds tensors, or a leaf (anything else: a number, a
tensor-free ``param_groups`` list, ``_metadata``). :meth:`Shape.match` checks another state
dict against the record with ``map``, ``compress``, ``chain`` and list ``==`` (no Python
bytecode per tensor) and returns its tensors and leaves in record order; where the optional C
module ``dsckpt._match`` is built (``_match.c``; :func:`_lib.match_module` finds it), it does
the same in one pass per level from the shape's plan (:func:`_plan`), the Python code being
the fallback.

The record also yields a frame: a copy of the containers with a :class:`_Slot` at each
tensor (one per entry) and leaf, encoded once as a :mod:`dsckpt._tree` with the slots as its
slots; a later save with the same shape stores that frame as its skeleton and only encodes
its leaves afresh (:class:`Leaves`, which refuses a leaf that hides a tensor, the full walk
naming those, or holds a value of a type the tree cannot hold: the full walk pickles those).
"""
from __future__ import annotations

import collections
import copy
import operator
import struct
from itertools import chain, compress
from typing import Any, Dict, List, Optional, Tuple

import torch

from . import _lib, _tree

_match = _lib.match_module(1)  # the plan's layout, _match.c's MATCH_PLAN_VERSION
# _match.c's FLAG_DICT, FLAG_ATTRS (per container) and CODE_LEAF, CODE_TENSOR, CODE_SUB.
_FLAG_DICT, _FLAG_ATTRS = 1, 2
_CODE_LEAF, _CODE_TENSOR, _CODE_SUB = 0, 1, 2
_values = operator.methodcaller("values")
_BASES = (dict, collections.OrderedDict, list, tuple, object)
# What a container class may not change for its children and copy to be predictable.
_FIXED = ("__slots__", "__iter__", "__len__", "keys", "values", "items", "__setitem__",
          "__reduce__", "__reduce_ex__", "__getstate__", "__setstate__", "__new__")


class Uncacheable(Exception):
    """The state dict holds something a Shape cannot record (the full walk is taken)."""


class _Slot:
    """A place in the frame, encoded as a slot of the tree."""

    __slots__ = ()


def _kind(cls: type) -> Optional[str]:
    """How a container class is handled: "dict" (children: values), "list" (items, rebuilt
    by slice assignment), "tuple", "namedtuple", or None when it cannot be."""
    if cls in (dict, collections.OrderedDict):
        return "dict"
    if cls is list:
        return "list"
    if cls is tuple:
        return "tuple"
    if issubclass(cls, tuple):
        if (hasattr(cls, "_fields") and hasattr(cls, "_make") and cls.__iter__ is tuple.__iter__
                and cls.__reduce_ex__ is object.__reduce_ex__
                and cls.__reduce__ is object.__reduce__):
            return "namedtuple"
        return None
    plain = all(not any(n in vars(k) for n in _FIXED) for k in cls.__mro__ if k not in _BASES)
    if plain and issubclass(cls, dict):
        return "dict"
    if plain and issubclass(cls, list):
        return "list"
    return None


def _bears(obj: Any, memo: Dict[int, bool]) -> bool:
    """Whether a tensor lies inside obj's nested dicts, lists and tuples (or obj is one)."""
    if isinstance(obj, torch.Tensor):
        return True
    if not isinstance(obj, (dict, list, tuple)):
        return False
    known = memo.get(id(obj))
    if known is not None:
        return known
    memo[id(obj)] = False  # a cycle holds nothing new
    found = any([_bears(v, memo) for v in (obj.values() if isinstance(obj, dict) else obj)])
    memo[id(obj)] = found
    return found


class _Level:
    """One level of containers: what a later state dict's level must equal, and masks that
    sort its children."""

    __slots__ = ("types", "lens", "dict_mask", "seq_mask", "values", "keys", "key_types",
                 "attrs", "attr_mask", "attr_lens", "attr_keys", "tensor_mask", "sub_mask",
                 "leaf_mask", "all_tensors", "any_leaf")


def _children(level: List[Any], rec: _Level) -> List[Any]:
    """The children of a level's containers: every dict's values, then every sequence's
    items, each in container order."""
    return list(chain(chain.from_iterable(map(rec.values, compress(level, rec.dict_mask))),
                      chain.from_iterable(compress(level, rec.seq_mask))))


class Shape:
    """The recorded containers of one state dict (see the module docstring). Holds no
    reference to the state dict."""

    def __init__(self, root: Any, entry_of: Dict[int, int], nentries: int):
        """Records root's containers; entry_of maps id(tensor) to its entry of the full walk
        (_flatten), used for the frame. Raises Uncacheable."""
        bearing: Dict[int, bool] = {}
        if isinstance(root, torch.Tensor) or not _bears(root, bearing):
            raise Uncacheable("no container of tensors")
        self.levels: List[_Level] = []
        self.ncontainers = 0
        self.entry_slots = [_Slot() for _ in range(nentries)]
        self.leaf_slots: List[_Slot] = []
        walked = []  # (level, children, attribute dicts) of each level
        seen: set = set()
        level = [root]
        while level:
            seen.update(map(id, level))
            self.ncontainers += len(level)
            if len(seen) != self.ncontainers:  # shared (or cyclic): the frame would split it
                raise Uncacheable("a container met twice")
            rec, children, attrs = self._record(level, bearing)
            self.levels.append(rec)
            walked.append((level, children, attrs))
            level = list(compress(children, rec.sub_mask))
        self.frame = self._frame(walked, entry_of)
        levels = _plan(self.levels) if _match is not None else None
        self.plan = _match.compile(levels) if levels is not None else None

    def _record(self, level: List[Any], bearing: Dict[int, bool]):
        """The _Level of a list of containers, with their children and attribute dicts."""
        rec = _Level()
        rec.types = list(map(type, level))
        kinds = [_kind(t) for t in rec.types]
        if None in kinds:
            raise Uncacheable(f"container class {rec.types[kinds.index(None)]!r}")
        rec.lens = list(map(len, level))
        rec.dict_mask = [k == "dict" for k in kinds]
        rec.seq_mask = [k != "dict" for k in kinds]
        # dict.values is the quicker call; a subclass's own order (OrderedDict) needs its own
        exact = all(t is dict for t in compress(rec.types, rec.dict_mask))
        rec.values = dict.values if exact else _values
        rec.keys = list(chain.from_iterable(compress(level, rec.dict_mask)))
        rec.key_types = list(map(type, rec.keys))
        if not set(rec.key_types) <= {str, int}:
            raise Uncacheable("a key that is neither str nor int")
        rec.attr_mask = [t.__dictoffset__ != 0 for t in rec.types]
        rec.attrs = any(rec.attr_mask)
        attrs = list(map(vars, compress(level, rec.attr_mask)))
        rec.attr_lens = list(map(len, attrs))
        rec.attr_keys = list(chain.from_iterable(attrs))
        children = _children(level, rec)
        rec.tensor_mask = [isinstance(c, torch.Tensor) for c in children]
        rec.sub_mask = [not t and bearing.get(id(c), False) and isinstance(c, (dict, list, tuple))
                        for c, t in zip(children, rec.tensor_mask)]
        rec.leaf_mask = [not (t or s) for t, s in zip(rec.tensor_mask, rec.sub_mask)]
        rec.all_tensors = all(rec.tensor_mask)
        rec.any_leaf = any(rec.leaf_mask)
        return rec, children, attrs

    def _frame(self, walked, entry_of: Dict[int, int]) -> Any:
        """The copy of the containers with slots for tensors and leaves (leaf slots numbered
        in match() order: per level, attribute values, then leaf children)."""
        places = []  # per level: the slot (or None: a container) of each child, attr slots
        for (level, children, attrs), rec in zip(walked, self.levels):
            attr_slots = [self._leaf_slot() for _ in rec.attr_keys]
            kids = [self.entry_slots[entry_of[id(c)]] if t else (self._leaf_slot() if f else None)
                    for c, t, f in zip(children, rec.tensor_mask, rec.leaf_mask)]
            places.append((kids, attr_slots))
        made: Dict[int, Any] = {}  # id(container) → its copy
        for (level, children, attrs), rec, (kids, attr_slots) in reversed(
                list(zip(walked, self.levels, places))):
            kids = [made[id(c)] if k is None else k for c, k in zip(children, kids)]
            at = 0
            order = list(compress(level, rec.dict_mask)) + list(compress(level, rec.seq_mask))
            spans = {}
            for c in order:
                spans[id(c)] = kids[at:at + len(c)]
                at += len(c)
            holders = iter(attr_slots)
            for c, has_attrs in zip(level, rec.attr_mask):
                out = _copy(c, spans[id(c)])
                if has_attrs:
                    own = vars(out)
                    for k in list(own):
                        own[k] = next(holders)
                made[id(c)] = out
        return made[id(walked[0][0][0])]

    def _leaf_slot(self) -> _Slot:
        """A new leaf slot."""
        slot = _Slot()
        self.leaf_slots.append(slot)
        return slot

    def seeds(self) -> List[_Slot]:
        """The frame's memo seeds: entry slots, then leaf slots."""
        return self.entry_slots + self.leaf_slots

    def match(self, root: Any) -> Optional[Tuple[List[torch.Tensor], List[Any]]]:
        """root's tensors (one per tensor place, in record order) and leaves (in frame slot
        order) when its containers are those recorded, else None. Containers must be
        distinct objects, as they were when recorded."""
        if self.plan is not None:
            found = _match.match(self.plan, root)
            if found is not NotImplemented:
                return found
        return self.match_py(root)

    def match_py(self, root: Any) -> Optional[Tuple[List[torch.Tensor], List[Any]]]:
        """match() in Python: the fallback of dsckpt._match, and its tests' oracle."""
        level = [root]
        tensors: List[torch.Tensor] = []
        leaves: List[Any] = []
        containers: List[Any] = []
        for rec in self.levels:
            if list(map(type, level)) != rec.types or list(map(len, level)) != rec.lens:
                return None
            keys = list(chain.from_iterable(compress(level, rec.dict_mask)))
            if keys != rec.keys or list(map(type, keys)) != rec.key_types:
                return None
            if rec.attrs:
                attrs = list(map(vars, compress(level, rec.attr_mask)))
                if list(map(len, attrs)) != rec.attr_lens \
                        or list(chain.from_iterable(attrs)) != rec.attr_keys:
                    return None
                leaves.extend(chain.from_iterable(map(_values, attrs)))
            children = _children(level, rec)
            containers.extend(level)
            if rec.all_tensors:  # the usual last level: skip the masks
                tensors.extend(children)
                level = []
                continue
            tensors.extend(compress(children, rec.tensor_mask))
            if rec.any_leaf:
                leaves.extend(compress(children, rec.leaf_mask))
            level = list(compress(children, rec.sub_mask))
        if level or len(set(map(id, containers))) != self.ncontainers:
            return None
        return tensors, leaves


def _plan(levels: List[_Level]) -> Optional[tuple]:
    """The levels as dsckpt._match.compile reads them (_match.c's opening comment), or None
    when an attribute key is neither str nor int (a key whose == may run code: Python
    matches)."""
    plan = []
    for rec in levels:
        if not set(map(type, rec.attr_keys)) <= {str, int}:
            return None
        codes = [_CODE_TENSOR if t else _CODE_SUB if s else _CODE_LEAF
                 for t, s in zip(rec.tensor_mask, rec.sub_mask)]
        plan.append((tuple(rec.types), _ssizes(rec.lens),
                     bytes(_FLAG_DICT * d | _FLAG_ATTRS * a
                           for d, a in zip(rec.dict_mask, rec.attr_mask)),
                     tuple(rec.keys), _ssizes(rec.attr_lens), tuple(rec.attr_keys),
                     bytes(codes), rec.all_tensors))
    return tuple(plan)


def _ssizes(ns: List[int]) -> bytes:
    """ns as native Py_ssize_t."""
    return struct.pack(f"{len(ns)}n", *ns)


def _copy(c: Any, kids: List[Any]) -> Any:
    """A copy of container c with kids as its children (its values, or its items)."""
    kind = _kind(type(c))
    if kind == "tuple":
        return tuple(kids)
    if kind == "namedtuple":
        return type(c)._make(kids)
    out = copy.copy(c)
    if kind == "dict":
        for k, v in zip(list(c), kids):
            out[k] = v
    else:
        out[:] = kids
    return out


class Leaves:
    """The encoding of a save's leaves (a :mod:`dsckpt._tree` of their list), and (with
    dsckpt._match) a copy of what it encoded, frozen against later changes in place
    (_freeze.c), so that a later save's leaves that would encode to the same bytes take it as
    it is. Raises _tree.Unencodable (TensorLeaf for a tensor) for leaves the tree cannot hold.

    Leaves that changed since the last save's (a scheduler's lr changes at every save) are
    encoded without a copy, as they will likely change again: the copy and the comparison
    would only add to the encoding. They are copied again once they encode as the last save's
    did; never again once they could not be copied (leaves holding objects of allowed classes,
    ``types`` their names, cannot be: they are encoded in Python at every save)."""

    def __init__(self, leaves: List[Any], last: Optional["Leaves"] = None):
        self.frozen = None
        self.freezable = _match is not None and (last is None or last.freezable)
        self.types: set = set()
        self.encoded = _tree.encode_plain(leaves, self.types) if last is not None else None
        if self.freezable and (last is None or self.encoded == last.encoded):
            self.frozen = _match.freeze(leaves)
            self.freezable = self.frozen is not None
        if self.frozen is not None:  # what is kept is the encoding of the copy (plain values)
            self.encoded = _tree.encode_plain(self.frozen[0])
        elif self.encoded is None:
            self.encoded = _tree.encode_plain(leaves, self.types)

    def same(self, leaves: List[Any]) -> bool:
        """Whether leaves would encode to self.encoded."""
        return self.frozen is not None and _match.same_frozen(self.frozen, leaves)
