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
====  ===========================================================================

Lists, tuples, dicts and OrderedDicts are numbered in the order they are first met, so one
object met twice (a cycle through a list or dict included) stays one object. Anything else
(another class, a subclass of these, a tuple inside itself, nesting deeper than MAX_DEPTH)
is not encodable: :func:`encode` puts it in the caller's ``opaque`` list (a tag ``P``; the
caller pickles that list) or raises :class:`Unencodable`.

:func:`decode` builds only the types above and runs no Python code of theirs: dict keys and
set items must be values whose hash runs none (str, bytes, int, float, bool, None, complex,
dtype, device, Size and tuples of those), attributes go straight into an OrderedDict's
``__dict__``. It reads each byte once: it is linear in its input, recursion is bounded by
MAX_DEPTH, every count is checked against the bytes left, and keys whose hash an author can
choose to collide (all but str, bytes and small ints) are limited to MAX_WEAK_KEYS.
Anything malformed raises :class:`Malformed` (a ValueError) naming the byte where it was
found.

Where ``dsckpt._match`` is built, :func:`encode_plain` encodes plain values (no torch types,
slots or opaque objects) in C (``_tree.c``); the bytes are those :func:`encode` writes.
"""
from __future__ import annotations

import collections
import struct
from typing import Any, Dict, List, Optional

import torch

from . import _lib

MAX_DEPTH = 100       # nesting the encoder writes and the decoder reads
MAX_WEAK_KEYS = 4096  # dict keys (per tree) of a type whose hash an author can collide
_SMALL = 1 << 60      # ints of smaller magnitude hash to distinct values

_match = _lib.match_module(1)
_I64, _F64, _U32 = struct.Struct("<q"), struct.Struct("<d"), struct.Struct("<I")
_C128 = struct.Struct("<dd")
_OD = collections.OrderedDict
DTYPE_NAMES: Dict[torch.dtype, str] = {}
for _v in vars(torch).values():
    if isinstance(_v, torch.dtype):
        DTYPE_NAMES.setdefault(_v, str(_v)[len("torch."):])
DTYPES_BY_NAME: Dict[str, torch.dtype] = {n: d for d, n in DTYPE_NAMES.items()}


class Unencodable(Exception):
    """A value the tree cannot hold (``obj``: the value)."""

    def __init__(self, obj: Any, why: str):
        super().__init__(f"{why}: {type_name(type(obj))}")
        self.obj = obj


class TensorLeaf(Unencodable):
    """A tensor where the tree holds no tensors (outside the caller's slots)."""


class Malformed(ValueError):
    """Bytes that are not a tree of this format."""


def type_name(cls: type) -> str:
    """module.qualname of a class (for messages)."""
    return f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', cls.__name__)}"


class _Encoder:
    """One encoding: the output parts, the containers met (id → number), what is in
    progress (tuples), slots and opaque objects."""

    def __init__(self, slots: Optional[Dict[int, int]], opaque: Optional[List[Any]]):
        self.out: List[bytes] = []
        self.met: Dict[int, int] = {}
        self.open: set = set()
        self.keep: List[Any] = []  # keeps the ids of met containers valid
        self.slots = slots or {}
        self.opaque = opaque

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
        else:
            self.other(obj, "a value of another type")

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
           opaque: Optional[List[Any]] = None) -> bytes:
    """obj as a tree: ``slots`` maps id(object) → slot number (written as ``#``); objects the
    tree cannot hold are appended to ``opaque`` (written as ``P``) or, without it, raise
    Unencodable (TensorLeaf for a tensor)."""
    enc = _Encoder(slots, opaque)
    enc.value(obj, 0)
    return b"".join(enc.out)


def encode_plain(obj: Any) -> bytes:
    """encode(obj) without slots or opaque objects, in C where dsckpt._match is built."""
    if _match is not None:
        out = _match.encode_tree(obj)
        if out is not NotImplemented:
            return out
    return encode(obj)


