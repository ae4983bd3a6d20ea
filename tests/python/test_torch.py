"""dsckpt.torch: state dicts round-trip through the daemon as plain safetensors files."""
import collections
import dataclasses
import json
import os
import sys

import pytest
import torch
from safetensors import safe_open

import dsckpt
import dsckpt.torch as dt
from dsckpt import Level, _tree

Point = collections.namedtuple("Point", "x y")
T = 60  # seconds: generous, so a hung daemon fails the test instead of the run


def assert_same(a, b, path="state"):
    """Deep equality: container types, keys, dtypes, shapes, strides and values."""
    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype, f"{path}: {a.dtype} != {b.dtype}"
        assert a.shape == b.shape, f"{path}: {a.shape} != {b.shape}"
        assert a.device == b.device, path
        assert torch.equal(a, b), f"{path}: values differ"
        assert a.requires_grad == b.requires_grad, path
    elif isinstance(a, dict):
        assert list(a.keys()) == list(b.keys()), f"{path}: keys differ"
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}.{i}")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def model_state():
    """A nested state dict like a trainer's: bf16/fp16/int/bool/0-d/empty tensors."""
    torch.manual_seed(0)
    return {
        "model": collections.OrderedDict([
            ("embed.weight", torch.randn(64, 16).to(torch.bfloat16)),
            ("layers", [{"w": torch.randn(16, 16), "b": torch.zeros(16, dtype=torch.float16)}
                        for _ in range(2)]),
            ("norm.eps", torch.tensor(1e-5, dtype=torch.float64)),
            ("mask", torch.tensor([True, False, True])),
            ("empty", torch.empty(0, 3)),
            ("ids", torch.arange(-3, 5, dtype=torch.int64)),
            ("i32", torch.arange(6, dtype=torch.int32).reshape(2, 3)),
            ("i16", torch.arange(4, dtype=torch.int16)),
            ("i8", torch.tensor([-1, 2], dtype=torch.int8)),
            ("u8", torch.tensor([255, 0], dtype=torch.uint8)),
        ]),
        "optimizer": {"state": {0: {"step": 7, "exp_avg": torch.randn(16, 16)}},
                      "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.95), "params": [0]}]},
        "step": 7,
        "rng": (None, "text", 1.5),
        "param": torch.nn.Parameter(torch.ones(3)),
        "leaf": torch.ones(2, requires_grad=True),
    }


def save_and_load(state, root, conn, tag="t", weights_only=True, **kw):
    """Saves, waits DURABLE, commits and loads back (weights_only as dt.load's)."""
    d = os.path.join(root, "job", tag)
    h = dt.save(state, d, conn=conn, **kw)
    assert h.level == Level.ACCEPTED
    assert h.wait_snapshot(T) >= Level.SNAPSHOT
    assert h.wait_durable(T) == Level.DURABLE
    dt.commit(d, conn=conn, timeout=T)
    return d, dt.load(d, kw.get("file", "rank0"), weights_only=weights_only)


def test_round_trip_nested(daemon, conn):
    state = model_state()
    d, back = save_and_load(state, daemon.root, conn)
    assert_same(state, back)
    assert os.path.exists(os.path.join(d, "MANIFEST.json"))
    with open(os.path.join(daemon.root, "job", "latest")) as f:
        assert f.read() == "t"


def test_safetensors_reads_every_tensor(daemon, conn):
    state = model_state()
    d, _ = save_and_load(state, daemon.root, conn)
    expected = {
        "model.embed.weight": state["model"]["embed.weight"],
        "model.layers.0.w": state["model"]["layers"][0]["w"],
        "model.layers.1.b": state["model"]["layers"][1]["b"],
        "model.norm.eps": state["model"]["norm.eps"],
        "model.mask": state["model"]["mask"],
        "model.empty": state["model"]["empty"],
        "model.ids": state["model"]["ids"],
        "optimizer.state.0.exp_avg": state["optimizer"]["state"][0]["exp_avg"],
        "param": state["param"].detach(),
    }
    with safe_open(os.path.join(d, "rank0.safetensors"), framework="pt") as f:
        keys = set(f.keys())
        assert set(expected) <= keys and len(keys) == 16
        for name in keys:  # every tensor of the file reads
            f.get_tensor(name)
        for name, want in expected.items():
            got = f.get_tensor(name)
            assert got.dtype == want.dtype and got.shape == want.shape, name
            assert torch.equal(got, want), name
        meta = f.metadata()
    assert meta["dsckpt.rank"] == "0" and meta["format"] == "pt"
    header_dtypes = json.loads(open(os.path.join(d, "rank0.safetensors"), "rb").read()[
        8:8 + int.from_bytes(open(os.path.join(d, "rank0.safetensors"), "rb").read(8),
                             "little")])
    assert header_dtypes["model.embed.weight"]["dtype"] == "BF16"
    assert header_dtypes["model.mask"]["dtype"] == "BOOL"


def test_one_buffer_read_equals_per_tensor_read(daemon, conn):
    """The parallel one-buffer reader (the GPU load path) gives every tensor exactly, also
    with pieces much smaller than the file (several threads) and empty tensors."""
    d, _ = save_and_load(model_state(), daemon.root, conn)
    path = os.path.join(d, "rank0.safetensors")
    want = dt.read_safetensors(path)
    from dsckpt._files import read_safetensors_buffer, tensors_of
    for piece in (4096, 1 << 30):
        buf, entries = read_safetensors_buffer(path, threads=4, piece=piece)
        got = tensors_of(buf, entries)
        assert set(got) == set(want)
        for name, t in want.items():
            assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
            assert torch.equal(got[name], t), name


def test_non_contiguous_tensors(daemon, conn):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    state = {"t": base.t(), "cols": base[:, 1::2], "exp": torch.ones(3, 1).expand(3, 4)}
    assert not any(x.is_contiguous() for x in state.values())
    d, back = save_and_load(state, daemon.root, conn)
    for k in state:
        assert torch.equal(back[k], state[k]), k
        assert back[k].stride() == state[k].stride(), k  # views come back as views
    with safe_open(os.path.join(d, "rank0.safetensors"), framework="pt") as f:
        assert torch.equal(f.get_tensor("t"), base.t().contiguous())
        assert torch.equal(f.get_tensor("cols"), base[:, 1::2].contiguous())


def test_shared_tensors_stay_shared(daemon, conn):
    flat = torch.arange(20, dtype=torch.float32)
    w = torch.randn(4, 4)
    state = {"a": {"w": w}, "b": {"tied": w},           # one object, twice
             "same_view": w.view(4, 4),                  # another object, same view
             "first": flat[0:8], "second": flat[4:20].view(4, 4),  # overlapping views
             "list": [w, w]}
    d, back = save_and_load(state, daemon.root, conn)
    assert back["a"]["w"] is back["b"]["tied"] is back["list"][0] is back["list"][1]
    assert back["same_view"] is not back["a"]["w"]
    assert back["same_view"].data_ptr() == back["a"]["w"].data_ptr()
    back["first"][5] = -1.0  # flat[5] is second[0, 1]
    assert back["second"][0, 1] == -1.0
    assert back["first"].storage().data_ptr() == back["second"].storage().data_ptr()
    with safe_open(os.path.join(d, "rank0.safetensors"), framework="pt") as f:
        assert sorted(f.keys()) == ["a.w", "first", "second"]  # each view stored once


def test_shared_containers_and_types(daemon, conn):
    shared = [torch.ones(2)]
    state = {"one": shared, "two": shared, "pt": Point(torch.zeros(1), 3),
             "dd": collections.defaultdict(list, {"k": [torch.ones(1)]})}
    d, back = save_and_load(state, daemon.root, conn, weights_only=False)
    assert back["one"] is back["two"]
    assert type(back["pt"]) is Point and back["pt"].y == 3
    with pytest.raises(dsckpt.PickleRefused, match=r"\(collections.defaultdict, test_torch.Point\)"
                       ".*weights_only=False"):
        dt.load(d)  # values that load only by unpickling: refused unless asked
    assert type(back["dd"]) is collections.defaultdict and back["dd"]["missing"] == []


def test_tensor_changes_after_snapshot_do_not_reach_file(daemon, conn):
    w = dt.host_empty((256, 256), torch.float32)  # handed over by reference
    w.fill_(1.0)
    d = os.path.join(daemon.root, "job", "lazy")
    h = dt.save({"w": w}, d, conn=conn)
    h.wait_snapshot(T)
    w.fill_(2.0)  # the optimizer step
    h.wait_durable(T)
    assert torch.equal(dt.load(d, "rank0")["w"], torch.ones(256, 256))


def test_map_location_and_flat_foreign_file(daemon, conn, tmp_path):
    state = {"w": torch.randn(3, 3)}
    d, _ = save_and_load(state, daemon.root, conn)
    back = dt.load(d, "rank0", map_location=lambda storage, loc: storage)
    assert torch.equal(back["w"], state["w"])
    assert dt.load(d, "rank0", map_location={"cpu": "cpu"})["w"].device.type == "cpu"
    from safetensors.torch import save_file
    save_file({"x": torch.arange(3)}, str(tmp_path / "foreign.safetensors"))
    flat = dt.load(str(tmp_path), "foreign")
    assert list(flat) == ["x"] and torch.equal(flat["x"], torch.arange(3))


def test_unsupported_dtype_travels_in_the_blob(daemon, conn):
    state = {"c": torch.tensor([1 + 2j]), "f": torch.ones(2)}
    d, back = save_and_load(state, daemon.root, conn, weights_only=False)
    assert torch.equal(back["c"], state["c"]) and torch.equal(back["f"], state["f"])
    with safe_open(os.path.join(d, "rank0.safetensors"), framework="pt") as f:
        assert list(f.keys()) == ["f"]


def test_long_and_colliding_names(daemon, conn):
    state = {"a.b": torch.ones(1), "a": {"b": torch.zeros(1)}, "x" * 600: torch.ones(2)}
    d, back = save_and_load(state, daemon.root, conn)
    assert_same(state, back)
    with safe_open(os.path.join(d, "rank0.safetensors"), framework="pt") as f:
        keys = set(f.keys())
    assert {"a.b", "a.b~1"} <= keys and all(len(k) <= 512 for k in keys)


def test_default_connection_and_file(daemon, monkeypatch):
    monkeypatch.setenv("DSCKPT_SOCKET", daemon.socket)
    monkeypatch.delenv("DSCKPT_JOB", raising=False)
    dt.set_default_connection(None)
    try:
        d = os.path.join(daemon.root, "myjob", "step3")
        h = dt.save({"x": torch.ones(2)}, d)
        assert h.path == os.path.join(d, "rank0.safetensors")
        dt.commit(d, timeout=T)
        assert dt.default_connection().job == "myjob"
        assert torch.equal(dt.load(d)["x"], torch.ones(2))
    finally:
        dt.default_connection().close()
        dt.set_default_connection(None)


def test_failed_save_raises_with_reason(daemon, conn):
    d = os.path.join(daemon.root, "job", "bad")
    os.makedirs(os.path.join(d, "rank0.safetensors"))  # the final rename must fail
    h = dt.save({"x": torch.ones(1000)}, d, conn=conn)
    with pytest.raises(dsckpt.SaveFailed) as info:
        h.wait_durable(T)
    assert info.value.name == "EFAILED" and "rank0.safetensors" in info.value.message
    assert info.value.cause is not None and info.value.cause != dsckpt.errors.Errno.EFAILED
    assert h.level == Level.FAILED
    with pytest.raises(dsckpt.SaveFailed):
        dt.commit(d, conn=conn, timeout=T)
    assert not os.path.exists(os.path.join(d, "MANIFEST.json"))


def test_wait_timeout(daemon, conn):
    h = dt.save({"x": torch.ones(1)}, os.path.join(daemon.root, "job", "t"), conn=conn)
    with pytest.raises(dsckpt.DsckptTimeout) as info:
        h.wait(Level.COMMITTED, timeout=0.2)  # only a commit of the directory gets there
    assert isinstance(info.value, TimeoutError) and info.value.name == "ETIMEDOUT"


cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                          reason="no CUDA device: GPU path not run")


