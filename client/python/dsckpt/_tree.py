"""dsckpt._tree — Python values as a tagged tree of bytes that decodes without running code.

The format (version 1) of what a checkpoint's metadata holds besides its tensors: the
structure of a state dict and its plain values. Each value is a one-byte tag and what
follows it (integers little-endian, ``n`` a u32 count, strings UTF-8):

====  ===========================================================================
tag   value
====  ===========================================================================
N     None
T F   True, False
i     int of 64 bits: i64
I     any other int: n, then n bytes of two's complement
f     float: f64 (inf and nan included, bit for bit)
c     complex: f64 real, f64 imaginary
s     str: n, then n bytes (lone surrogates kept)
b     bytes: n, then n bytes
l t   list, tuple: n, then n values
d     dict: n, then n pairs of key and value
e E   set, frozenset: n, then n values
o     collections.OrderedDict: n pairs, then m and m attributes (name as n + bytes, value)
r     a container met before: n, its number (containers are numbered as first met)
S     torch.Size: n, then n i64
D     torch.dtype: one byte n, then its name (``float32``)
V     torch.device: one byte n, then its name (``cuda:0``)
#     slot n: an object the caller supplies (a tensor of the state dict, a leaf)
P     object n of the pickled section: n, then its type's name as n + bytes
O     an object of an allowed class: its name (module.qualname) as n + bytes, then its
      state as one value (see below)
====  ===========================================================================

Objects of the classes allowed by :func:`add_safe_types` (and :data:`DEFAULT_SAFE_TYPES`) are
written as ``O``, their state by their kind: an Enum member its value, a namedtuple a tuple
of its fields, a dataclass a dict of its fields, a dict subclass a tuple (its items as a
dict, its attributes as a dict), any other object a dict of its attributes (``__slots__``
then ``__dict__``). :func:`decode` finds the class by its name among the allowed ones only:
it imports nothing and calls no ``__reduce__``, ``__setstate__`` or ``__init__``. It makes
the object as ``cls(value)`` (Enum), ``cls._make(fields)`` (namedtuple) or
``cls.__new__(cls)`` and then sets the attributes (``object.__setattr__`` for slots and a
dataclass's fields, ``__dict__`` for others; ``dict.update`` for a dict subclass's items), so
nothing runs but the code of a class the loader chose to trust. A name not allowed raises
:class:`dsckpt.PickleRefused` unless the caller trusts the file (``trusted``: the name is then
imported as pickle would); a state that does not fit its class raises :class:`Malformed`.

Lists, tuples, dicts, OrderedDicts and ``O`` objects are numbered in the order they are
first met, so one object met twice (a cycle through a list, dict or object included) stays
one object. Anything else (another class, a subclass of these, a tuple, Enum member or
namedtuple inside itself, nesting deeper than MAX_DEPTH) is not encodable: :func:`encode`
puts it in the caller's ``opaque`` list (a tag ``P``; the caller pickles that list) or
raises :class:`Unencodable`.

:func:`decode` builds only the types above and runs no Python code of theirs: dict keys and
set items must be values whose hash runs none (str, bytes, int, float, bool, None, complex,
dtype, device, Size and tuples of those), attributes go straight into an OrderedDict's
``__dict__``. It reads each byte once: it is linear in its input, recursion is bounded by
MAX_DEPTH, every count is checked against the bytes left, and keys whose hash an author can
choose to collide (all but str, bytes and small ints) are limited to MAX_WEAK_KEYS.
Anything malformed raises :class:`Malformed` (a ValueError) naming the byte where it was
found.

Where ``dsckpt._match`` is built, :func:`encode_plain` encodes plain values (no torch types,
slots, ``O`` or opaque objects) in C (``_freeze.c``); the bytes are those :func:`encode`
writes. The decoder lives in :mod:`dsckpt._tree_decode`; :func:`decode` hands it the allowed
classes.
"""
from __future__ import annotations

import argparse
import dataclasses
import enum
import importlib
import struct
import types as _types
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

import torch

from . import _lib, _tree_decode
from ._tree_decode import (_C128, _F64, _I64, _OD, _U32, DTYPE_NAMES, DTYPES_BY_NAME, MAX_DEPTH,
                           MAX_WEAK_KEYS, Malformed, _safe_keys, type_name)