class _Decoder:
    """One decoding: the bytes, the position, the containers made, slots, opaque objects."""

    def __init__(self, data: bytes, slots: Optional[List[Any]], opaque: Optional[List[Any]]):
        self.data = bytes(data)
        self.end = len(self.data)
        self.pos = 0
        self.made: List[Any] = []
        self.slots = slots
        self.opaque = opaque
        self.weak_keys = 0

    def fail(self, what: str) -> Malformed:
        """The error for what was wrong at the current position."""
        return Malformed(f"{what} at byte {self.pos}")

    def take(self, n: int) -> bytes:
        """The next n bytes."""
        pos = self.pos
        if n > self.end - pos:
            raise self.fail(f"{n} bytes wanted, {self.end - pos} left")
        self.pos = pos + n
        return self.data[pos:pos + n]

    def unpack(self, fmt: struct.Struct) -> Any:
        """The next fixed-size field."""
        pos = self.pos
        if fmt.size > self.end - pos:
            raise self.fail(f"{fmt.size} bytes wanted, {self.end - pos} left")
        self.pos = pos + fmt.size
        return fmt.unpack_from(self.data, pos)[0]

    def count(self, least: int = 1) -> int:
        """A u32 count of things each at least `least` bytes long (checked against the
        bytes left)."""
        n = self.unpack(_U32)
        if n * least > self.end - self.pos:
            raise self.fail(f"a count of {n} with {self.end - self.pos} bytes left")
        return n

    def text(self, n: int) -> str:
        """n bytes as a str."""
        try:
            return self.take(n).decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            raise self.fail("a string that is not UTF-8") from None

    def value(self, depth: int) -> Any:
        """The next value (the commonest tags first)."""
        tag = self.take(1)
        if tag == b"s":
            return self.text(self.count())
        if tag == b"#":
            n = self.unpack(_U32)
            if self.slots is None or n >= len(self.slots):
                raise self.fail(f"slot {n} of {len(self.slots or ())}")
            return self.slots[n]
        if tag == b"i":
            return self.unpack(_I64)
        if tag in (b"d", b"o", b"l", b"t"):
            if depth >= MAX_DEPTH:
                raise self.fail(f"nesting deeper than {MAX_DEPTH}")
            return self.container(tag, depth)
        if tag == b"f":
            return self.unpack(_F64)
        if tag == b"N":
            return None
        if tag == b"T":
            return True
        if tag == b"F":
            return False
        if tag == b"r":
            n = self.unpack(_U32)
            if n >= len(self.made) or self.made[n] is None:
                raise self.fail(f"a reference to container {n}, not made (yet)")
            return self.made[n]
        if tag == b"I":
            return int.from_bytes(self.take(self.count()), "little", signed=True)
        if tag == b"b":
            return self.take(self.count())
        if tag == b"c":
            pos = self.pos
            self.take(16)
            return complex(*_C128.unpack_from(self.data, pos))
        if tag in (b"e", b"E"):
            if depth >= MAX_DEPTH:
                raise self.fail(f"nesting deeper than {MAX_DEPTH}")
            n = self.count()
            items = [self.key(depth + 1) for _ in range(n)]
            return set(items) if tag == b"e" else frozenset(items)
        if tag == b"S":
            n = self.count(8)
            return torch.Size(struct.unpack(f"<{n}q", self.take(8 * n)))
        if tag == b"D":
            name = self.text(self.take(1)[0])
            if name not in DTYPES_BY_NAME:
                raise self.fail(f"dtype {name!r}, not one of torch {torch.__version__}'s")
            return DTYPES_BY_NAME[name]
        if tag == b"V":
            name = self.text(self.take(1)[0])
            try:
                return torch.device(name)
            except (RuntimeError, ValueError, TypeError):
                raise self.fail(f"device {name!r}") from None
        if tag == b"P":
            n = self.unpack(_U32)
            type_name = self.text(self.count())
            if self.opaque is None or n >= len(self.opaque):
                raise self.fail(f"pickled object {n} ({type_name}) without the pickles")
            return self.opaque[n]
        raise self.fail(f"unknown tag {tag!r}")

    def key(self, depth: int) -> Any:
        """A dict key: a value whose hash runs no Python code, counted when its hash can be
        chosen to collide."""
        start = self.pos
        k = self.value(depth)
        t = type(k)
        if t is str or t is bytes or (t is int and -_SMALL < k < _SMALL):
            return k
        if not _safe_key(k):
            self.pos = start
            raise self.fail(f"a dict key of type {type_name(t)}")
        self.weak_keys += 1
        if self.weak_keys > MAX_WEAK_KEYS:
            raise self.fail(f"more than {MAX_WEAK_KEYS} dict keys that are not str, bytes or "
                            "small ints")
        return k

    def container(self, tag: bytes, depth: int) -> Any:
        """A list, tuple, dict or OrderedDict (numbered before its items, a tuple after)."""
        number = len(self.made)
        if tag == b"t":
            self.made.append(None)  # not referable until made
            n = self.count()
            out = tuple([self.value(depth + 1) for _ in range(n)])
            self.made[number] = out
            return out
        if tag == b"l":
            out = []
            self.made.append(out)
            n = self.count()
            for _ in range(n):
                out.append(self.value(depth + 1))
            return out
        out = {} if tag == b"d" else _OD()
        self.made.append(out)
        n = self.count(2)
        for _ in range(n):
            k = self.key(depth + 1)
            out[k] = self.value(depth + 1)
        if tag == b"o":
            attrs = vars(out)
            for _ in range(self.count(5)):
                name = self.text(self.count())
                attrs[name] = self.value(depth + 1)
        return out


_KEY_TYPES = frozenset((str, bytes, int, float, bool, complex, type(None), torch.dtype,
                        torch.device, torch.Size))


def _safe_keys(keys) -> bool:
    """Whether every key (of a dict or set) hashes without Python code, as decode wants."""
    types = set(map(type, keys))
    if types <= _KEY_TYPES:
        return True
    return types <= _KEY_TYPES | {tuple} and all(map(_safe_key, keys))


def _safe_key(k: Any) -> bool:
    """Whether hashing k runs no Python code (decoded types only)."""
    t = type(k)
    if t is tuple:
        return all(_safe_key(x) for x in k)
    return t in _KEY_TYPES


def decode(data: bytes, slots: Optional[List[Any]] = None,
           opaque: Optional[List[Any]] = None) -> Any:
    """The value encoded in data; slots and opaque supply ``#`` and ``P``. Raises Malformed
    for anything but one whole value."""
    dec = _Decoder(data, slots, opaque)
    try:
        out = dec.value(0)
    except (struct.error, OverflowError, MemoryError, RecursionError) as e:
        raise dec.fail(f"{type(e).__name__}: {e}") from None
    if dec.pos != len(dec.data):
        raise dec.fail(f"{len(dec.data) - dec.pos} bytes after the value")
    return out
