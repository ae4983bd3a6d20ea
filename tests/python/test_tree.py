"""dsckpt._tree, the pickle-free encoding of a checkpoint's structure and plain values, and
dsckpt._blob's version 3 around it: every value type round-trips exactly (C and Python
encoders agreeing byte for byte), and malformed input of every kind (truncated, nested too
deep, lengths beyond the input, unknown tags, colliding keys, bombs) raises ValueError
instead of crashing, hanging or building anything else."""
import argparse
import collections
import dataclasses
import enum
import math
import random
import struct
import sys
import types
import zlib

import pytest
import torch

import dsckpt
from dsckpt import _blob, _tree
from dsckpt._tree import Malformed, decode, encode

M = _tree._match
Point = collections.namedtuple("Point", "x y")


def same(a, b):
    """Deep equality with exact types, floats bit for bit and the same aliasing."""
    seen = {}

    def walk(x, y):
        """Compares x with y, y's containers met once each as x's were."""
        assert type(x) is type(y), (x, y)
        if isinstance(x, (list, tuple, dict, set, frozenset)):
            if id(x) in seen:
                assert seen[id(x)] is y
                return
            seen[id(x)] = y
        if type(x) is float:
            assert struct.pack("<d", x) == struct.pack("<d", y) or \
                (math.isnan(x) and math.isnan(y)), (x, y)
        elif type(x) is complex:
            walk(x.real, y.real)
            walk(x.imag, y.imag)
        elif isinstance(x, dict):
            assert list(x) == list(y)
            for k in x:
                walk(x[k], y[k])
            if type(x) is collections.OrderedDict:
                assert vars(x).keys() == vars(y).keys()
                for k in vars(x):
                    walk(vars(x)[k], vars(y)[k])
        elif isinstance(x, (list, tuple)):
            assert len(x) == len(y)
            for i, j in zip(x, y):
                walk(i, j)
        else:
            assert x == y, (x, y)
    walk(a, b)


def od_with_metadata():
    """An OrderedDict as model.state_dict() gives it: with a _metadata attribute."""
    od = collections.OrderedDict([("w", 1), ("b", [2])])
    od._metadata = collections.OrderedDict([("", {"version": 1})])
    return od


LEAVES = {
    "none": None, "true": True, "false": False, "zero": 0, "int": -12345,
    "i64 max": 2 ** 63 - 1, "i64 min": -2 ** 63, "big": 2 ** 64 + 3, "big negative": -2 ** 200,
    "float": 1.5e-3, "inf": math.inf, "-inf": -math.inf, "nan": math.nan, "-0.0": -0.0,
    "complex": complex(1.5, -math.inf), "str": "héllo ✓", "empty str": "",
    "surrogate": "a\ud800b", "bytes": b"\x00\xff" * 3, "empty bytes": b"",
    "list": [1, "a", None], "tuple": (1.0, (2,)), "empty tuple": (), "dict": {"a": 1, 2: "b"},
    "odict": collections.OrderedDict([(3, "x"), ("y", 4)]), "odict attrs": od_with_metadata(),
    "set": {1, "a", (2, 3)}, "frozenset": frozenset({b"x", 1.5}),
    "size": torch.Size([2, 0, 3]), "empty size": torch.Size([]),
    "dtypes": [torch.float32, torch.bfloat16, torch.int8, torch.bool, torch.complex64],
    "devices": [torch.device("cpu"), torch.device("cuda", 3), torch.device("meta")],
    "keys": {None: 1, True: 2, 1.5: 3, (1, "a"): 4, b"k": 5, torch.float16: 6},
    "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0,
                      "amsgrad": False, "foreach": None, "params": list(range(10))}],
}


@pytest.mark.parametrize("name", list(LEAVES))
def test_every_value_type_round_trips(name):
    value = LEAVES[name]
    data = encode(value)
    same(value, decode(data))
    assert encode(decode(data)) == data
    if M is not None:  # C writes the same bytes, or leaves the value to Python
        c = M.encode_tree(value)
        assert c is NotImplemented or c == data
        assert _tree.encode_plain(value) == data


