"""Ordinary CPU tensors (memory torch allocated) are copied by the library at a save: the
first save that copies 1 MiB or more says so once per process, in a dsckpt HostCopyWarning
naming dsckpt.torch.host_empty, and never again; host_empty memory and small tensors are not
warned about; and what was copied is what loads back, also when the library's staging memory
is reused by the next saves (tests/check_client_stage.c checks the reuse itself)."""
import os
import warnings

import pytest
import torch

import dsckpt.torch as dt
from dsckpt import _stage


@pytest.fixture
def fresh_warning(monkeypatch):
    """As in a new process: the copy warning not said yet."""
    monkeypatch.setattr(_stage, "_copy_warned", False)


def saved(conn, daemon, state, tag):
    """Saves state into tag of job "copy" and waits until it is durable; the directory."""
    path = os.path.join(daemon.root, "copy", tag)
    h = dt.save(state, path, conn=conn)
    h.wait_snapshot()
    h.wait_durable()
    return path


def copy_warnings(record):
    """The HostCopyWarnings recorded."""
    return [w for w in record if issubclass(w.category, _stage.HostCopyWarning)]


def test_warned_once_with_the_way_out(conn, daemon, fresh_warning):
    """Two saves of 2 MiB plain tensors: one warning, at the first, naming the tensor and
    host_empty; both load back equal."""
    a, b = torch.randn(1 << 19), torch.randn(1 << 19)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        first = saved(conn, daemon, {"weight": a}, "s1")
        second = saved(conn, daemon, {"other": b}, "s2")
    said = copy_warnings(record)
    assert len(said) == 1, [str(w.message) for w in said]
    text = str(said[0].message)
    assert "host_empty" in text and "'weight'" in text and "2.0 MiB" in text
    assert torch.equal(dt.load(first)["weight"], a)
    assert torch.equal(dt.load(second)["other"], b)


def test_no_warning_without_a_copy(conn, daemon, fresh_warning):
    """host_empty memory (handed over by reference) and tensors under 1 MiB in all: nothing."""
    h = dt.host_empty((1 << 19,), torch.float32)
    h.copy_(torch.randn(1 << 19))
    small = torch.randn(1000)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        path = saved(conn, daemon, {"h": h, "small": small}, "s3")
    assert copy_warnings(record) == []
    back = dt.load(path)
    assert torch.equal(back["h"], h) and torch.equal(back["small"], small)


def test_staging_memory_reused_holds_each_saves_bytes(conn, daemon):
    """Saves of the same 40 MiB plain tensor, changed between saves: the library's staging
    memory serves the later saves again, and each file holds the values of its own save."""
    t = torch.zeros(10 << 20)
    paths = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", _stage.HostCopyWarning)
        for i in range(3):
            t.fill_(float(i + 1))
            paths.append(saved(conn, daemon, {"t": t}, f"r{i}"))
    for i, path in enumerate(paths):
        assert torch.equal(dt.load(path)["t"], torch.full((10 << 20,), float(i + 1)))