@cuda
def test_cuda_round_trip(daemon, conn):
    base = torch.randn(64, 32, device="cuda")
    state = {"w": torch.randn(256, 256, device="cuda", dtype=torch.bfloat16),
             "t": base.t(), "slices": [base[:16], base[16:]], "cpu": torch.ones(3)}
    d, back = save_and_load(state, daemon.root, conn)
    assert_same(state, back)  # back on the devices they came from
    assert back["slices"][0].storage().data_ptr() == back["slices"][1].storage().data_ptr()
    assert dt.load(d, "rank0", map_location="cpu")["w"].device.type == "cpu"
    on_gpu = dt.load(d, "rank0", map_location="cuda")  # one read, one copy over
    assert all(t.device.type == "cuda" for t in (on_gpu["w"], on_gpu["t"], on_gpu["cpu"]))
    assert torch.equal(on_gpu["w"], state["w"]) and torch.equal(on_gpu["t"], state["t"])
    assert torch.equal(on_gpu["cpu"].cpu(), state["cpu"])


@cuda
def test_cuda_release_then_free(daemon, conn):
    """After release_gpu the trainer may free what it saved; later saves register anew."""
    for step in range(3):
        state = {"w": torch.full((1024, 1024), float(step), device="cuda"),
                 "b": torch.arange(4096, device="cuda", dtype=torch.int32) + step}
        h = dt.save(state, os.path.join(daemon.root, "job", f"rel{step}"), conn=conn)
        h.wait_snapshot(T)
        closed = daemon.read_log().count("cuda_ipc: closed")
        dt.release_gpu(conn)  # past SNAPSHOT nothing reads them: closed before this returns
        assert daemon.read_log().count("cuda_ipc: closed") > closed
        del state
        torch.cuda.empty_cache()  # the segments go back to the driver
        h.wait_durable(T)
        back = dt.load(h.dir, "rank0", map_location="cpu")
        assert torch.equal(back["w"], torch.full((1024, 1024), float(step)))
        assert torch.equal(back["b"], torch.arange(4096, dtype=torch.int32) + step)


