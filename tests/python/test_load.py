"""Loads: Connection.load, dsckpt.torch.load_into and dsckpt.torch.load through the daemon
(from its cache, and from the file by a second daemon on the same root), strict errors, a
corrupted tensor, and the file path taken when no daemon answers."""
import json
import os
import warnings

import numpy as np
import pytest
import torch

import dsckpt
import dsckpt.torch as dt
from dsckpt import Errno, LoadLevel

T = 60  # seconds


def saved(root, conn, state, tag="t"):
    """Saves state as <root>/job/<tag>/rank0, waits DURABLE and commits; the directory."""
    d = os.path.join(root, "job", tag)
    dt.save(state, d, conn=conn).wait_durable(T)
    dt.commit(d, conn=conn, timeout=T)
    return d


def model_state():
    """A nested state dict of several dtypes, a Parameter, a 0-d and an empty tensor."""
    torch.manual_seed(1)
    return {
        "model": {"w": torch.randn(32, 16), "b": torch.randn(16).to(torch.bfloat16),
                  "layers": [{"k": torch.randint(0, 9, (5, 3))} for _ in range(2)]},
        "optimizer": {"state": {0: {"exp_avg": torch.randn(32, 16), "step": 3}}},
        "param": torch.nn.Parameter(torch.randn(7)),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.empty(0, 4),
        "mask": torch.tensor([True, False]),
    }


def zeros_like_state(state):
    """The same structure with every tensor zeroed (a fresh model to restore into)."""
    if isinstance(state, torch.Tensor):
        z = torch.zeros_like(state.detach())
        return torch.nn.Parameter(z) if isinstance(state, torch.nn.Parameter) else z
    if isinstance(state, dict):
        return {k: zeros_like_state(v) for k, v in state.items()}
    if isinstance(state, list):
        return [zeros_like_state(v) for v in state]
    return state


def tensors(state, path=""):
    """(path, tensor) of every tensor in a nested state dict."""
    if isinstance(state, torch.Tensor):
        yield path, state
    elif isinstance(state, dict):
        for k, v in state.items():
            yield from tensors(v, f"{path}.{k}" if path else str(k))
    elif isinstance(state, list):
        for i, v in enumerate(state):
            yield from tensors(v, f"{path}.{i}")


def assert_equal_tensors(a, b):
    """Every tensor of a equals the tensor at the same path of b."""
    tb = dict(tensors(b))
    for path, t in tensors(a):
        assert t.dtype == tb[path].dtype and torch.equal(t.detach(), tb[path].detach()), path


def loads_seen(daemon):
    """How many LOAD_BEGIN requests the daemon handled (its debug log)."""
    return daemon.read_log().count("LOAD_BEGIN of")


def test_connection_load_numpy(daemon, conn):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.arange(5, dtype=np.int64)
    d = os.path.join(daemon.root, "np", "t1")
    with conn.save(d, "rank0") as s:
        s.add_array("a", a)
        s.add_array("b", b)
    s.wait(dsckpt.Level.DURABLE, T)
    host = dsckpt.HostBuffer(48).numpy("float32").reshape(3, 4)
    heap = np.zeros(5, dtype=np.int64)
    with conn.load(d, "rank0") as l:
        assert l.source in ("cache", "file")
        l.add_array("a", host)
        l.add_array("b", heap)
        assert l.level == LoadLevel.OPEN
    assert l.level == LoadLevel.LOADED
    assert np.array_equal(host, a) and np.array_equal(heap, b)
    p = l.progress()
    assert (p.level, p.bytes_total, p.bytes_done) == (LoadLevel.LOADED, 88, 88)
    assert l.wait(0) == LoadLevel.LOADED
    l.close()
    with pytest.raises(dsckpt.InvalidArgument):
        conn.load(d, "rank0").add_array("a", np.zeros((4, 3), dtype=np.float32).T)


