"""dsckpt._match (client/python/dsckpt/_match.c), the C Shape.match: loaded wherever it was
built, and answering exactly what the Python match (Shape.match_py, the oracle) answers for
matching state dicts and for every kind of mismatch, with no leaked references. Also run with
torch 2.x by tests/python/modern."""
import collections
import os
import resource
import sys

import pytest
import torch

from dsckpt import _shape

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
Point = collections.namedtuple("Point", "x y")


class Tagged(dict):
    """A plain dict subclass whose instances carry attributes."""


class Pair(collections.namedtuple("Pair", "a b")):
    """A namedtuple whose len() can be made to fail."""

    fail = False

    def __len__(self):
        """2, or a ZeroDivisionError when Pair.fail is set."""
        return 1 // 0 if Pair.fail else 2


class OddKey(str):
    """A str key whose == is Python code."""

    def __eq__(self, other):
        """str's ==."""
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def built():
    """The _match.abi3.so the package should find here (see _lib.match_module), or None."""
    env = os.environ.get("DSCKPT_LIB")
    where = os.path.dirname(env) if env else os.path.join(REPO, "build")
    path = os.path.join(where, "_match.abi3.so")
    return path if os.path.exists(path) else None


def gpt(n=8, step=7):
    """A GPT-like state dict as tests/python/bench_handover.py's make_state builds it."""
    model = collections.OrderedDict((f"layers.{i // 4}.w{i % 4}", torch.zeros(2))
                                    for i in range(n))
    model._metadata = collections.OrderedDict((f"layers.{i}", {"version": 1})
                                              for i in range(n // 4))
    optim = {"state": {i: {"step": torch.tensor(1.0), "exp_avg": torch.zeros(2),
                           "exp_avg_sq": torch.zeros(2)} for i in range(n)},
             "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.95), "params": list(range(n))}]}
    return {"model": model, "optim": optim, "step": step}


def nested():
    """Dicts, lists, tuples, a namedtuple, a dict subclass with attributes, int and str keys,
    and leaves at every level."""
    tagged = Tagged(a=torch.ones(1), b=[torch.ones(2), 3])
    # a string of its own: a one-character one is the interpreter's, and any thread's
    # code changes its reference count (test_no_reference_leaks counts this one's)
    tagged.note = "".join(["a ", "note"])
    return {"a": [torch.ones(1), (torch.ones(2), "leaf", {"x": torch.ones(3)})],
            1: Point(torch.ones(1), 2.5), 2: tagged, "pair": Pair(torch.ones(1), [torch.ones(1)]),
            "t": (), "none": None}


def tensors_of(obj, out):
    """out: {id(tensor): its index} for every tensor in obj's dicts, lists and tuples."""
    if isinstance(obj, torch.Tensor):
        out.setdefault(id(obj), len(out))
    elif isinstance(obj, dict):
        for v in obj.values():
            tensors_of(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            tensors_of(v, out)
    return out


def shape_of(sd):
    """sd's Shape."""
    entry_of = tensors_of(sd, {})
    return _shape.Shape(sd, entry_of, len(entry_of))


def outcome(fn, sd):
    """fn(sd) as something comparable: None, ("raised", type), or (tensor ids, leaf ids)."""
    try:
        found = fn(sd)
    except Exception as e:  # noqa: BLE001 - both paths must raise alike
        return ("raised", type(e))
    if found is None:
        return None
    return [id(t) for t in found[0]], [id(x) for x in found[1]]


def parity(shape, sd):
    """Asserts match() (the C module where loaded) and match_py() agree on sd; returns it."""
    want = outcome(shape.match_py, sd)
    assert outcome(shape.match, sd) == want
    return want


def test_the_built_module_is_used():
    path = built()
    if path is None:
        pytest.skip("no _match.abi3.so built beside the library (make builds it)")
    assert _shape._match is not None, f"{path} exists but dsckpt._match did not load"
    assert os.path.samefile(_shape._match.__file__, path)
    assert shape_of(gpt()).plan is not None


def test_same_pointers_refuses_bad_arguments():
    """same_pointers (the warm proof's pointer check) with what it cannot take: errors in
    Python, never a call through a null address; a byte string of another length is a
    mismatch (test_handover_modern calls it through torch's function)."""
    if _shape._match is None:
        pytest.skip("dsckpt._match not loaded")
    same = _shape._match.same_pointers
    with pytest.raises(ValueError):
        same(0, [torch.ones(1)], b"\0" * 8)
    for args in [(1, (torch.ones(1),), b""), (1, [], "x"), (1, [])]:
        with pytest.raises(TypeError):
            same(*args)
    with pytest.raises(OverflowError):
        same(-1 << 70, [], b"")
    assert same(1, [torch.ones(1)], b"") is False  # lengths disagree: fn is not called
    assert same(1, [], b"") is True


@pytest.mark.parametrize("make", [gpt, nested])
def test_matching_state_dicts_agree(make):
    shape = shape_of(make())
    sd = make()
    found = parity(shape, sd)
    assert found is not None
    if _shape._match is not None:  # answered in C, not handed back to Python
        assert _shape._match.match(shape.plan, sd) is not NotImplemented


def test_the_benchmarks_state_dict_agrees():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_handover
    state_dict = bench_handover.make_state(389, "cpu")
    shape = shape_of(state_dict())
    sd = state_dict()
    tensors, leaves = shape.match(sd)
    assert len(tensors) == 1556 and parity(shape, sd) is not None


def mismatches():
    """(name, change) pairs: each change of a gpt() state dict makes it another shape."""
    def moved(sd):
        sd["model"].move_to_end("layers.0.w0")

    def renamed(sd):
        sd["model"] = collections.OrderedDict(
            (k.replace("w1", "w9"), v) for k, v in sd["model"].items())

    def attr_key(sd):
        sd["model"]._meta = sd["model"].__dict__.pop("_metadata")

    def repeated(sd):
        sd["optim"]["state"][1] = sd["optim"]["state"][0]

    return [
        ("type", lambda sd: sd.update(model=dict(sd["model"]))),
        ("length", lambda sd: sd["optim"]["state"].pop(3)),
        ("extra leaf", lambda sd: sd.update(epoch=1)),
        ("missing leaf", lambda sd: sd.pop("step")),
        ("key", renamed),
        ("order", moved),
        ("key type", lambda sd: sd["optim"].update(state={str(k): v for k, v in
                                                           sd["optim"]["state"].items()})),
        ("attribute key", attr_key),
        ("extra attribute", lambda sd: setattr(sd["model"], "extra", 1)),
        ("no attributes", lambda sd: sd["model"].__dict__.clear()),
        ("repeated container", repeated),
        ("odd key", lambda sd: sd.update({OddKey("other"): sd.pop("step")})),
    ]


@pytest.mark.parametrize("name,change", mismatches(), ids=[n for n, _ in mismatches()])
def test_mismatches_agree(name, change):
    shape = shape_of(gpt())
    sd = gpt()
    change(sd)
    assert parity(shape, sd) is None


def test_a_list_for_a_tuple_agrees():
    shape = shape_of(nested())
    sd = nested()
    sd["a"][1] = list(sd["a"][1])
    assert parity(shape, sd) is None


@pytest.mark.parametrize("name,change", [
    ("tensor for a leaf", lambda sd: sd.update(step=torch.ones(1))),
    ("container for a tensor", lambda sd: sd["optim"]["state"][0].update(step=[1])),
    ("leaf's content", lambda sd: sd["optim"]["param_groups"][0].update(betas=[0.9, 0.95])),
])
def test_changes_left_to_the_proof_agree(name, change):
    """Changes match() lets through (the tensor proof and dump_leaves refuse them later)."""
    shape = shape_of(gpt())
    sd = gpt()
    change(sd)
    assert parity(shape, sd) is not None


def test_an_odd_key_is_left_to_python():
    shape = shape_of(gpt())
    sd = gpt()
    sd[OddKey("step")] = sd.pop("step")  # == "step", but the key types differ
    assert parity(shape, sd) is None
    if _shape._match is not None:
        assert _shape._match.match(shape.plan, sd) is NotImplemented


def test_errors_of_python_code_agree():
    shape = shape_of(nested())
    sd = nested()
    Pair.fail = True
    try:
        assert parity(shape, sd) == ("raised", ZeroDivisionError)
    finally:
        Pair.fail = False


def rss_kib():
    """This process's resident set, KiB (from /proc: the current, not the peak)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 1024


def test_no_reference_leaks():
    if _shape._match is None:
        pytest.skip("dsckpt._match not loaded")
    shape, big = shape_of(nested()), shape_of(gpt())
    sd, bad, model = nested(), nested(), gpt()
    bad["a"][1][2]["y"] = 1
    odd = nested()
    odd[OddKey("t")] = odd.pop("t")
    renamed = gpt()
    renamed["model"]._meta = renamed["model"].__dict__.pop("_metadata")
    objs = [sd, sd["a"], sd["a"][0], sd[2], sd[2]["b"][0], sd[2].note, bad, odd, model,
            model["model"], model["model"]["layers.0.w0"], model["model"]._metadata, renamed]
    counts = [sys.getrefcount(o) for o in objs]
    Pair.fail = False

    def calls(n):
        for _ in range(n):
            _shape._match.match(shape.plan, sd)
            _shape._match.match(shape.plan, bad)
            _shape._match.match(shape.plan, odd)
            _shape._match.match(big.plan, model)
            _shape._match.match(big.plan, renamed)
            Pair.fail = True
            try:
                _shape._match.match(shape.plan, sd)
            except ZeroDivisionError:
                pass
            Pair.fail = False
    calls(1000)
    before = rss_kib()
    calls(20_000)
    assert [sys.getrefcount(o) for o in objs] == counts
    assert rss_kib() - before < 2048, "resident memory grew over 100k matches"


def random_state(rng, depth=0):
    """A random state dict: dicts (int and str keys), OrderedDicts, lists and tuples of
    tensors, leaves and more containers."""
    def child():
        r = rng.random()
        if r < 0.4:
            return torch.zeros(1)
        if r < 0.6 or depth >= 3:
            return rng.choice([1, "s", None, 2.5, (1, 2)])
        return random_state(rng, depth + 1)
    n = rng.randrange(0, 5)
    kind = rng.choice(["dict", "odict", "list", "tuple"])
    if kind in ("dict", "odict"):
        keys = [rng.choice([i, f"k{i}"]) for i in range(n)]
        d = (dict if kind == "dict" else collections.OrderedDict)((k, child()) for k in keys)
        if kind == "odict" and rng.random() < 0.5:
            d._metadata = {"v": 1}
        return d
    items = [child() for _ in range(n)]
    return items if kind == "list" else tuple(items)


def test_random_structures_and_changes_agree():
    import copy
    import random
    rng = random.Random(14)
    checked = 0
    for _ in range(400):
        sd = {"root": random_state(rng), "t": torch.zeros(1)}
        shape = shape_of(sd)
        again = copy.deepcopy(sd)
        assert parity(shape, again) is not None
        for _ in range(3):  # a random change anywhere: a key, a child, a container
            changed = copy.deepcopy(sd)
            place = changed
            while isinstance(place, (dict, list)) and place and rng.random() < 0.7:
                inner = [v for v in (place.values() if isinstance(place, dict) else place)
                         if isinstance(v, (dict, list))]
                if not inner:
                    break
                place = rng.choice(inner)
            r = rng.random()
            if isinstance(place, dict):
                if r < 0.3:
                    place[rng.choice([0, "k0", 99])] = torch.zeros(1)
                elif r < 0.6 and place:
                    place.pop(next(iter(place)))
                else:
                    place["new"] = rng.choice([1, torch.zeros(1), [torch.zeros(1)]])
            elif isinstance(place, list):
                if r < 0.5:
                    place.append(rng.choice([1, torch.zeros(1)]))
                elif place:
                    place[0] = rng.choice([1, torch.zeros(1), (torch.zeros(1),)])
            parity(shape, changed)
            checked += 1
    assert checked == 1200
