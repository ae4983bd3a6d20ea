"""Restores from a root's remote tier (issue 33.4): node B commits a tag (dsckpt.torch.save, and
DCP's Writer), the tag and the job's `latest` are copied into a file:// tier, B is destroyed
(its daemon SIGKILLed, its root deleted) and a fresh daemon on an empty root serves the same
calls: find_latest names the remote tag, load_into / load / the DCP Reader give the bytes back
exactly (checked against the manifest, then the tensors' checksums), dsckpt.prefetch puts the
tag in the cache, and a corrupted remote object fails the load with ECHECKSUM."""
import os
import shutil
import subprocess

import pytest
import torch

dcp = pytest.importorskip("torch.distributed.checkpoint",
                          reason="torch.distributed.checkpoint missing")

import dsckpt  # noqa: E402
import dsckpt.dcp  # noqa: E402
import dsckpt.torch as dt  # noqa: E402
from conftest import Daemon  # noqa: E402

T = 60


def state():
    """A small model-and-optimizer-like state dict."""
    g = torch.Generator().manual_seed(7)
    return {"w": torch.randn(64, 32, generator=g), "b": torch.randn(32, generator=g),
            "opt": {"m": torch.randn(64, 32, generator=g).to(torch.bfloat16),
                    "step": torch.tensor(12)}}


def zeros_like(sd):
    """The same structure, every tensor zero."""
    if isinstance(sd, dict):
        return {k: zeros_like(v) for k, v in sd.items()}
    return torch.zeros_like(sd)


def equal(a, b):
    """Whether two state dicts hold equal tensors."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    return torch.equal(a, b)


@pytest.fixture
def replaced(tmp_path):
    """Node B's commits copied into a file:// tier, B destroyed, and the replacement daemon
    on an empty root: (daemon, job_dir, shared dir)."""
    b = Daemon()
    job = os.path.join(b.root, "jobB")
    sd = state()
    with dsckpt.Connection(b.socket, job="jobB") as conn:
        dt.save(sd, os.path.join(job, "t1"), conn=conn).wait()
        dt.commit(os.path.join(job, "t1"), conn=conn, timeout=T)
        dcp.save(sd, storage_writer=dsckpt.dcp.Writer(os.path.join(job, "d1"), conn=conn,
                                                      timeout=T), no_dist=True)
    shared = tmp_path / "shared"
    shutil.copytree(job, shared / "jobB")
    b.proc.kill()
    b.proc.wait()
    shutil.rmtree(b.dir)
    b.dir = None
    node = Daemon(root=str(tmp_path / "empty"),
                  allowed_roots=[{"path": str(tmp_path / "empty"), "remote": f"file://{shared}"}])
    yield node, os.path.join(node.root, "jobB"), shared
    node.stop()


def test_find_latest_and_load_into(replaced):
    node, job, _ = replaced
    with dsckpt.Connection(node.socket, job="jobB") as conn:
        dt.set_default_connection(conn)
        try:
            assert dt.find_latest(job) == "d1"  # the remote latest (DCP's tag came last)
            back = zeros_like(state())
            assert dt.load_into(back, os.path.join(job, "t1"), conn=conn) == "daemon"
            assert equal(back, state())
            assert equal(dt.load(os.path.join(job, "t1"), conn=conn), state())
        finally:
            dt.set_default_connection(None)
    assert os.path.exists(os.path.join(job, "t1", "MANIFEST.json"))
    out = subprocess.run([os.path.join(os.path.dirname(node.proc.args[0]), "dsckptctl"),
                          "verify", os.path.join(job, "t1")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_dcp_reader(replaced):
    node, job, _ = replaced
    with dsckpt.Connection(node.socket, job="jobB") as conn:
        back = zeros_like(state())
        reader = dsckpt.dcp.Reader(os.path.join(job, "d1"), conn=conn)
        dcp.load(back, storage_reader=reader, no_dist=True)
        assert equal(back, state())
        assert set(reader.sources.values()) == {"daemon"}, reader.sources


def test_prefetch_then_cache(replaced):
    node, job, _ = replaced
    got = dsckpt.prefetch(job, "t1", wait=True, socket=node.socket)
    assert got["tag"] == "t1" and got["bytes_pulled"] > 0 and got["bytes_cached"] > 0, got
    with dsckpt.Connection(node.socket, job="jobB") as conn:
        load = conn.load(os.path.join(job, "t1"), "rank0")
        assert load.source == "cache"
        load.close()


def test_corrupt_remote_object(replaced):
    node, job, shared = replaced
    path = shared / "jobB" / "t1" / "rank0.safetensors"
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    with dsckpt.Connection(node.socket, job="jobB") as conn:
        with pytest.raises(dsckpt.DsckptError) as e:
            dt.load_into(zeros_like(state()), os.path.join(job, "t1"), conn=conn)
    assert e.value.code == dsckpt.Errno.ECHECKSUM, e.value
    assert "corrupt" in str(e.value)
    assert not os.path.exists(os.path.join(job, "t1", "MANIFEST.json"))


def test_deepspeed_engine_load(replaced):
    """DeepSpeed's load goes through the engine's load: the file, missing here, is pulled."""
    import dsckpt.deepspeed as dd
    node, job, _ = replaced
    ce = dd.DsckptCheckpointEngine(config={"socket": node.socket, "job": "jobB", "timeout": T})
    assert equal(ce.load(os.path.join(job, "t1", "rank0")), state())