def test_aliasing_and_cycles_are_kept():
    shared = [1, 2]
    cyc = {"k": []}
    cyc["k"].append(cyc)
    t = (shared,)
    value = [shared, shared, t, t, cyc]
    back = decode(_tree.encode_plain(value))
    assert back[0] is back[1] and back[2] is back[3] and back[2][0] is back[0]
    assert back[4]["k"][0] is back[4]
    loop = ([],)
    loop[0].append(loop)  # a tuple inside itself: not a tree, pickled by the blob
    opaque = []
    back = decode(encode(loop, opaque=opaque), opaque=opaque)
    assert opaque == [loop] and back[0][0] is loop
    with pytest.raises(_tree.Unencodable, match="tuple inside itself"):
        encode(loop)
    if M is not None:
        assert M.encode_tree(loop) is NotImplemented


def test_other_types_are_opaque_or_refused():
    opaque = []
    value = {"pt": Point(1, 2), "od": collections.defaultdict(list), "t": torch.ones(1),
             "sub": type("S", (dict,), {})(), "deep": [[[1]]]}
    data = encode(value, opaque=opaque)
    assert [type(o) for o in opaque][:4] == [Point, collections.defaultdict, torch.Tensor,
                                             type(value["sub"])]
    back = decode(data, opaque=opaque)
    assert back["pt"] is opaque[0] and back["deep"] == [[[1]]]
    with pytest.raises(Malformed, match="without the pickles"):
        decode(data)
    with pytest.raises(_tree.TensorLeaf):
        encode([torch.ones(1)])
    with pytest.raises(_tree.Unencodable, match="test_tree.Point"):
        encode([Point(1, 2)])


def random_tree(rng, shared, depth=0):
    """Random values of every kind the C encoder writes, some met in several places."""
    r = rng.random()
    if shared and r < 0.1:
        return rng.choice(shared)
    if depth >= 5 or r < 0.45:
        return rng.choice([0, -1, 2 ** 62, True, False, None, 0.0, -0.0, math.nan, 1e300,
                           "k", "", "ü" * 3, b"", b"\x01", 1j, ()])
    n = rng.randrange(0, 4)
    kind = rng.choice(["dict", "odict", "list", "tuple"])
    if kind in ("dict", "odict"):
        keys = rng.sample(["a", "b", 1, -5, 2.5, (1, "x"), None, b"z"], n)
        out = (dict if kind == "dict" else collections.OrderedDict)(
            (k, random_tree(rng, shared, depth + 1)) for k in keys)
    else:
        items = [random_tree(rng, shared, depth + 1) for _ in range(n)]
        out = items if kind == "list" else tuple(items)
    if rng.random() < 0.2:
        shared.append(out)
    return out


def test_random_trees_c_and_python_agree():
    rng = random.Random(29)
    for _ in range(2000):
        value = [random_tree(rng, []) for _ in range(3)]
        data = encode(value)
        if M is not None:
            assert M.encode_tree(value) == data
        same(value, decode(data))


def test_every_truncation_and_flip_is_an_error_or_a_value():
    """Each prefix of an encoding is refused; each single byte changed gives ValueError or
    some decoded value, never another exception."""
    value = [LEAVES["param_groups"], od_with_metadata(), LEAVES["keys"], LEAVES["size"],
             LEAVES["dtypes"], LEAVES["devices"], LEAVES["set"], 2 ** 70, "s"]
    data = encode(value)
    for n in range(len(data)):
        with pytest.raises(Malformed):
            decode(data[:n])
    with pytest.raises(Malformed, match="bytes after the value"):
        decode(data + b"N")
    rng = random.Random(13)
    for i in range(len(data)):
        flipped = bytearray(data)
        flipped[i] ^= 1 << rng.randrange(8)
        try:
            decode(bytes(flipped))
        except ValueError:
            pass


def test_deep_nesting_is_refused_not_a_crash():
    for tag in (b"l\x01\x00\x00\x00", b"t\x01\x00\x00\x00",
                b"d\x01\x00\x00\x00s\x01\x00\x00\x00k"):
        for depth in (_tree.MAX_DEPTH + 1, 100000):
            with pytest.raises(Malformed, match="nesting deeper"):
                decode(tag * depth + b"N")
    ok = [None]
    for _ in range(_tree.MAX_DEPTH - 1):
        ok = [ok]
    assert encode(ok) == (M.encode_tree(ok) if M is not None else encode(ok))
    decode(encode(ok))
    too_deep = [ok]
    opaque = []
    encode(too_deep, opaque=opaque)  # beyond MAX_DEPTH: pickled, not encoded
    assert len(opaque) == 1
    if M is not None:
        assert M.encode_tree(too_deep) is NotImplemented