def test_connection_load_mismatch_and_missing(daemon, conn):
    d = os.path.join(daemon.root, "mm", "t1")
    with conn.save(d, "rank0") as s:
        s.add_array("a", np.ones(4, dtype=np.float32))
    s.wait(dsckpt.Level.DURABLE, T)
    dst = np.zeros(4, dtype=np.int32)
    l = conn.load(d, "rank0")
    l.add_array("a", dst)
    l.add_array("nope", np.zeros(2, dtype=np.uint8))
    with pytest.raises(dsckpt.InvalidArgument) as e:
        l.end()
    assert "a" in e.value.message and "nope" in e.value.message
    assert not dst.any()
    l.close()
    with pytest.raises(dsckpt.DsckptError) as e:
        conn.load(d, "rank9")
    assert e.value.code == Errno.ENOENT


def test_load_not_identified(daemon):
    with dsckpt.Connection(daemon.socket) as c:
        with pytest.raises(dsckpt.DsckptError) as e:
            c.load(daemon.root, "rank0")
        assert e.value.code == Errno.ESTATE and "dsckpt_identify" in e.value.message


def test_load_into_through_daemon(daemon, conn):
    state = model_state()
    d = saved(daemon.root, conn, state)
    fresh = zeros_like_state(state)
    fresh["model"]["w"] = dt.host_empty((32, 16))          # written without a copy
    fresh["optimizer"]["state"][0]["exp_avg"] = torch.zeros(16, 32).t()  # not contiguous
    before = loads_seen(daemon)
    assert dt.load_into(fresh, d, conn=conn) == "daemon"
    assert loads_seen(daemon) == before + 1
    assert_equal_tensors(state, fresh)
    assert not fresh["optimizer"]["state"][0]["exp_avg"].is_contiguous()
    assert isinstance(fresh["param"], torch.nn.Parameter)


def test_torch_load_through_daemon(daemon, conn):
    state = model_state()
    d = saved(daemon.root, conn, state)
    before = loads_seen(daemon)
    back = dt.load(d, "rank0", conn=conn)
    assert loads_seen(daemon) == before + 1
    assert_equal_tensors(state, back)
    assert isinstance(back["param"], torch.nn.Parameter)
    assert back["optimizer"]["state"][0]["step"] == 3
    back = dt.load(d, "rank0", map_location="cpu", conn=conn)
    assert_equal_tensors(state, back)


def test_load_into_strict(daemon, conn):
    state = {"a": torch.ones(4), "b": torch.ones(2, 3), "c": torch.ones(3)}
    d = saved(daemon.root, conn, state)
    fresh = {"a": torch.zeros(4), "b": torch.zeros(3, 2), "x": torch.zeros(1)}
    with pytest.raises(dt.StateDictMismatch) as e:
        dt.load_into(fresh, d, conn=conn)
    text = str(e.value)
    assert isinstance(e.value, KeyError)
    assert e.value.missing == ["x"] and e.value.unexpected == ["c"]
    assert "b (F32 [3, 2], file F32 [2, 3])" in text and "missing from the file: x" in text
    assert all(not t.any() for t in fresh.values())
    # Not strict: the tensors both have are loaded; a wrong shape still fails.
    with pytest.raises(dt.StateDictMismatch):
        dt.load_into(fresh, d, conn=conn, strict=False)
    part = {"a": torch.zeros(4)}
    assert dt.load_into(part, d, conn=conn, strict=False) == "daemon"
    assert torch.equal(part["a"], state["a"])
    with pytest.raises(dt.StateDictMismatch):
        dt.load_into(part, d, conn=conn)
    with pytest.raises(dsckpt.InvalidArgument):
        dt.load_into({"a": torch.zeros(1).expand(4)}, d, conn=conn, strict=False)


