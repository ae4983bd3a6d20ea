"""The remote tier through the binding (issue 33): a root with an S3 remote (moto's server on
127.0.0.1, from build/venv-moto: skipped without it), ``Level.REMOTE`` and
``SaveHandle.wait_remote()``; the files downloaded from the bucket (with the moto venv's
boto3) open with ``safetensors.safe_open`` and hold the saved tensors; a root without a
remote refuses the wait at once with ENOTSUP; a node lost after REMOTE is restored by a fresh
daemon through ``dsckpt.torch.load`` (S3 and file://); a tag committed twice while a version
uploads: that version reaches REMOTE, ``wait_remote`` on the one skipped raises
CheckpointIncomplete at once, the newest reaches REMOTE."""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest
import torch

import dsckpt
import dsckpt.torch as dt
from dsckpt import Errno, Level

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MOTO = os.environ.get("MOTO_SERVER", os.path.join(REPO, "build", "venv-moto", "bin",
                                                  "moto_server"))
MOTO_PY = os.path.join(os.path.dirname(MOTO), "python")
KEY, SECRET = "AKIDPYTESTREMOTE", "pytest/remote+SECRET0123456789"
T = 120  # seconds

need_moto = pytest.mark.skipif(not os.access(MOTO, os.X_OK),
                               reason=f"no moto_server at {MOTO} (make moto)")


def free_port():
    """A TCP port nothing listens on now."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def boto(port, code):
    """Runs code with an S3 client ``s3`` of the moto venv's boto3; its stdout."""
    prelude = ("import boto3, sys\n"
               f"s3 = boto3.client('s3', endpoint_url='http://127.0.0.1:{port}', "
               f"region_name='us-east-1', aws_access_key_id='{KEY}', "
               f"aws_secret_access_key='{SECRET}')\n")
    return subprocess.run([MOTO_PY, "-c", prelude + code], check=True, capture_output=True,
                          text=True, timeout=T).stdout


@pytest.fixture
def moto():
    """moto's S3 server on a free port with bucket "bkt"; its port."""
    port = free_port()
    log = open(os.path.join(tempfile.gettempdir(), f"pytest-moto.{port}.log"), "ab")
    proc = subprocess.Popen([MOTO, "-H", "127.0.0.1", "-p", str(port)], stdout=log,
                            stderr=log)
    deadline = time.monotonic() + T
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "moto did not start"
            time.sleep(0.1)
    boto(port, "s3.create_bucket(Bucket='bkt')")
    yield port
    proc.kill()
    proc.wait()
    log.close()


@need_moto
def test_wait_remote(make_daemon, moto, tmp_path):
    """A save reaches REMOTE after its commit; the remote holds the file (safetensors opens
    it, tensors exact), the manifest and latest."""
    from safetensors import safe_open
    creds = tmp_path / "creds"
    creds.write_text(f"[default]\naws_access_key_id = {KEY}\n"
                     f"aws_secret_access_key = {SECRET}\n")
    os.chmod(creds, 0o600)
    root = str(tmp_path / "ckpt")
    os.makedirs(root)
    d = make_daemon(root=root, allowed_roots=[{"path": root, "remote": "s3://bkt/pre"}],
                    s3={"endpoint": f"http://127.0.0.1:{moto}", "region": "us-east-1",
                        "addressing": "path", "credentials_file": str(creds)})
    conn = dsckpt.Connection(d.socket, job="job", rank=0, world_size=1)
    state = {"w": torch.arange(4096, dtype=torch.float32).reshape(64, 64),
             "b": torch.ones(7, dtype=torch.bfloat16)}
    tag = os.path.join(root, "job", "step1")
    h = dt.save(state, tag, conn=conn)
    h.wait_durable(T)
    dt.commit(tag, conn=conn, timeout=T)
    assert h.wait_remote(T) == Level.REMOTE
    assert h.level == Level.REMOTE
    out = tmp_path / "down"
    out.mkdir()
    listing = boto(moto, f"""
for k in ['job/step1/rank0.safetensors', 'job/step1/MANIFEST.json', 'job/latest']:
    s3.download_file('bkt', 'pre/' + k, '{out}/' + k.replace('/', '_'))
print(len(s3.list_multipart_uploads(Bucket='bkt').get('Uploads', [])))
""")
    assert listing.strip() == "0"
    assert (out / "job_latest").read_text() == "step1"
    with open(os.path.join(tag, "MANIFEST.json"), "rb") as f:
        assert (out / "job_step1_MANIFEST.json").read_bytes() == f.read()
    with safe_open(str(out / "job_step1_rank0.safetensors"), framework="pt") as f:
        assert torch.equal(f.get_tensor("w"), state["w"])
        assert torch.equal(f.get_tensor("b"), state["b"])
    assert KEY not in d.read_log() and SECRET not in d.read_log()
    conn.close()