@pytest.mark.parametrize("data,why", [
    (b"l\xff\xff\xff\xff", "count of 4294967295"),
    (b"s\xff\xff\xff\x7fabc", "count of"),
    (b"b\x00\x00\x00\x10", "count of"),
    (b"I\xff\xff\xff\xff", "count of"),
    (b"S\xff\xff\xff\x0f", "count of"),
    (b"d\x00\x00\x00\x40", "count of"),
    (b"o\x00\x00\x00\x00\xff\xff\xff\xff", "count of"),
    (b"e\xff\x00\x00\x00", "count of"),
    (b"P\x00\x00\x00\x00\xff\xff\xff\xff", "count of"),
    (b"Z", "unknown tag"),
    (b"", "1 bytes wanted"),
    (b"r\x00\x00\x00\x00", "reference to container 0"),
    (b"t\x01\x00\x00\x00r\x00\x00\x00\x00", "reference to container 0"),
    (b"#\x00\x00\x00\x00", "slot 0 of 0"),
    (b"s\x02\x00\x00\x00\xff\xfe", "not UTF-8"),
    (b"D\x04evil", "dtype 'evil'"),
    (b"D\x03Tensor"[:5], "dtype"),
    (b"V\x05nope!", "device"),
    (b"d\x01\x00\x00\x00l\x00\x00\x00\x00N", "dict key of type builtins.list"),
    (b"e\x01\x00\x00\x00d\x00\x00\x00\x00", "dict key of type builtins.dict"),
])
def test_malformed_inputs_say_what_and_where(data, why):
    with pytest.raises(Malformed, match=why):
        decode(data)


def test_keys_an_author_could_collide_are_bounded():
    """Small ints hash apart; float, tuple and big-int keys (whose hashes an author can
    choose) are limited, so a crafted dict cannot make the load quadratic."""
    n = _tree.MAX_WEAK_KEYS + 1
    floats = b"d" + struct.pack("<I", n) + b"".join(
        b"f" + struct.pack("<d", float(i)) + b"N" for i in range(n))
    with pytest.raises(Malformed, match="dict keys that are not str"):
        decode(floats)
    ints = {i: None for i in range(3 * n)}
    assert decode(encode(ints)) == ints
    big = 2 ** 61 - 1  # hash(k * big) is 0 for every k: all collide
    colliding = b"d" + struct.pack("<I", n) + b"".join(
        b"I" + struct.pack("<I", 16) + (k * big).to_bytes(16, "little", signed=True) + b"N"
        for k in range(1, n + 1))
    with pytest.raises(Malformed, match="dict keys that are not str"):
        decode(colliding)


def blob_of(value):
    """A version 3 blob of value (no tensors)."""
    return _blob.dump(_blob.dump_tables([], []), encode(value))


def test_blob_round_trip_and_malformed_blobs():
    blob = blob_of({"a": [1, 2.5, None]})
    info = _blob.read(blob, "x")
    assert _blob.tables(info) == ([], []) and _blob.skeleton(info, []) == {"a": [1, 2.5, None]}
    for n in range(len(_blob.MAGIC), len(blob)):
        with pytest.raises(ValueError):
            info = _blob.read(blob[:n], "x")
            _blob.tables(info)
            _blob.skeleton(info, [])
    bomb = zlib.compress(b"[" + b" " * (64 << 20) + b"]", 9)  # 64 MiB of spaces
    info = _blob.read(_blob.dump(bomb, encode({})), "x")
    with pytest.raises(ValueError, match="inflate too far"):
        _blob.tables(info)
    view = {"name": "w", "dtype": "float32", "shape": [1], "stride": [1], "offset": 0,
            "group": 0, "device": "cpu"}
    entry = {"view": 0, "param": False, "requires_grad": False}
    good = _blob.dump_tables([view], [entry])
    assert _blob.tables(_blob.read(_blob.dump(good, encode({})), "x")) == \
        ([dict(view, shape=(1,), stride=(1,))], [entry])
    for bad in ({"dtype": "Tensor"}, {"shape": [-1]}, {"shape": 1}, {"stride": [1, 1]},
                {"name": 1}, {"offset": 0.5}, {"group": True}, {"view": 1}, {"param": 0},
                {"device": None}, {"shape": [[1]]}):
        v = {k: bad.get(k, x) for k, x in view.items()}
        e = {k: bad.get(k, x) for k, x in entry.items()}
        info = _blob.read(_blob.dump(_blob.dump_tables([v], [e]), encode({})), "x")
        with pytest.raises(ValueError, match="malformed"):
            _blob.tables(info)
    for tables in ({"a": 1}, [{"name": [1, 2]}, {}], [[], []]):
        info = _blob.read(_blob.dump(zlib.compress(repr(tables).replace("'", '"').encode()),
                                     encode({})), "x")
        with pytest.raises(ValueError, match="malformed"):
            _blob.tables(info)
    with pytest.raises(ValueError, match="version 4"):
        _blob.read(_blob.MAGIC + struct.pack("<I", 4), "x")
    with pytest.raises(ValueError, match="leaves that are not a list"):
        _blob.skeleton(_blob.read(_blob.dump(_blob.dump_tables([], []), encode(1),
                                             encode({})), "x"), [])


