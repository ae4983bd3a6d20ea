"""dsckpt._tree_decode — reads the bytes :mod:`dsckpt._tree` writes, running no code of theirs.

The format, its limits and what a load may build are described in :mod:`dsckpt._tree`, whose
``decode`` is the entry point: it hands this module's :func:`decode` the allowed classes
(name → (class, kind, attribute names)) and how a trusted file's class names are imported.
This module also holds what the encoder shares with it: the limits, the field formats, the
torch dtype names, and which dict keys and set items hash without running code.
"""
from __future__ import annotations

import collections
import struct
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from .errors import PickleRefused

# An allowed class: (class, kind, attribute names), as dsckpt._tree's register holds it.
Allowed = Tuple[type, str, Tuple[str, ...]]

MAX_DEPTH = 100       # nesting the encoder writes and the decoder reads
MAX_WEAK_KEYS = 4096  # dict keys (per tree) of a type whose hash an author can collide
_SMALL = 1 << 60      # ints of smaller magnitude hash to distinct values

_I64, _F64, _U32 = struct.Struct("<q"), struct.Struct("<d"), struct.Struct("<I")
_C128 = struct.Struct("<dd")
_OD = collections.OrderedDict
DTYPE_NAMES: Dict[torch.dtype, str] = {}
for _v in vars(torch).values():
    if isinstance(_v, torch.dtype):
        DTYPE_NAMES.setdefault(_v, str(_v)[len("torch."):])
DTYPES_BY_NAME: Dict[str, torch.dtype] = {n: d for d, n in DTYPE_NAMES.items()}


class Malformed(ValueError):
    """Bytes that are not a tree of this format."""


def type_name(cls: type) -> str:
    """module.qualname of a class (for messages)."""
    return f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', cls.__name__)}"



class _Decoder:
    """One decoding: the bytes, the position, the containers made, slots, opaque objects,
    whether names not allowed may be imported (``trusted``), the allowed classes by name and
    how a name not allowed is imported (``resolve``)."""

    def __init__(self, data: bytes, slots: Optional[List[Any]], opaque: Optional[List[Any]],
                 trusted: bool, allowed: Dict[str, Allowed],
                 resolve: Callable[[str], Allowed]):
        self.data = bytes(data)
        self.end = len(self.data)
        self.pos = 0
        self.made: List[Any] = []
        self.slots = slots
        self.opaque = opaque
        self.trusted = trusted
        self.allowed = allowed
        self.resolve = resolve
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
        if tag == b"O":
            if depth >= MAX_DEPTH:
                raise self.fail(f"nesting deeper than {MAX_DEPTH}")
            return self.safe(depth)
        raise self.fail(f"unknown tag {tag!r}")

    def safe(self, depth: int) -> Any:
        """An object of an allowed class (of any class a trusted file names), numbered as it
        is made: before its state, an Enum or namedtuple after it."""
        start = self.pos - 1
        name = self.text(self.count())
        found = self.allowed.get(name)
        if found is None and not self.trusted:
            raise PickleRefused(f"a value of type {name} (at byte {start}), a class not "
                                "allowed to load: dsckpt.add_safe_types([cls]) allows a class "
                                "you trust, or weights_only=False trusts the checkpoint's "
                                "author (and imports the class as unpickling would)")
        if found is None:
            try:
                found = self.resolve(name)
            except ValueError as e:
                raise self.fail(str(e)) from None
        cls, kind, names = found
        number = len(self.made)
        if kind in ("enum", "namedtuple"):
            self.made.append(None)  # not referable until made
            state = self.value(depth + 1)
            if kind == "enum":
                try:
                    obj = cls(state)
                except (ValueError, TypeError):
                    raise self.fail(f"{name} has no member of value {state!r}") from None
            else:
                if type(state) is not tuple or len(state) != len(names):
                    raise self.fail(f"{name} wants a tuple of its {len(names)} fields, not "
                                    f"{_what(state)}")
                obj = cls._make(state)
            self.made[number] = obj
            return obj
        try:
            obj = cls.__new__(cls)
        except TypeError as e:
            raise self.fail(f"{name} cannot be made without arguments ({e})") from None
        self.made.append(obj)
        state = self.value(depth + 1)
        items = None
        if kind == "dict":
            if type(state) is not tuple or len(state) != 2 or type(state[0]) is not dict:
                raise self.fail(f"{name} wants a tuple of its items and attributes, not "
                                f"{_what(state)}")
            items, state = state
        if type(state) is not dict or not all(type(k) is str for k in state):
            raise self.fail(f"{name} wants a dict of its attributes, not {_what(state)}")
        if kind == "dataclass":
            if set(state) != set(names):
                raise self.fail(f"{name} has fields {sorted(names)}, not {sorted(state)}")
            for k, v in state.items():
                object.__setattr__(obj, k, v)
        else:
            attrs = getattr(obj, "__dict__", None)
            for k, v in state.items():
                if k in names:
                    object.__setattr__(obj, k, v)
                elif attrs is not None:
                    attrs[k] = v
                else:
                    raise self.fail(f"{name} has no attribute {k!r} (its slots: "
                                    f"{', '.join(names)})")
        if items is not None:
            dict.update(obj, items)
        return obj

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


def _what(value: Any) -> str:
    """A value's type and length, for a message."""
    n = f" of {len(value)}" if isinstance(value, (tuple, list, dict)) else ""
    return f"a {type_name(type(value))}{n}"


def decode(data: bytes, slots: Optional[List[Any]], opaque: Optional[List[Any]], trusted: bool,
           allowed: Dict[str, Allowed], resolve: Callable[[str], Allowed]) -> Any:
    """The value encoded in data; slots and opaque supply ``#`` and ``P``, ``allowed`` the
    classes of ``O`` objects, ``resolve`` (when ``trusted``) any other class. Raises Malformed
    for anything but one whole value, PickleRefused for an object of a class not allowed
    unless ``trusted``."""
    dec = _Decoder(data, slots, opaque, trusted, allowed, resolve)
    try:
        out = dec.value(0)
    except (struct.error, OverflowError, MemoryError, RecursionError) as e:
        raise dec.fail(f"{type(e).__name__}: {e}") from None
    if dec.pos != len(dec.data):
        raise dec.fail(f"{len(dec.data) - dec.pos} bytes after the value")
    return out