def test_wait_remote_without_remote(conn, daemon):
    """A root without a remote tier: wait_remote fails at once with ENOTSUP."""
    tag = os.path.join(daemon.root, "job", "step1")
    h = dt.save({"x": torch.zeros(3)}, tag, conn=conn)
    h.wait_durable(T)
    dt.commit(tag, conn=conn, timeout=T)
    with pytest.raises(dsckpt.DsckptError) as e:
        h.wait_remote(T)
    assert e.value.code == Errno.ENOTSUP
    assert "remote" in str(e.value)


@pytest.mark.parametrize("tier", ["file", "s3"])
def test_load_after_node_lost(make_daemon, tmp_path, request, tier):
    """The whole path through the binding: dsckpt.torch.save, commit, wait_remote; the node
    lost (its daemon SIGKILLed with its cache, its root deleted); a fresh daemon on an empty
    root restores the tag with dsckpt.torch.load from what the upload left remotely: tensors
    exact, the tag committed here again."""
    extra = {}
    if tier == "s3":
        if not os.access(MOTO, os.X_OK):
            pytest.skip(f"no moto_server at {MOTO} (make moto)")
        port = request.getfixturevalue("moto")
        creds = tmp_path / "creds"
        creds.write_text(f"[default]\naws_access_key_id = {KEY}\n"
                         f"aws_secret_access_key = {SECRET}\n")
        os.chmod(creds, 0o600)
        url = "s3://bkt/pre"
        extra["s3"] = {"endpoint": f"http://127.0.0.1:{port}", "region": "us-east-1",
                       "addressing": "path", "credentials_file": str(creds)}
    else:
        (tmp_path / "shared").mkdir()
        url = f"file://{tmp_path / 'shared'}"
    root = str(tmp_path / "ckpt")
    os.makedirs(root)
    roots = [{"path": root, "remote": url}]
    d = make_daemon(root=root, allowed_roots=roots, **extra)
    conn = dsckpt.Connection(d.socket, job="job", rank=0, world_size=1)
    state = {"w": torch.randn(256, 64), "step": torch.tensor([7]), "h": torch.ones(5).half()}
    tag = os.path.join(root, "job", "last")
    h = dt.save(state, tag, conn=conn)
    h.wait_durable(T)
    dt.commit(tag, conn=conn, timeout=T)
    assert h.wait_remote(T) == Level.REMOTE
    conn.close()
    d.proc.kill()           # the node is lost: no SIGTERM, the cache gone with it
    d.proc.wait()
    shutil.rmtree(d.dir, ignore_errors=True)
    d.dir = None
    shutil.rmtree(root)
    os.makedirs(root)
    d2 = make_daemon(root=root, allowed_roots=roots, **extra)
    conn2 = dsckpt.Connection(d2.socket, job="job", rank=0, world_size=1)
    back = dt.load(tag, conn=conn2)
    assert set(back) == set(state)
    for k in state:
        assert torch.equal(back[k], state[k]), k
    assert os.path.exists(os.path.join(tag, "MANIFEST.json"))
    assert "pulled " in d2.read_log()
    conn2.close()


def test_wait_remote_replaced(make_daemon, tmp_path):
    """A fixed tag saved more often than one upload takes (file://, 1 MiB/s): versions 2 and
    3 committed while version 1 still uploads. Version 1 goes on to REMOTE; wait_remote on
    version 2, skipped, raises CheckpointIncomplete at once, its message naming the newer
    version; version 3 reaches REMOTE, the only version directory left remotely."""
    shared = tmp_path / "shared"
    shared.mkdir()
    root = str(tmp_path / "ckpt")
    os.makedirs(root)
    d = make_daemon(root=root, allowed_roots=[{"path": root, "remote": f"file://{shared}"}],
                    upload_max_mib_per_s=1)
    conn = dsckpt.Connection(d.socket, job="job", rank=0, world_size=1)
    tag = os.path.join(root, "job", "last")

    def commit(tensor):
        h = dt.save({"w": tensor}, tag, conn=conn)
        h.wait_durable(T)
        dt.commit(tag, conn=conn, timeout=T)
        return h

    assert commit(torch.ones(8)).wait_remote(T) == Level.REMOTE
    h1 = commit(torch.randn(4 << 20))
    deadline = time.monotonic() + T
    while not any(".dsckpt-upload-" in n for _, _, names in os.walk(shared) for n in names):
        assert time.monotonic() < deadline, "version 1's upload never started"
        time.sleep(0.02)
    h2 = commit(torch.zeros(8))
    h3 = commit(torch.full((8,), 3.0))
    with pytest.raises(dsckpt.CheckpointIncomplete) as e:
        h2.wait_remote(T)
    assert e.value.code == Errno.EINCOMPLETE
    assert "will never be REMOTE" in str(e.value) and "committed again" in str(e.value)
    assert h1.wait_remote(T) == Level.REMOTE
    assert h3.wait_remote(T) == Level.REMOTE
    assert [n for n in os.listdir(shared / "job" / "last") if n.startswith("v")] == \
        [json.load(open(shared / "job" / "last" / "MANIFEST.json"))["remote_dir"]]
    conn.close()