# -- objects of allowed classes (tag O, dsckpt.add_safe_types) ------------------------------

@dataclasses.dataclass(frozen=True)
class Frag:
    numel: int
    start: int


class Stage(int, enum.Enum):
    disabled = 0
    gradients = 2


class Color(enum.Enum):
    red = (1, "r")


class Slotted:
    __slots__ = ("scale", "__hidden", "unset")

    def __init__(self, scale):
        self.scale = scale
        self.__hidden = [scale]


class Scaler:
    def __init__(self, scale):
        self.cur_scale = scale
        self.dtype = torch.float16
        self.me = self


class Mixed(Slotted):
    """Slots of a base and a __dict__ of its own."""


class Attrs(dict):
    pass


class Loud:
    """A class whose __init__, __setstate__, __reduce__ and __setattr__ must not run."""

    calls = []

    def __init__(self):
        Loud.calls.append("init")
        self.x = 1

    def __setstate__(self, state):
        Loud.calls.append("setstate")

    def __reduce__(self):
        Loud.calls.append("reduce")
        return (Loud, ())

    def __setattr__(self, k, v):
        Loud.calls.append("setattr")
        object.__setattr__(self, k, v)


def test_allowed_objects_of_every_kind_round_trip(allowlist):
    dsckpt.add_safe_types([Frag, Stage, Color, Point, Slotted, Scaler, Mixed, Attrs, Loud])
    attrs = Attrs(a=1, b=[2])
    attrs.note = "x"
    mixed = Mixed(3.0)
    mixed.extra = {"k": 1}
    loud = Loud()
    Loud.calls.clear()
    frag = Frag(4, 8)
    value = {"frag": frag, "again": frag, "stage": Stage.gradients, "color": Color.red,
             "pt": Point(1, (2, "y")), "slots": Slotted(2.5), "scaler": Scaler(65536.0),
             "mixed": mixed, "attrs": attrs, "loud": loud,
             "ns": argparse.Namespace(lr=0.1, betas=(0.9, 0.95)),
             "sns": types.SimpleNamespace(a=None)}
    names = set()
    data = encode(value, types=names)
    assert names == {_tree.type_name(type(v)) for k, v in value.items() if k != "again"}
    if M is not None:
        assert M.encode_tree(value) is NotImplemented  # the Python encoder writes O
    back = decode(data)
    assert Loud.calls == []  # no __init__, __setstate__, __reduce__ or __setattr__ of its
    assert back["frag"] == frag and back["again"] is back["frag"]
    assert back["stage"] is Stage.gradients and back["color"] is Color.red
    assert type(back["pt"]) is Point and back["pt"] == (1, (2, "y"))
    s = back["slots"]
    assert type(s) is Slotted and s.scale == 2.5 and s._Slotted__hidden == [2.5]
    assert not hasattr(s, "unset")
    sc = back["scaler"]
    assert sc.cur_scale == 65536.0 and sc.dtype is torch.float16 and sc.me is sc
    m = back["mixed"]
    assert type(m) is Mixed and m.scale == 3.0 and m.extra == {"k": 1}
    a = back["attrs"]
    assert type(a) is Attrs and a == {"a": 1, "b": [2]} and a.note == "x"
    assert type(back["loud"]) is Loud and back["loud"].x == 1 and Loud.calls == []
    assert back["ns"] == value["ns"] and back["sns"] == value["sns"]
    assert encode(back) == data


