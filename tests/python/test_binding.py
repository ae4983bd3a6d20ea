"""The ctypes binding (dsckpt): connections, saves, levels, errors, host memory."""
import json
import os

import numpy as np
import pytest

import dsckpt
from dsckpt import Level


def test_library_found_and_version():
    from dsckpt import _lib
    assert dsckpt.version() == "0.1.0"
    assert os.path.exists(_lib.path)
    assert dsckpt.err_name(-22) == "EINVAL"
    assert dsckpt.strerror(-111) == "daemon not reachable"


def test_daemon_missing_is_econnrefused(tmp_path):
    with pytest.raises(dsckpt.DaemonUnavailable) as info:
        dsckpt.Connection(str(tmp_path / "nobody.sock"))
    e = info.value
    assert (e.code, e.name) == (-111, "ECONNREFUSED")
    assert "nobody.sock" in e.message
    assert isinstance(e, dsckpt.DsckptError) and isinstance(e, ConnectionError)
    assert str(e).startswith("ECONNREFUSED: ")


def test_socket_from_environment(daemon, monkeypatch):
    monkeypatch.setenv("DSCKPT_SOCKET", daemon.socket)
    with dsckpt.Connection(job="env", rank=0, world_size=1) as c:
        assert c.socket == daemon.socket and not c.closed
    assert c.closed


def test_bad_path_raises_with_code_name_and_message(conn):
    with pytest.raises(dsckpt.PermissionDenied) as info:
        conn.save("/etc/dsckpt-test", "rank0")
    assert (info.value.code, info.value.name) == (-13, "EACCES")
    assert "allowed root" in info.value.message
    with pytest.raises(dsckpt.InvalidArgument) as info:
        conn.save("relative/dir", "rank0")
    assert info.value.name == "EINVAL" and isinstance(info.value, ValueError)


def test_deferred_save_refused_at_end(conn, daemon):
    """A deferred save sends nothing until end(): the daemon's refusal comes from there, and
    the same file then saves at once (nothing of the refused save is left)."""
    s = conn.save("/etc/dsckpt-test", "rank0", defer=True)
    s.add_blob("meta", b"x" * 100)
    with pytest.raises(dsckpt.PermissionDenied) as info:
        s.end()
    assert "allowed root" in info.value.message
    s.close()
    d = os.path.join(daemon.root, "job", "deferred")
    a = np.arange(64, dtype=np.uint8)
    s = conn.save(d, "rank0", defer=True)
    s.add_array("w", a)
    s.add_blob("meta", b"abc")
    s.end()
    assert s.wait(Level.DURABLE, 30) == Level.DURABLE
    s.close()
    with open(os.path.join(d, "rank0.safetensors"), "rb") as f:
        raw = f.read()
    hlen = int.from_bytes(raw[:8], "little")
    begin, end = json.loads(raw[8:8 + hlen])["w"]["data_offsets"]
    assert raw[8 + hlen + begin:8 + hlen + end] == a.tobytes()


def test_bad_file_name_and_dtype(conn, daemon):
    d = os.path.join(daemon.root, "job", "t")
    with pytest.raises(dsckpt.DsckptError) as info:
        conn.save(d, "../escape")
    assert info.value.name == "EINVAL"
    with conn.save(d, "rank0") as s:
        with pytest.raises(dsckpt.InvalidArgument) as info:
            s.add_tensor("x", "F33", (1,), 0, 4)
        assert "dtype" in info.value.message
        with pytest.raises(dsckpt.InvalidArgument) as info:
            s.add_tensor("x", "F32", (2,), 1, 4)  # 2 floats are 8 bytes
        assert "nbytes" in info.value.message
        with pytest.raises(dsckpt.InvalidArgument):
            s.add_tensor("nul\0name", "F32", (0,), 0, 0)


