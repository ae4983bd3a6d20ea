"""tests/python/test_handover.py again with the modern torch (TensorGuards proves dtypes,
shapes, strides and requires_grad there; torch 1.13 compares lists), and dsckpt.dcp's
Writer through the same plan cache."""
import os

import pytest
import torch

import dsckpt.torch as dt
from dsckpt import _handover
from test_handover import *  # noqa: F401,F403 - collected here too
from test_handover import T


def test_tensor_guards_in_use():
    assert _handover._guard_class() is not None


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_dcp_writer_saves_through_the_cache(daemon, conn):
    """dsckpt.dcp's Writer goes through the same plan cache: the second checkpoint of the
    same tensors is warm, and what changed in place in between is what it saves."""
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    import dsckpt.dcp
    sd = {"w": dt.host_empty((4, 6)).fill_(1), "b": torch.zeros(3), "step": torch.tensor(1.0)}
    before = dict(_handover.counts(conn))
    for i in range(3):
        sd["w"].add_(1)
        sd["step"].add_(1)
        tag = os.path.join(daemon.root, "pytest", f"dcp{i}")
        dcp.save(sd, storage_writer=dsckpt.dcp.Writer(tag, conn=conn, timeout=T), no_dist=True)
        back = {"w": torch.zeros(4, 6), "b": torch.ones(3), "step": torch.tensor(0.0)}
        dcp.load(back, storage_reader=dsckpt.dcp.Reader(tag, conn=conn), no_dist=True)
        for k in sd:
            assert torch.equal(back[k], sd[k]), (i, k)
    after = _handover.counts(conn)
    assert after.get("cold", 0) - before.get("cold", 0) == 1
    assert after.get("warm", 0) - before.get("warm", 0) == 2