def test_load_into_without_daemon(daemon, conn, monkeypatch, tmp_path):
    state = model_state()
    d = saved(daemon.root, conn, state)
    monkeypatch.setenv("DSCKPT_SOCKET", str(tmp_path / "none.sock"))
    dt.set_default_connection(None)
    try:
        fresh = zeros_like_state(state)
        fresh["model"]["w"] = torch.zeros(16, 32).t()
        before = loads_seen(daemon)
        assert dt.load_into(fresh, d) == "file"
        assert_equal_tensors(state, fresh)
        assert_equal_tensors(state, dt.load(d, "rank0"))
        assert loads_seen(daemon) == before
        with pytest.raises(dt.StateDictMismatch):
            dt.load_into({"model": fresh["model"]}, d)
    finally:
        dt.set_default_connection(None)


def test_load_outside_roots_reads_the_file(daemon, conn, tmp_path):
    from safetensors.torch import save_file
    save_file({"x": torch.arange(6.0)}, str(tmp_path / "foreign.safetensors"))
    x = torch.zeros(6)
    assert dt.load_into({"x": x}, str(tmp_path), "foreign", conn=conn) == "file"
    assert torch.equal(x, torch.arange(6.0))
    assert torch.equal(dt.load(str(tmp_path), "foreign", conn=conn)["x"], torch.arange(6.0))


def test_corrupted_tensor_fails_the_load(make_daemon, tmp_path):
    root = str(tmp_path / "root")
    os.makedirs(root)
    first = make_daemon(root=root)
    with dsckpt.Connection(first.socket, job="ck", rank=0, world_size=1) as c:
        d = saved(root, c, {"good": torch.ones(1024), "rot": torch.ones(1024)})
    first.stop()   # one daemon per root; the next one has nothing of the file in its cache
    path = os.path.join(d, "rank0.safetensors")
    with open(path, "r+b") as f:
        f.seek(-100, os.SEEK_END)   # "rot" is the last tensor: names sort
        byte = f.read(1)
        f.seek(-100, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0x10]))
    second = make_daemon(root=root)
    with dsckpt.Connection(second.socket, job="ck", rank=0, world_size=1) as c:
        fresh = {"good": torch.zeros(1024), "rot": torch.zeros(1024)}
        with pytest.raises(dsckpt.LoadFailed) as e:
            dt.load_into(fresh, d, conn=c)
        assert e.value.cause == Errno.ECHECKSUM and "rot" in e.value.message


def no_daemon(monkeypatch, tmp_path):
    """Points the default connection at a socket nobody listens on: loads read the files."""
    monkeypatch.setenv("DSCKPT_SOCKET", str(tmp_path / "none.sock"))
    dt.set_default_connection(None)


def edit_header(path, edit):
    """Rewrites the JSON header of a safetensors file through edit(dict), keeping its length
    (padded with spaces, as safetensors allows), so the data stays where it was."""
    with open(path, "r+b") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        edit(header)
        raw = json.dumps(header).encode()
        assert len(raw) <= n
        f.seek(8)
        f.write(raw + b" " * (n - len(raw)))


def flip(path, back, mask=0xff):
    """Flips the bits of mask in the 4 bytes that end back bytes before the end of path."""
    with open(path, "r+b") as f:
        f.seek(-back, os.SEEK_END)
        raw = f.read(4)
        f.seek(-back, os.SEEK_END)
        f.write(bytes(b ^ mask for b in raw))


def test_offline_load_checks_checksums(daemon, conn, monkeypatch, tmp_path):
    # Issue 31.2: with 4 bytes flipped in a tensor, every load that reads the file itself
    # raises, naming the tensor and the file, instead of returning the garbage.
    d = saved(daemon.root, conn, {"good": torch.ones(1024), "rot": torch.ones(1024)})
    path = os.path.join(d, "rank0.safetensors")
    flip(path, 100)   # "rot" is the last tensor: names sort
    no_daemon(monkeypatch, tmp_path)
    try:
        for load in (lambda: dt.load(d), lambda: dt.load(d, map_location="cpu"),
                     lambda: dt.load_into({"good": torch.zeros(1024),
                                           "rot": torch.zeros(1024)}, d),
                     lambda: dt.read_safetensors(path)):
            with pytest.raises(dsckpt.LoadFailed) as e:
                load()
            assert e.value.cause == Errno.ECHECKSUM, e.value
            assert "'rot'" in e.value.message and path in e.value.message, e.value
            assert "mismatch" in e.value.message, e.value
        # Restored, the same file loads, checked and silently.
        flip(path, 100)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert torch.equal(dt.load(d)["rot"], torch.ones(1024))
    finally:
        dt.set_default_connection(None)


