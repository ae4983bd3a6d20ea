"""A save of more tensors than the daemon's max_tensors_per_save is refused at once: the
library knows the limit from HELLO (Connection.max_tensors), dsckpt.torch.save stops its walk
at the first tensor too many, and Connection.plan and Save.add_tensors refuse a larger list
before staging or sending any of it. The error (LimitReached) names the limit; the daemon
never sees a tensor of the refused save. A save of exactly the limit works."""
import os

import pytest
import torch

import dsckpt
import dsckpt.torch as dt

LIMIT = 1000


@pytest.fixture
def small_limit(make_daemon):
    """A daemon with max_tensors_per_save = LIMIT and a connection to it."""
    d = make_daemon(max_tensors_per_save=LIMIT)
    c = dsckpt.Connection(d.socket, job="many", rank=0, world_size=1)
    yield d, c
    c.close()


def tensor_requests(d):
    """The daemon's log lines of requests that carry tensors."""
    return [ln for ln in d.read_log().split("\n")
            if any(f": {kind} of" in ln for kind in ("PLAN_ADD", "SAVE_ADD", "SAVE_END"))]


def test_torch_save_refused_at_once(small_limit):
    """dsckpt.torch.save of LIMIT + 1 tensors: LimitReached naming the limit and the tensor
    too many, nothing of it in the daemon; LIMIT tensors save and load back."""
    d, c = small_limit
    assert c.max_tensors == LIMIT
    state = {f"t{i}": torch.full((2,), float(i)) for i in range(LIMIT + 1)}
    with pytest.raises(dsckpt.LimitReached) as e:
        dt.save(state, os.path.join(d.root, "many", "s1"), conn=c)
    assert f"max_tensors_per_save is {LIMIT}" in str(e.value)
    assert f"'t{LIMIT}' is one too many" in str(e.value)
    assert tensor_requests(d) == []
    del state[f"t{LIMIT}"]
    path = os.path.join(d.root, "many", "s2")
    dt.save(state, path, conn=c).wait_durable()
    back = dt.load(path)
    assert len(back) == LIMIT and torch.equal(back["t999"], state["t999"])


def test_plan_and_add_tensors_refused_at_once(small_limit):
    """The binding: a plan and a save's add_tensors of LIMIT + 1 tensors fail with
    LimitReached before anything is staged or sent."""
    d, c = small_limit
    buf = dsckpt.HostBuffer((LIMIT + 1) * 8)
    specs = [(f"p{i}", "U8", (8,), buf.ptr + 8 * i, 8) for i in range(LIMIT + 1)]
    with pytest.raises(dsckpt.LimitReached, match=f"a plan of {LIMIT + 1} tensors"):
        c.plan(specs)
    heap = torch.zeros(LIMIT + 1, 8, dtype=torch.uint8)   # memory the library would stage
    s = c.save(os.path.join(d.root, "many", "s3"), "rank0")
    with pytest.raises(dsckpt.LimitReached, match=f"max_tensors_per_save is {LIMIT}"):
        s.add_tensors([(f"h{i}", "U8", (8,), heap[i].data_ptr(), 8) for i in range(LIMIT + 1)])
    s.close()   # abandoned: never ended
    assert tensor_requests(d) == []