_match = _lib.match_module(1)


class Unencodable(Exception):
    """A value the tree cannot hold (``obj``: the value)."""

    def __init__(self, obj: Any, why: str):
        super().__init__(f"{why}: {type_name(type(obj))}")
        self.obj = obj


class TensorLeaf(Unencodable):
    """A tensor where the tree holds no tensors (outside the caller's slots)."""


# The allowed classes (tag O): name → (class, kind, attribute names) and class → (name, kind,
# attribute names); the names are a dataclass's fields or a class's slots.
_SAFE_BY_NAME: Dict[str, Tuple[type, str, Tuple[str, ...]]] = {}
_SAFE_BY_TYPE: Dict[type, Tuple[str, str, Tuple[str, ...]]] = {}
_NOT_OBJECTS = (list, tuple, set, frozenset, int, float, complex, str, bytes, bytearray,
                torch.Tensor, type)


def _slot_names(cls: type) -> Tuple[str, ...]:
    """The slots of cls and its bases, as attribute names (private ones mangled)."""
    names: List[str] = []
    for k in reversed(cls.__mro__):
        slots = vars(k).get("__slots__", ())
        for n in (slots,) if isinstance(slots, str) else slots:
            if n in ("__dict__", "__weakref__"):
                continue
            if n.startswith("__") and not n.endswith("__"):
                n = f"_{k.__name__.lstrip('_')}{n}"
            names.append(n)
    return tuple(dict.fromkeys(names))


def _describe(cls: Any) -> Tuple[str, Tuple[str, ...]]:
    """(kind, attribute names) of a class the tree can hold by name; TypeError if none."""
    if not isinstance(cls, type):
        raise TypeError(f"{cls!r} is not a class")
    if issubclass(cls, enum.Enum):
        return "enum", ()
    if issubclass(cls, tuple) and hasattr(cls, "_fields") and hasattr(cls, "_make"):
        return "namedtuple", tuple(cls._fields)
    if dataclasses.is_dataclass(cls):
        return "dataclass", tuple(f.name for f in dataclasses.fields(cls))
    if issubclass(cls, dict):
        return "dict", _slot_names(cls)
    if issubclass(cls, _NOT_OBJECTS) or cls.__module__ == "builtins":
        raise TypeError(f"{type_name(cls)}: the tree holds objects of this kind only by its own "
                        "tags (or pickled)")
    return "object", _slot_names(cls)



def allow_installed(names: Dict[str, Tuple[str, ...]]) -> List[type]:
    """Allows the classes names lists by module that are installed (a module that does not
    import is passed over, as a name that is not a class) and returns them: an integration's
    known types, allowed when it is used."""
    found: List[type] = []
    for module, attrs in names.items():
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        found += [c for c in (getattr(mod, n, None) for n in attrs) if isinstance(c, type)]
    add_safe_types(found)
    return found

def add_safe_types(classes: Iterable[type]) -> None:
    """Allows objects of these classes in a tree (saved by name and state, loaded without
    unpickling; see the module docstring). Their code (``__new__``, an Enum's lookup, the
    slots' descriptors) is trusted to run at a load. Raises TypeError for what is not such a
    class, ValueError for a name already allowed for another class."""
    described: Dict[str, Tuple[type, str, Tuple[str, ...]]] = {}
    for cls in classes:
        kind, names = _describe(cls)
        name = type_name(cls)
        known = described.get(name) or _SAFE_BY_NAME.get(name)
        if known is not None and known[0] is not cls:
            raise ValueError(f"{name}: another class of this name is allowed already")
        described[name] = (cls, kind, names)
    for name, (cls, kind, names) in described.items():
        _SAFE_BY_NAME[name] = (cls, kind, names)
        _SAFE_BY_TYPE[cls] = (name, kind, names)


def safe_types() -> List[type]:
    """The classes allowed, defaults included."""
    return [cls for cls, _, _ in _SAFE_BY_NAME.values()]


def is_safe(name: str) -> bool:
    """Whether the class of this name is allowed."""
    return name in _SAFE_BY_NAME


# Plain records of attributes, common in hyper-parameters; no code of theirs runs at a load.
DEFAULT_SAFE_TYPES = (argparse.Namespace, _types.SimpleNamespace)
add_safe_types(DEFAULT_SAFE_TYPES)