def test_release_gpu_without_gpu_memory(daemon, conn):
    dt.release_gpu(conn)  # nothing registered: a no-op
    h = dt.save({"x": torch.ones(3)}, os.path.join(daemon.root, "job", "rel"), conn=conn)
    h.wait_durable(T)
    conn.release_gpu()
    dt.release_gpu()  # no shared connection made yet, or made: both fine


@cuda
def test_cuda_lazy_window_and_stream_order(daemon, conn):
    side = torch.cuda.Stream()
    w = torch.zeros(4096, 1024, device="cuda")
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # the new values are still queued at save time
        w.fill_(3.0)
        h = dt.save({"w": w, "t": w[:8].t()}, os.path.join(daemon.root, "job", "gpu"),
                    conn=conn, stream=side)
    h.wait_snapshot(T)
    with torch.cuda.stream(side):
        w.fill_(float("nan"))  # the optimizer step
    h.wait_durable(T)
    side.synchronize()
    back = dt.load(h.dir, "rank0", map_location="cpu")
    assert torch.equal(back["w"], torch.full((4096, 1024), 3.0))
    assert torch.equal(back["t"], torch.full((1024, 8), 3.0))


FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


@pytest.mark.parametrize("name", ["blob_v2", "blob_v2_warm"])
def test_old_checkpoints_load_with_the_opt_in(name):
    """Checkpoints written before blob v3 (a pickle whole: a plain save with a complex tensor,
    and a warm save's frame and leaves) are refused by default and load with
    weights_only=False."""
    d = os.path.join(FIXTURES, name)
    with pytest.raises(dsckpt.PickleRefused, match="weights_only=False"):
        dt.load(d)
    back = dt.load(d, weights_only=False)
    w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert torch.equal(back["model"]["w"], w) and back["tied"] is back["model"]["w"]
    assert torch.equal(back["view"], w[:, 1::2])
    assert back["view"].data_ptr() == back["tied"].data_ptr() + 4  # a view of it again
    assert back["model"]._metadata == {"": {"version": 1}}
    assert back["optim"]["param_groups"] == [{"lr": 0.001, "betas": (0.9, 0.95), "params": [0]}]
    assert back["misc"] == [None, True, 7, 2.5, "s", b"by", torch.Size([2, 3]), torch.float16]
    assert ("c" in back) == (name == "blob_v2")