def test_add_tensors_in_one_call(conn, daemon):
    d = os.path.join(daemon.root, "job", "batch")
    a = np.arange(12, dtype=np.float32)
    b = np.arange(6, dtype=np.int64)
    with conn.save(d, "rank0") as s:
        s.add_tensors([("a", "F32", (3, 4), a.ctypes.data, 48),
                       ("b", "I64", [6], b.ctypes.data, 48),
                       ("scalar", "F32", (), a.ctypes.data + 4, 4),
                       ("empty", "BF16", (0, 7), 0, 0)])
        s.add_tensors([])
    s.wait(timeout=30)
    with open(os.path.join(d, "rank0.safetensors"), "rb") as f:
        raw = f.read()
    hlen = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + hlen])
    assert header["a"]["shape"] == [3, 4] and header["b"]["dtype"] == "I64"
    assert header["scalar"]["shape"] == [] and header["empty"]["shape"] == [0, 7]
    begin, end = header["b"]["data_offsets"]
    assert np.array_equal(np.frombuffer(raw[8 + hlen + begin:8 + hlen + end], np.int64), b)
    begin, end = header["scalar"]["data_offsets"]
    assert np.frombuffer(raw[8 + hlen + begin:8 + hlen + end], np.float32)[0] == 1.0


def test_add_tensors_stops_at_the_bad_one(conn, daemon):
    a = np.zeros(4, dtype=np.float32)
    with conn.save(os.path.join(daemon.root, "job", "batchbad"), "rank0") as s:
        with pytest.raises(dsckpt.InvalidArgument) as info:
            s.add_tensors([("ok", "F32", (4,), a.ctypes.data, 16),
                           ("bad", "F32", (5,), a.ctypes.data, 16)])
        assert "bad" in info.value.message and "nbytes" in info.value.message
        with pytest.raises(dsckpt.DsckptError) as info:  # "ok" went in before "bad"
            s.add_tensors([("ok", "F32", (4,), a.ctypes.data, 16)])
        assert info.value.name == "EEXIST"
        with pytest.raises(dsckpt.InvalidArgument):
            s.add_tensors([("nul\0name", "F32", (0,), 0, 0)])
        with pytest.raises(dsckpt.InvalidArgument):
            s.add_tensors([("neg", "F32", (-1,), 0, 0)])


def test_save_not_identified(daemon):
    with dsckpt.Connection(daemon.socket) as c:
        with pytest.raises(dsckpt.DsckptError) as info:
            c.save(os.path.join(daemon.root, "j", "t"), "rank0")
        assert info.value.code < 0 and info.value.message


def test_levels_and_progress(conn, daemon):
    d = os.path.join(daemon.root, "job", "step1")
    a = np.arange(1000, dtype=np.float32)
    with conn.save(d, "rank0") as s:
        s.add_array("a", a)
        s.add_array("b", np.ones((3, 4), dtype=np.int16))
        s.add_tensor("scalar", "F32", (), a.ctypes.data, 4)
        s.add_tensor("empty", "F32", (0, 5), 0, 0)
        s.add_blob("note", b"hello")
        assert s.level == Level.NONE and not s.ended
    assert s.ended and s.level == Level.ACCEPTED
    assert s.wait(Level.SNAPSHOT, timeout=30) >= Level.SNAPSHOT
    assert s.wait(timeout=30) == Level.DURABLE
    p = s.progress()
    assert p.level == Level.DURABLE
    assert p.bytes_total == p.bytes_snapshot == p.bytes_flushed == 4000 + 24 + 4
    s.close()
    s.close()  # idempotent
    with pytest.raises(dsckpt.DsckptError) as info:
        s.wait()
    assert info.value.name == "ESTATE"
    conn.commit(d, timeout=30)
    with open(os.path.join(daemon.root, "job", "latest")) as f:
        assert f.read() == "step1"
    with open(os.path.join(d, "MANIFEST.json")) as f:
        manifest = json.load(f)
    names = {t["name"] for f in manifest["files"] for t in f.get("tensors", [])}
    assert names == {"a", "b", "scalar", "empty"}


