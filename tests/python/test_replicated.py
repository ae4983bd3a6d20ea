"""The level REPLICATED through the binding (issue 35): ``Level.REPLICATED`` and
``SaveHandle.wait_replicated()`` against one daemon. With peer copies off the wait fails at
once with ENOTSUP; with them on, a job of one node has no other node to hold a copy, and the
wait fails with CheckpointIncomplete (EINCOMPLETE) naming 0 copies of 1 and why. A job of
several nodes reaching REPLICATED is tests/check_peer_level.c's (network namespaces)."""
import os
import random

import pytest
import torch

import dsckpt
import dsckpt.torch as dt
from dsckpt import Errno, Level

T = 60


def test_level_value():
    """REPLICATED is the level after REMOTE, as in dsckpt.h."""
    assert Level.REPLICATED == 6 and Level.REPLICATED > Level.REMOTE


def test_wait_replicated_peer_copies_off(conn, daemon):
    """No peer_secret_file: wait_replicated fails at once with ENOTSUP; the save is
    COMMITTED."""
    tag = os.path.join(daemon.root, "job", "step1")
    h = dt.save({"x": torch.zeros(3)}, tag, conn=conn)
    h.wait_durable(T)
    dt.commit(tag, conn=conn, timeout=T)
    with pytest.raises(dsckpt.errors.NotSupported) as e:
        h.wait_replicated(T)
    assert e.value.code == Errno.ENOTSUP
    assert "peer copies are off" in str(e.value)
    assert h.wait(Level.COMMITTED, T) == Level.COMMITTED


def test_wait_replicated_no_other_node(make_daemon, tmp_path, monkeypatch):
    """Peer copies on, but the job's only node is this one: the copies settle at 0 of 1 and
    wait_replicated raises CheckpointIncomplete naming them, not a timeout."""
    monkeypatch.setenv("UCX_TLS", "tcp")
    monkeypatch.setenv("UCX_NET_DEVICES", "lo")
    secret = tmp_path / "secret"
    secret.write_text("replicated-pytest-secret-0123456789")
    os.chmod(secret, 0o600)
    d = make_daemon(peer_secret_file=str(secret), peer_port=random.randint(20000, 40000),
                    replica_cache_size=0.0625, host="127.0.0.1")
    with dsckpt.Connection(d.socket, job="pytest", rank=0, world_size=1) as conn:
        tag = os.path.join(d.root, "job", "step1")
        h = dt.save({"x": torch.arange(10.0)}, tag, conn=conn)
        h.wait_durable(T)
        dt.commit(tag, conn=conn, timeout=T)
        with pytest.raises(dsckpt.errors.CheckpointIncomplete) as e:
            h.wait_replicated(T)
        assert e.value.code == Errno.EINCOMPLETE
        assert "held by 0 of 1 peers" in str(e.value)
        assert h.wait(Level.COMMITTED, T) == Level.COMMITTED