@dataclasses.dataclass
class Fragment:
    numel: int
    start: int


def test_allowed_classes_load_without_pickle_others_are_refused(daemon, conn, allowlist,
                                                                tmp_path, monkeypatch):
    """Objects of allowed classes load by default; once a class is not allowed, the load
    is refused from the blob's header, before any tensor is read, without importing its
    module; weights_only=False imports it."""
    marker = tmp_path / "imported"
    (tmp_path / "dsckpt_side_effect.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "class Scaler:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    scaler = type("Scaler", (), {"__module__": "dsckpt_side_effect"})
    dsckpt.add_safe_types([scaler, Fragment, Point])
    s = scaler()
    s.cur_scale = 1024.0
    state = {"w": torch.ones(3), "scaler": s, "pt": Point(torch.zeros(2), 3),
             "maps": [collections.OrderedDict(w=Fragment(3, 0))]}
    d, back = save_and_load(state, daemon.root, conn, tag="allowed")
    assert type(back["scaler"]) is scaler and back["scaler"].cur_scale == 1024.0
    assert type(back["pt"]) is Point and torch.equal(back["pt"].x, torch.zeros(2))
    assert back["maps"] == [collections.OrderedDict(w=Fragment(3, 0))]
    monkeypatch.delitem(_tree._SAFE_BY_NAME, "dsckpt_side_effect.Scaler")
    with pytest.raises(dsckpt.PickleRefused, match=r"classes not allowed to load "
                       r"\(dsckpt_side_effect.Scaler\).*add_safe_types.*weights_only=False"):
        dt.load(d, conn=conn)
    assert not marker.exists() and "dsckpt_side_effect" not in sys.modules
    monkeypatch.delitem(sys.modules, "dsckpt_side_effect", raising=False)
    back = dt.load(d, conn=conn, weights_only=False)
    assert marker.exists() and back["scaler"].cur_scale == 1024.0
    assert type(back["scaler"]) is sys.modules["dsckpt_side_effect"].Scaler
