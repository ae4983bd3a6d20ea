"""dsckpt._tree, the pickle-free encoding of a checkpoint's structure and plain values, and
dsckpt._blob's version 3 around it: every value type round-trips exactly (C and Python
encoders agreeing byte for byte), and malformed input of every kind (truncated, nested too
deep, lengths beyond the input, unknown tags, colliding keys, bombs) raises ValueError
instead of crashing, hanging or building anything else."""
import collections
import math
import random
import struct
import zlib

import pytest
import torch

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
