"""dsckpt._match's freeze() and same_frozen() (client/python/dsckpt/_freeze.c), which let a
warm save reuse the last encoding of its leaves (a dsckpt._tree): a frozen copy encodes (and
pickles) exactly as what it copied, does not follow later changes in place, and same_frozen
says "same" exactly when the pickles are equal, and then the encodings are too (never when
they differ: that would write stale bytes). test_handover.py saves with it."""
import collections
import copy
import math
import pickle
import random
import resource
import sys

import pytest
import torch

from dsckpt import _shape, _tree

M = _shape._match
pytestmark = pytest.mark.skipif(M is None, reason="dsckpt._match not built: skipped")


def pk(obj):
    """obj as a warm save pickles its leaves."""
    return pickle.dumps(obj, protocol=4)


def leaves_like():
    """A model's _metadata and an optimizer's param_groups, as a warm save's leaves."""
    meta = collections.OrderedDict((f"blocks.{i}", {"version": 1}) for i in range(40))
    groups = [{"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.1,
               "amsgrad": False, "foreach": None, "params": list(range(i, i + 30))}
              for i in (0, 30)]
    return [meta, groups]


def verdict(a, b):
    """same_frozen(freeze(a), b), after checking that the copy pickles and encodes as a
    does, and that b encodes as a does when it is "same"."""
    frozen = M.freeze(a)
    assert frozen is not None
    assert pk(frozen[0]) == pk(a) and _tree.encode(frozen[0]) == _tree.encode(a)
    answer = M.same_frozen(frozen, b)
    assert not answer or _tree.encode(b) == _tree.encode(a)
    return answer


def test_a_copy_is_the_same_and_keeps_its_bytes():
    a = leaves_like()
    before = pk(a)
    frozen = M.freeze(a)
    assert pk(frozen[0]) == before and M.same_frozen(frozen, a)
    assert M.same_frozen(frozen, copy.deepcopy(a))
    a[0]["blocks.3"]["version"] = 2  # in place, in an inner dict the copy does not share
    a[1][1]["params"].append(99)
    assert pk(frozen[0]) == before
    assert not M.same_frozen(frozen, a)


x = [1]
s1 = "ab" * 3
s2 = "".join(["ab"] * 3)
od_moved = collections.OrderedDict([("a", 1), ("b", 2)])
od_moved.move_to_end("a")
od_attr = collections.OrderedDict([("a", 1), ("b", 2)])
od_attr.note = 1

# (what was frozen, what is compared, whether their pickles are equal)
CASES = [
    ("equal copy", {"a": [1, 2.5, "s", b"b", None, True]}, {"a": [1, 2.5, "s", b"b", None, True]},
     True),
    ("int for bool", [True], [1], False),
    ("float for int", [1], [1.0], False),
    ("minus zero", [0.0], [-0.0], False),
    ("nan", [math.nan], [math.nan], True),
    ("big int", [2 ** 100], [2 ** 100 + 1], False),
    ("bytes", [b"xy"], [b"xz"], False),
    ("key order", {"a": 1, "b": 2}, {"b": 2, "a": 1}, False),
    ("ordereddict order", collections.OrderedDict([("a", 1), ("b", 2)]), od_moved, False),
    ("ordereddict with attributes", collections.OrderedDict([("a", 1), ("b", 2)]), od_attr,
     False),
    ("dict for ordereddict", collections.OrderedDict([("a", 1)]), {"a": 1}, False),
    ("list for tuple", [(1, 2)], [[1, 2]], False),
    ("one list twice", [[1], [1]], [x, x], False),
    ("two lists", [x, x], [[1], [1]], False),
    ("one str twice", [s1, s2], [s1, s1], False),
    ("deep change", [[[[{"k": (1, 2, 3)}]]]], [[[[{"k": (1, 2, 4)}]]]], False),
    ("longer", [1, 2], [1, 2, 3], False),
    ("shorter dict", {"a": 1, "b": 2}, {"a": 1}, False),
    ("subclass", [{}], [collections.defaultdict(int)], False),
    ("tensor", [1], [torch.zeros(1)], False),
]


@pytest.mark.parametrize("name,a,b,equal", CASES, ids=[c[0] for c in CASES])
def test_same_exactly_when_the_pickles_are(name, a, b, equal):
    assert (pk(a) == pk(b)) == equal
    assert verdict(a, b) == equal