def test_level_enum_matches_header():
    assert [int(x) for x in Level] == [-1, 0, 1, 2, 3, 4, 5, 6]
    assert Level.SNAPSHOT < Level.DURABLE < Level.COMMITTED < Level.REMOTE < Level.REPLICATED


def test_exception_in_block_abandons_save(conn, daemon):
    d = os.path.join(daemon.root, "job", "t")
    with pytest.raises(RuntimeError):
        with conn.save(d, "rank0") as s:
            s.add_array("a", np.ones(4, dtype=np.float32))
            raise RuntimeError("trainer bug")
    assert not s.ended
    # The daemon forgot it: the same file name can be saved again.
    with conn.save(d, "rank0") as s2:
        s2.add_array("a", np.ones(4, dtype=np.float32))
    assert s2.wait(timeout=30) == Level.DURABLE


def test_commit_incomplete(daemon):
    d = os.path.join(daemon.root, "job", "t")
    with dsckpt.Connection(daemon.socket, job="two", rank=0, world_size=2) as c:
        with c.save(d, "rank0") as s:
            s.add_array("a", np.ones(4, dtype=np.float32))
        s.wait(timeout=30)
        with pytest.raises(dsckpt.CheckpointIncomplete) as info:
            c.commit(d, timeout=30)
        assert info.value.name == "EINCOMPLETE" and "rank 1" in info.value.message
    assert not os.path.exists(os.path.join(d, "MANIFEST.json"))


def test_host_buffer_handed_over_without_copy(conn, daemon):
    buf = dsckpt.HostBuffer(4096)
    view = buf.numpy("f4")
    view[:] = np.arange(1024, dtype=np.float32)
    del buf  # the view keeps the memory alive
    d = os.path.join(daemon.root, "job", "host")
    with conn.save(d, "rank0") as s:
        s.add_array("w", view)
    s.wait(timeout=30)
    conn.commit(d, timeout=30)
    with open(os.path.join(d, "rank0.safetensors"), "rb") as f:
        raw = f.read()
    hlen = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + hlen])
    begin, end = header["w"]["data_offsets"]
    got = np.frombuffer(raw[8 + hlen + begin:8 + hlen + end], dtype=np.float32)
    assert np.array_equal(got, np.arange(1024, dtype=np.float32))


def test_host_buffer_refuses_bad_size():
    with pytest.raises(ValueError):
        dsckpt.HostBuffer(0)


def test_closed_connection_raises(daemon):
    c = dsckpt.Connection(daemon.socket, job="j", rank=0, world_size=1)
    c.close()
    with pytest.raises(dsckpt.DaemonUnavailable) as info:
        c.save(daemon.root, "x")
    assert info.value.name == "EPIPE"


def test_errors_pickle():
    import pickle
    e = pickle.loads(pickle.dumps(dsckpt.errors.error_for(-1000, "EFAILED", "disk full", -28)))
    assert e.cause == dsckpt.errors.Errno.ENOSPC
    assert type(e) is dsckpt.SaveFailed and e.message == "disk full" and e.code == -1000


def test_library_search_order(monkeypatch):
    from dsckpt import _lib
    monkeypatch.setenv("DSCKPT_LIB", "/nonexistent/libdsckpt.so")
    assert _lib.candidates() == ["/nonexistent/libdsckpt.so"]
    with pytest.raises(ImportError) as info:
        _lib._load()
    assert "/nonexistent/libdsckpt.so (missing)" in str(info.value)
    monkeypatch.delenv("DSCKPT_LIB")
    pkg = os.path.dirname(_lib.__file__)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(pkg)))
    assert _lib.candidates() == [os.path.join(pkg, "libdsckpt.so.0"),
                                 os.path.join(pkg, "libdsckpt.so"),
                                 os.path.join(repo, "build", "libdsckpt.so"),
                                 "libdsckpt.so.0"]