def _state(obj: Any, kind: str, names: Tuple[str, ...]) -> Any:
    """The state written for an allowed object (see the module docstring)."""
    if kind == "enum":
        return obj._value_
    if kind == "namedtuple":
        return tuple(obj)
    if kind == "dataclass":
        return {n: getattr(obj, n) for n in names}
    attrs = {}
    for n in names:
        try:
            attrs[n] = object.__getattribute__(obj, n)
        except AttributeError:  # an empty slot
            pass
    attrs.update(getattr(obj, "__dict__", None) or {})
    return (dict(dict.items(obj)), attrs) if kind == "dict" else attrs


def _resolve(name: str) -> Tuple[type, str, Tuple[str, ...]]:
    """The class a trusted file names, imported as pickle would (ValueError if none)."""
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for part in parts[i:]:
                obj = getattr(obj, part)
        except AttributeError:
            continue
        if isinstance(obj, type) and type_name(obj) == name:
            try:
                return (obj,) + _describe(obj)
            except TypeError as e:
                raise ValueError(str(e)) from None
    raise ValueError(f"no class {name} can be imported")


class _Encoder:
    """One encoding: the output parts, the containers met (id → number), what is in
    progress (tuples, Enums, namedtuples), slots, opaque objects and the names written as O."""

    def __init__(self, slots: Optional[Dict[int, int]], opaque: Optional[List[Any]],
                 types: Optional[Set[str]]):
        self.out: List[bytes] = []
        self.met: Dict[int, int] = {}
        self.open: set = set()
        self.keep: List[Any] = []  # keeps the ids of met containers valid
        self.slots = slots or {}
        self.opaque = opaque
        self.types = types

    def str_(self, tag: bytes, s: str) -> None:
        """A str (tag s) or attribute name (no tag)."""
        raw = s.encode("utf-8", "surrogatepass")
        self.out.append(tag + _U32.pack(len(raw)) + raw)

    def other(self, obj: Any, why: str) -> None:
        """obj as an opaque object, or Unencodable."""
        if self.opaque is None:
            cls = TensorLeaf if isinstance(obj, torch.Tensor) else Unencodable
            raise cls(obj, why)
        name = type_name(type(obj)).encode("utf-8", "replace")
        self.out.append(b"P" + _U32.pack(len(self.opaque)) + _U32.pack(len(name)) + name)
        self.opaque.append(obj)

    def value(self, obj: Any, depth: int) -> None:
        """Appends obj's encoding."""
        t = type(obj)
        out = self.out
        if obj is None:
            out.append(b"N")
        elif t is bool:
            out.append(b"T" if obj else b"F")
        elif t is int:
            if -(1 << 63) <= obj < (1 << 63):
                out.append(b"i" + _I64.pack(obj))
            else:
                raw = obj.to_bytes((obj.bit_length() + 8) // 8, "little", signed=True)
                out.append(b"I" + _U32.pack(len(raw)) + raw)
        elif t is float:
            out.append(b"f" + _F64.pack(obj))
        elif t is str:
            self.str_(b"s", obj)
        elif id(obj) in self.slots:
            out.append(b"#" + _U32.pack(self.slots[id(obj)]))
        elif t in (list, tuple, dict, _OD):
            self.container(obj, t, depth)
        elif t is bytes:
            out.append(b"b" + _U32.pack(len(obj)) + obj)
        elif t is complex:
            out.append(b"c" + _C128.pack(obj.real, obj.imag))
        elif t is set or t is frozenset:
            if depth >= MAX_DEPTH or not _safe_keys(obj):
                return self.other(obj, "a set too deep or of other items")
            out.append((b"e" if t is set else b"E") + _U32.pack(len(obj)))
            for v in obj:
                self.value(v, depth + 1)
        elif t is torch.Size:
            out.append(b"S" + _U32.pack(len(obj)) + struct.pack(f"<{len(obj)}q", *obj))
        elif t is torch.dtype and obj in DTYPE_NAMES:
            raw = DTYPE_NAMES[obj].encode()
            out.append(b"D" + bytes([len(raw)]) + raw)
        elif t is torch.device:
            raw = str(obj).encode()
            out.append(b"V" + bytes([len(raw)]) + raw)
        elif t in _SAFE_BY_TYPE:
            self.safe(obj, depth)
        else:
            self.other(obj, "a value of another type")

    def safe(self, obj: Any, depth: int) -> None:
        """Appends an allowed object's encoding (or a reference to it)."""
        name, kind, names = _SAFE_BY_TYPE[type(obj)]
        known = self.met.get(id(obj))
        if known is not None:
            if id(obj) in self.open:
                return self.other(obj, "an object inside itself")
            self.out.append(b"r" + _U32.pack(known))
            return None
        if depth >= MAX_DEPTH:
            return self.other(obj, f"nested deeper than {MAX_DEPTH}")
        state = _state(obj, kind, names)
        self.met[id(obj)] = len(self.met)
        self.keep.append(obj)
        if kind in ("enum", "namedtuple"):
            self.open.add(id(obj))
        self.str_(b"O", name)
        self.value(state, depth + 1)
        self.open.discard(id(obj))
        if self.types is not None:
            self.types.add(name)
        return None

    def container(self, obj: Any, t: type, depth: int) -> None:
        """Appends a list's, tuple's, dict's or OrderedDict's encoding (or a reference)."""
        known = self.met.get(id(obj))
        if known is not None:
            if id(obj) in self.open:
                return self.other(obj, "a tuple inside itself")
            self.out.append(b"r" + _U32.pack(known))
            return None
        if depth >= MAX_DEPTH:
            return self.other(obj, f"nested deeper than {MAX_DEPTH}")
        if (t is dict or t is _OD) and not _safe_keys(obj):
            return self.other(obj, "a dict with keys of other types")
        attrs = vars(obj) if t is _OD else None
        self.met[id(obj)] = len(self.met)
        self.keep.append(obj)
        if t is tuple:
            self.open.add(id(obj))
        tag = {list: b"l", tuple: b"t", dict: b"d", _OD: b"o"}[t]
        self.out.append(tag + _U32.pack(len(obj)))
        if t is list or t is tuple:
            for v in obj:
                self.value(v, depth + 1)
        else:
            for k, v in obj.items():
                self.value(k, depth + 1)
                self.value(v, depth + 1)
        if attrs is not None:
            self.out.append(_U32.pack(len(attrs)))
            for k, v in attrs.items():
                if type(k) is not str:
                    raise Unencodable(k, "an attribute name that is not a str")
                self.str_(b"", k)
                self.value(v, depth + 1)
        self.open.discard(id(obj))
        return None


def encode(obj: Any, slots: Optional[Dict[int, int]] = None,
           opaque: Optional[List[Any]] = None, types: Optional[Set[str]] = None) -> bytes:
    """obj as a tree: ``slots`` maps id(object) → slot number (written as ``#``); objects of
    allowed classes are written as ``O`` (their names added to ``types``); objects the tree
    cannot hold are appended to ``opaque`` (written as ``P``) or, without it, raise
    Unencodable (TensorLeaf for a tensor)."""
    enc = _Encoder(slots, opaque, types)
    enc.value(obj, 0)
    return b"".join(enc.out)


def encode_plain(obj: Any, types: Optional[Set[str]] = None) -> bytes:
    """encode(obj) without slots or opaque objects, in C where dsckpt._match is built and obj
    holds plain values only (``types`` as encode's)."""
    if _match is not None:
        out = _match.encode_tree(obj)
        if out is not NotImplemented:
            return out
    return encode(obj, types=types)


def decode(data: bytes, slots: Optional[List[Any]] = None,
           opaque: Optional[List[Any]] = None, trusted: bool = False) -> Any:
    """The value encoded in data; slots and opaque supply ``#`` and ``P``. Raises Malformed
    for anything but one whole value, PickleRefused for an object of a class not allowed
    unless ``trusted`` (see the module docstring)."""
    return _tree_decode.decode(data, slots, opaque, trusted, _SAFE_BY_NAME, _resolve)


__all__ = ["MAX_DEPTH", "MAX_WEAK_KEYS", "DTYPE_NAMES", "DTYPES_BY_NAME", "DEFAULT_SAFE_TYPES",
           "Unencodable", "TensorLeaf", "Malformed", "type_name", "allow_installed",
           "add_safe_types", "safe_types", "is_safe", "encode", "encode_plain", "decode"]