def test_classes_that_cannot_be_allowed(allowlist):
    for cls in (int, list, type("L", (list,), {}), torch.Tensor, str):
        with pytest.raises(TypeError):
            dsckpt.add_safe_types([cls])
    with pytest.raises(TypeError):
        dsckpt.add_safe_types([Frag(1, 2)])
    other = type("Frag", (), {"__module__": __name__, "__qualname__": "Frag"})
    with pytest.raises(ValueError, match="test_tree.Frag"):
        dsckpt.add_safe_types([Frag, other])
    assert Frag not in dsckpt.safe_types()  # nothing of a refused list is allowed
    assert argparse.Namespace in dsckpt.safe_types()


def _named(name, state):
    """A tree of one object of the class called name, with this state."""
    raw = name.encode()
    return b"O" + struct.pack("<I", len(raw)) + raw + encode(state)


def test_a_class_not_allowed_is_refused_without_import(allowlist, tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    (tmp_path / "evil_mod.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "class Thing:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    data = _named("evil_mod.Thing", {"a": 1})
    with pytest.raises(dsckpt.PickleRefused, match=r"evil_mod\.Thing.*add_safe_types.*"
                       "weights_only=False"):
        decode(data)
    with pytest.raises(dsckpt.PickleRefused, match="os.system"):
        decode(encode([1, 2])[:-9] + _named("os.system", {}))  # inside a list
    assert not marker.exists() and "evil_mod" not in sys.modules
    # A trusted file (weights_only=False) names a class that is then imported.
    monkeypatch.delitem(sys.modules, "evil_mod", raising=False)
    back = decode(data, trusted=True)
    assert marker.exists() and type(back).__name__ == "Thing" and back.a == 1
    with pytest.raises(Malformed, match="no class os.nothing_here"):
        decode(_named("os.nothing_here", {}), trusted=True)
    with pytest.raises(Malformed, match="os.system"):
        decode(_named("os.system", {}), trusted=True)  # a function is no class


@pytest.mark.parametrize("name,state,why", [
    ("Frag", {"numel": 1}, r"fields \['numel', 'start'\], not \['numel'\]"),
    ("Frag", {"numel": 1, "start": 2, "evil": 3}, "fields"),
    ("Frag", [1, 2], "wants a dict of its attributes, not a builtins.list of 2"),
    ("Point", (1,), "wants a tuple of its 2 fields, not a builtins.tuple of 1"),
    ("Point", [1, 2], "wants a tuple of its 2 fields"),
    ("Stage", 7, "has no member of value 7"),
    ("Stage", [2], "has no member of value"),
    ("Slotted", {"nope": 1}, "has no attribute 'nope' \\(its slots: scale, _Slotted__hidden"),
    ("Slotted", {1: 2}, "wants a dict of its attributes"),
    ("Attrs", {"a": 1}, "wants a tuple of its items and attributes"),
    ("Attrs", ([1], {}), "wants a tuple of its items and attributes"),
])
def test_a_state_that_does_not_fit_its_class_is_an_error(allowlist, name, state, why):
    dsckpt.add_safe_types([Frag, Point, Stage, Slotted, Attrs])
    with pytest.raises(Malformed, match=why):
        decode(_named(f"{__name__}.{name}", state))


def test_allowed_objects_inside_themselves_and_too_deep(allowlist):
    dsckpt.add_safe_types([Point, Scaler])
    loop = Point([], 1)
    loop.x.append(loop)  # a namedtuple inside itself: pickled, as a tuple would be
    opaque = []
    encode({"l": loop}, opaque=opaque)
    assert opaque == [loop]
    deep = Scaler(1.0)
    for _ in range(_tree.MAX_DEPTH):
        deep = Scaler(deep)
    opaque = []
    decode(encode(deep, opaque=opaque), opaque=opaque)
    assert len(opaque) == 1
    # A reference to a namedtuple from inside its own state is malformed.
    raw = f"{__name__}.Point".encode()
    data = b"O" + struct.pack("<I", len(raw)) + raw + b"t" + struct.pack("<I", 2) + \
        b"r" + struct.pack("<I", 0) + b"N"
    with pytest.raises(Malformed, match="not made"):
        decode(data)