def test_offline_load_of_unchecksummed_file_warns(tmp_path):
    from safetensors.torch import save_file
    save_file({"x": torch.arange(6.0), "y": torch.ones(3)}, str(tmp_path / "foreign.safetensors"))
    x = torch.zeros(6)
    for load in (lambda: dt.load(str(tmp_path), "foreign", conn=None)["x"],
                 lambda: dt.load_into({"x": x}, str(tmp_path), "foreign", strict=False) and x):
        with pytest.warns(dsckpt.UncheckedLoad, match="foreign.safetensors.*unchecked"):
            assert torch.equal(load(), torch.arange(6.0))


@pytest.mark.parametrize("edit,said", [
    (lambda m: m.update({"dsckpt.xxh3.rot": m["dsckpt.xxh3.rot"].upper()}),
     "not 16 lowercase hex digits"),
    (lambda m: m.pop("dsckpt.xxh3.rot"), "'rot' has no checksum"),
    (lambda m: m.update({"dsckpt.xxh3.gone": "0123456789abcdef"}), "no such tensor"),
    (lambda m: m.update({"dsckpt.xxh3.rot": 7}), "not 16 lowercase hex digits"),
    (lambda m: m.pop("dsckpt.data_xxh3"), "data region"),
])
def test_offline_load_refuses_unreadable_checksum(daemon, conn, monkeypatch, tmp_path, edit,
                                                  said):
    # A checksum that is there but cannot be read is an error, never a tensor left unchecked.
    d = saved(daemon.root, conn, {"good": torch.ones(16), "rot": torch.ones(16)})
    path = os.path.join(d, "rank0.safetensors")
    edit_header(path, lambda h: edit(h["__metadata__"]))
    no_daemon(monkeypatch, tmp_path)
    try:
        for load in (lambda: dt.load(d), lambda: dt.load_into({"good": torch.zeros(16),
                                                               "rot": torch.zeros(16)}, d)):
            with pytest.raises(dsckpt.LoadFailed, match=said) as e:
                load()
            assert e.value.cause == Errno.ECHECKSUM and path in e.value.message
    finally:
        dt.set_default_connection(None)


cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                          reason="no CUDA device: GPU path not run")


@cuda
def test_cuda_load_into_and_load(daemon, conn):
    torch.manual_seed(2)
    state = {"w": torch.randn(1024, 256), "b": torch.randn(64).to(torch.bfloat16),
             "t": torch.randn(64, 32), "cpu": torch.arange(5)}
    d = saved(daemon.root, conn, state)
    fresh = {"w": torch.zeros(1024, 256, device="cuda"),
             "b": torch.zeros(64, dtype=torch.bfloat16, device="cuda"),
             "t": torch.zeros(32, 64, device="cuda").t(), "cpu": torch.zeros(5, dtype=torch.long)}
    # Work still queued on the destinations when the load starts: the daemon writes after it.
    torch.cuda._sleep(200_000_000)
    fresh["w"].fill_(7.0)
    before = loads_seen(daemon)
    assert dt.load_into(fresh, d, conn=conn) == "daemon"   # GPU and host destinations
    assert loads_seen(daemon) == before + 1
    assert_equal_tensors(state, {k: v.cpu() for k, v in fresh.items()})
    back = dt.load(d, "rank0", map_location="cuda", conn=conn)
    assert all(t.device.type == "cuda" for t in back.values())
    assert_equal_tensors(state, {k: v.cpu() for k, v in back.items()})