class Tagged(dict):
    """A dict subclass."""


def test_what_is_not_frozen():
    cycle = []
    cycle.append(cycle)
    deep = []
    for _ in range(100):
        deep = [deep]
    od = collections.OrderedDict(a=1)
    od.note = 1
    for obj in [[Tagged()], [{1, 2}], [torch.zeros(1)], cycle, deep, [od], [object()],
                [torch.float32], {"a": (1, [frozenset()])}]:
        assert M.freeze(obj) is None, obj
    assert M.freeze(None) == (None, 0)  # an atom alone is frozen too


def test_bad_arguments():
    for args in [(None, []), ((1, -1), []), ((1, "x"), []), ((1,), []), ((1, 0),)]:
        with pytest.raises(TypeError):
            M.same_frozen(*args)


def random_tree(rng, shared, depth=0):
    """Plain containers over atoms, some of them objects met in several places (shared)."""
    r = rng.random()
    if shared and r < 0.1:
        return rng.choice(shared)
    if depth >= 4 or r < 0.45:
        return rng.choice([0, 1, True, False, None, 0.0, -0.0, 1.5, math.nan, 2 ** 70, "k",
                           "".join(["k", "ey"]), b"b", ()])
    n = rng.randrange(0, 4)
    kind = rng.choice(["dict", "odict", "list", "tuple"])
    if kind in ("dict", "odict"):
        keys = rng.sample(["a", "b", "c", 1, 2], n)
        out = (dict if kind == "dict" else collections.OrderedDict)(
            (k, random_tree(rng, shared, depth + 1)) for k in keys)
    else:
        items = [random_tree(rng, shared, depth + 1) for _ in range(n)]
        out = items if kind == "list" else tuple(items)
    if rng.random() < 0.2:
        shared.append(out)
    return out


def mutate(rng, tree):
    """Changes one place of tree in place, or nothing when it holds no container there."""
    place = tree
    while True:
        inner = [v for v in (place.values() if isinstance(place, dict) else place)
                 if isinstance(v, (dict, list))] if isinstance(place, (dict, list)) else []
        if not inner or rng.random() < 0.4:
            break
        place = rng.choice(inner)
    atom = rng.choice([0, 1.0, -0.0, True, "k", [], {}])
    if isinstance(place, collections.OrderedDict) and place and rng.random() < 0.3:
        place.move_to_end(next(iter(place)))
    elif isinstance(place, dict):
        place[rng.choice(["a", "b", "z", 1])] = atom
    elif isinstance(place, list):
        if place and rng.random() < 0.5:
            place[rng.randrange(len(place))] = atom
        else:
            place.append(atom)


def test_random_trees_and_changes():
    rng = random.Random(17)
    same = differ = 0
    for _ in range(3000):
        a = [random_tree(rng, []) for _ in range(3)]
        frozen = M.freeze(a)
        assert frozen is not None
        before = pk(a)
        assert pk(frozen[0]) == before
        b = copy.deepcopy(a) if rng.random() < 0.3 else a
        if rng.random() < 0.7:
            mutate(rng, b)
        answer = M.same_frozen(frozen, b)
        assert answer == (pk(b) == before), (a, b)
        assert not answer or _tree.encode(b) == _tree.encode(frozen[0]), (a, b)
        assert pk(frozen[0]) == before
        same, differ = same + answer, differ + (not answer)
    assert same > 600 and differ > 600, (same, differ)


def rss_kib():
    """This process's peak resident size, KiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def test_no_reference_leaks():
    a, other = leaves_like(), leaves_like()
    other[1][0]["lr"] = 2e-3
    od = collections.OrderedDict(a=1)
    od.note = 1
    bad = [[Tagged()], od]
    objs = [a, a[0], a[1], a[1][0], a[1][0]["betas"], other, bad, bad[0], od]
    counts = [sys.getrefcount(o) for o in objs]

    def calls(n):
        for _ in range(n):
            frozen = M.freeze(a)
            M.same_frozen(frozen, a)
            M.same_frozen(frozen, other)
            M.same_frozen(frozen, bad)
            M.freeze(bad)
            M.encode_tree(a)
            M.encode_tree(bad)  # NotImplemented half-way through
    calls(200)
    before = rss_kib()
    calls(5000)
    assert [sys.getrefcount(o) for o in objs] == counts
    assert rss_kib() - before < 2048, "resident memory grew over 35k calls"
