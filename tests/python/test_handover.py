"""dsckpt.torch.save's cached hand-over (issue 14): a save of an unchanged structure goes
through a save plan ("warm") and writes exactly the files a walked ("cold") save writes; any
change (values in place, reallocated memory, keys, dtypes, shapes, pointers, leaves) still
saves exactly what the state dict holds. Also run with torch 2.x by tests/python/modern."""
import collections
import ctypes
import dataclasses
import enum
import json
import math
import os
import pickle
import time

import pytest
import torch

import dsckpt
import dsckpt.torch as dt
from dsckpt import _blob, _handover, _tree
from dsckpt._files import read_meta

T = 60


def gpt_like(n=8):
    """A small model's and AdamW's state dict in dsckpt host memory, the way a trainer holds
    them: weights (one buffer, views), optimizer states, CPU step scalars (pageable), an
    OrderedDict with _metadata, param_groups with an lr."""
    buf = dt.host_empty((n, 4, 4), torch.float32)
    buf.copy_(torch.arange(n * 16, dtype=torch.float32).reshape(n, 4, 4))
    model = collections.OrderedDict((f"layers.{i}.weight", buf[i]) for i in range(n))
    model["norm.bias"] = dt.host_empty((4,), torch.bfloat16).fill_(0.5)
    model._metadata = collections.OrderedDict([("", {"version": 1})])
    state = {}
    for i in range(n + 1):
        shape = (4, 4) if i < n else (4,)
        state[i] = {"step": torch.tensor(float(i)),
                    "exp_avg": dt.host_empty(shape, torch.float32).fill_(i),
                    "exp_avg_sq": dt.host_empty(shape, torch.float32).fill_(-i)}
    optim = {"state": state, "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.95),
                                               "params": list(range(n + 1))}]}
    extra = [torch.ones(3, 2).t(), torch.arange(12.0).reshape(3, 4)[:, ::2]]  # copied
    return {"model": model, "optim": optim, "step": 7, "extra": extra}


def fresh(state):
    """The state dict again as a trainer builds it each checkpoint: new dict objects and new
    tensor objects over the same memory (model.state_dict() detaches every call)."""
    model = collections.OrderedDict((k, v.detach()) for k, v in state["model"].items())
    model._metadata = collections.OrderedDict(state["model"]._metadata)
    optim = {"state": {k: dict(v) for k, v in state["optim"]["state"].items()},
             "param_groups": [dict(g) for g in state["optim"]["param_groups"]]}
    return {"model": model, "optim": optim, "step": state["step"], "extra": list(state["extra"])}


def save(conn, root, tag, state, file="rank0"):
    """Saves, waits DURABLE; returns (directory, handle)."""
    d = os.path.join(root, "job", tag)
    h = dt.save(state, d, conn=conn, file=file)
    h.wait_durable(T)
    return d, h


def files(d, file="rank0"):
    """The .safetensors bytes and the decoded .meta blob of a save."""
    with open(os.path.join(d, file + ".safetensors"), "rb") as f:
        tensors = f.read()
    info = _blob.read(read_meta(os.path.join(d, file + ".meta"))[_blob.BLOB], d, False)
    decoded = dict(info, tables=_blob.tables(info), leaves=_tree.decode(info["leaves"]))
    return tensors, decoded


def same(a, b, path="state"):
    """Deep equality of loaded state dicts: types, keys, dtypes, shapes, strides, values."""
    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape, a.stride()) == (b.dtype, b.shape, b.stride()), path
        assert torch.equal(a, b), f"{path}: values differ"
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys differ"
        for k in a:
            same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}.{i}")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def test_warm_save_writes_the_cold_save_files(daemon, conn):
    state = gpt_like()
    d0, h0 = save(conn, daemon.root, "t0", fresh(state))
    d1, h1 = save(conn, daemon.root, "t1", fresh(state))
    assert (h0.handover, h1.handover) == ("cold", "warm")
    assert h1.ntensors == h0.ntensors and h1.nbytes == h0.nbytes
    with dsckpt.Connection(daemon.socket, job="pytest", rank=0, world_size=1) as other:
        d2, h2 = save(other, daemon.root, "t2", fresh(state))  # cold again, elsewhere
    assert h2.handover == "cold"
    assert files(d1) == files(d0) == files(d2)
    back = dt.load(d1, conn=conn)
    same(back, state)
    assert back["model"]._metadata == state["model"]._metadata
    assert back["model"]["layers.0.weight"].data_ptr() + 64 == \
        back["model"]["layers.1.weight"].data_ptr()  # views of one buffer stay views
    assert _handover.counts(conn) == {"cold": 1, "warm": 1}


def test_in_place_changes_go_through_the_plan(daemon, conn):
    state = gpt_like()
    save(conn, daemon.root, "a", fresh(state))
    for i in range(3):
        state["model"]["layers.1.weight"].add_(1)  # the optimizer step, in place
        state["optim"]["state"][2]["step"].add_(1)  # pageable, staged every save
        state["optim"]["state"][3]["exp_avg"].mul_(3)
        state["optim"]["param_groups"][0]["lr"] *= 0.5  # an lr scheduler: only a leaf
        state["step"] += 1
        d, h = save(conn, daemon.root, f"b{i}", fresh(state))
        assert h.handover == "warm"
        same(dt.load(d, conn=conn), state)
        state_into = fresh(gpt_like())
        assert dt.load_into(state_into, d, conn=conn) == "daemon"
        for k, v in state["model"].items():
            assert torch.equal(state_into["model"][k], v), k


def test_reallocated_host_memory_is_saved_exactly(daemon, conn):
    """Host tensors freed and allocated again (the allocator may hand back the very same
    addresses): the save holds the new memory's bytes, through a plan sent whole again or
    a new plan, never the old memory's."""
    shapes = [(64,), (8, 8), (3,)]
    tensors = [dt.host_empty(s).fill_(1) for s in shapes]
    save(conn, daemon.root, "r0", {"w": list(tensors)})
    save(conn, daemon.root, "r1", {"w": list(tensors)})
    ptrs = [t.data_ptr() for t in tensors]
    del tensors
    for round_ in range(2, 5):
        tensors = [dt.host_empty(s).fill_(round_) for s in shapes]
        d, h = save(conn, daemon.root, f"r{round_}", {"w": list(tensors)})
        moved = [t.data_ptr() for t in tensors] != ptrs
        assert h.handover == ("cold" if moved else "resent"), (moved, h.handover)
        back = dt.load(d, conn=conn)
        for got, want in zip(back["w"], tensors):
            assert torch.equal(got, want)
        d, h = save(conn, daemon.root, f"r{round_}b", {"w": list(tensors)})
        assert h.handover == "warm"
        ptrs = [t.data_ptr() for t in tensors]
        del tensors, back


def test_staging_buffer_in_use_is_not_overwritten(daemon, conn):
    """The step scalars ride in a buffer the daemon reads until SNAPSHOT; a buffer whose
    last save's level cannot be known (closed before SNAPSHOT was seen) is not written: that
    save adds its tensors one by one, and the file is the same."""
    state = gpt_like()
    h0 = dt.save(fresh(state), os.path.join(daemon.root, "job", "s0"), conn=conn)
    h0.save.close()  # its buffer's reader is now unknown
    _, h1 = save(conn, daemon.root, "s1", fresh(state))
    entry = conn._dsckpt_handover.entries["rank0"]
    state["optim"]["state"][1]["step"].add_(5)
    d2, h2 = save(conn, daemon.root, "s2", fresh(state))  # the first buffer again: busy
    assert (h0.handover, h1.handover, h2.handover) == ("cold", "warm", "warm")
    assert entry.handing.stage.buffers[0].last is h0.save  # not taken over by s2
    with dsckpt.Connection(daemon.socket, job="pytest", rank=0, world_size=1) as other:
        d3, _ = save(other, daemon.root, "s3", fresh(state))
    assert files(d2) == files(d3)
    same(dt.load(d2, conn=conn), state)


def test_offset_of_a_lone_view_stays_warm(daemon, conn):
    """A tensor alone in its storage, now at the same address in another storage at another
    offset: nothing the file or a load gives changes (a lone view is loaded the same at any
    offset), so the save stays warm and loads equal."""
    state = gpt_like()
    save(conn, daemon.root, "o0", fresh(state))
    s = fresh(state)
    w = s["optim"]["state"][1]["exp_avg"]
    other = (ctypes.c_uint8 * (w.numel() * 4 + 64)).from_address(w.data_ptr() - 64)
    moved = torch.frombuffer(other, dtype=torch.float32)[16:].view(w.shape)
    assert (moved.data_ptr(), moved.storage_offset()) == (w.data_ptr(), 16) != \
        (w.data_ptr(), w.storage_offset())
    s["optim"]["state"][1]["exp_avg"] = moved
    d, h = save(conn, daemon.root, "o1", s)
    assert h.handover == "warm", h.handover
    same(dt.load(d, conn=conn), s)


CHANGES = ["add key", "remove key", "dtype", "shape", "pointer", "requires_grad", "parameter",
           "same object twice", "offset", "leaf tensor", "leaf type", "container"]


@pytest.mark.parametrize("change", CHANGES)
def test_any_change_saves_exactly(daemon, conn, change):
    state = gpt_like()
    save(conn, daemon.root, "c0", fresh(state))
    s = fresh(state)
    w = s["model"]["layers.2.weight"]
    if change == "add key":
        s["model"]["new"] = dt.host_empty((2,)).fill_(3)
    elif change == "remove key":
        del s["optim"]["state"][0]["exp_avg_sq"]
    elif change == "dtype":
        s["model"]["layers.2.weight"] = w.view(torch.int32)
    elif change == "shape":
        s["model"]["layers.2.weight"] = w.view(16)
    elif change == "pointer":
        s["model"]["layers.2.weight"] = dt.host_empty((4, 4)).fill_(9)
    elif change == "requires_grad":
        s["model"]["layers.2.weight"] = w.detach().requires_grad_(True)
    elif change == "parameter":
        s["model"]["layers.2.weight"] = torch.nn.Parameter(w, requires_grad=False)
    elif change == "same object twice":
        s["optim"]["state"][0]["exp_avg_sq"] = s["optim"]["state"][0]["exp_avg"]
    elif change == "offset":  # same pointer, another storage (base) and offset
        other = (ctypes.c_uint8 * 128).from_address(w.data_ptr() - 64)
        s["model"]["layers.2.weight"] = torch.frombuffer(other, dtype=torch.float32)[16:].view(4, 4)
        assert s["model"]["layers.2.weight"].data_ptr() == w.data_ptr()
        assert s["model"]["layers.2.weight"].storage_offset() != w.storage_offset()
    elif change == "leaf tensor":
        s["optim"]["param_groups"][0]["betas"] = (torch.ones(1), 0.95)
    elif change == "leaf type":
        s["optim"]["param_groups"][0]["lr"] = 1
    elif change == "container":
        s["extra"] = tuple(s["extra"])
    d, h = save(conn, daemon.root, "c1", s)
    if change == "leaf type":
        assert h.handover == "warm"  # leaves are encoded afresh every save
    else:
        assert h.handover == "cold", h.handover
    with dsckpt.Connection(daemon.socket, job="pytest", rank=0, world_size=1) as other:
        d2, _ = save(other, daemon.root, "c2", s)
    assert files(d) == files(d2)
    back = dt.load(d, conn=conn)
    same(back, s)
    if change == "same object twice":
        assert back["optim"]["state"][0]["exp_avg_sq"] is back["optim"]["state"][0]["exp_avg"]
    if change == "parameter":
        assert isinstance(back["model"]["layers.2.weight"], torch.nn.Parameter)
    _, h = save(conn, daemon.root, "c3", s)
    assert h.handover == "warm"


LEAF_CHANGES = ["none", "lr", "metadata in place", "minus zero", "one dict twice"]


@pytest.mark.parametrize("change", LEAF_CHANGES)
def test_leaves_are_encoded_again_exactly_when_they_change(daemon, conn, change):
    state = gpt_like()
    state["model"]._metadata["x"] = {"version": 1}
    state["optim"]["param_groups"][0]["lr"] = 0.0
    save(conn, daemon.root, "l0", fresh(state))
    entry = _handover.cache(conn).get("rank0")
    kept = entry.leaves
    s = fresh(state)
    if change == "lr":
        s["optim"]["param_groups"][0]["lr"] = 2e-3
    elif change == "metadata in place":  # the inner dicts are the ones the last save had
        state["model"]._metadata[""]["version"] = 2
        assert s["model"]._metadata[""]["version"] == 2
    elif change == "minus zero":
        s["optim"]["param_groups"][0]["lr"] = -0.0
    elif change == "one dict twice":
        s["model"]._metadata["x"] = s["model"]._metadata[""]
    d, h = save(conn, daemon.root, "l1", s)
    assert h.handover == "warm"
    assert (entry.leaves is kept) == (change == "none")
    with dsckpt.Connection(daemon.socket, job="pytest", rank=0, world_size=1) as other:
        d2, _ = save(other, daemon.root, "l2", s)
    assert files(d) == files(d2)
    back = dt.load(d, conn=conn)
    lr = back["optim"]["param_groups"][0]["lr"]
    assert math.copysign(1, lr) == (-1 if change == "minus zero" else 1)
    assert back["model"]._metadata[""]["version"] == (2 if change == "metadata in place" else 1)
    assert (back["model"]._metadata["x"] is back["model"]._metadata[""]) == \
        (change == "one dict twice")
    state["model"]._metadata[""]["version"] = 1
    s = fresh(state)  # the first save's leaves again
    d, h = save(conn, daemon.root, "l3", s)
    assert h.handover == "warm"
    with dsckpt.Connection(daemon.socket, job="pytest", rank=0, world_size=1) as other:
        d2, _ = save(other, daemon.root, "l4", s)
    assert files(d) == files(d2)


def test_leaves_that_change_every_save_are_encoded_without_a_copy(daemon, conn):
    """A scheduler's lr changes at every save: those leaves are encoded without a copy; once
    they encode as the last save's did they are copied again, and the next save reuses that
    encoding; every file has its own lr."""
    state = gpt_like()
    lrs = [1e-3, 2e-3, 3e-3, 3e-3, 3e-3, 4e-3]
    kept = []
    for i, lr in enumerate(lrs):
        state["optim"]["param_groups"][0]["lr"] = lr
        d, h = save(conn, daemon.root, f"c{i}", fresh(state))
        assert h.handover == ("cold" if i == 0 else "warm")
        kept.append(_handover.cache(conn).get("rank0").leaves)
        assert dt.load(d, conn=conn)["optim"]["param_groups"][0]["lr"] == lr
    assert [k.frozen is not None for k in kept] == [True, False, False, True, True, False]
    assert kept[4] is kept[3] and kept[5] is not kept[4]


def test_structures_without_a_cache_are_walked_every_time(daemon, conn):
    shared = {"w": torch.ones(2)}
    cases = [{"a": shared, "b": shared},                 # one container twice
             {"c": torch.tensor([1 + 2j]), "f": torch.ones(2)},  # a dtype the file lacks
             {1.5: torch.ones(2)}]                        # a key that is not str or int
    for i, state in enumerate(cases):
        for j in range(2):
            d, h = save(conn, daemon.root, f"p{i}{j}", state, file=f"f{i}")
            assert h.handover == "plain"
            back = dt.load(d, f"f{i}", conn=conn, weights_only=i != 1)  # 1: pickled
            assert list(back) == list(state)
    assert back[1.5].sum() == 2


def test_files_and_connections_have_their_own_plans(daemon, conn):
    a, b = gpt_like(2), gpt_like(3)
    assert save(conn, daemon.root, "f0", fresh(a), file="x")[1].handover == "cold"
    assert save(conn, daemon.root, "f0", fresh(b), file="y")[1].handover == "cold"
    assert save(conn, daemon.root, "f1", fresh(a), file="x")[1].handover == "warm"
    d, h = save(conn, daemon.root, "f1", fresh(b), file="y")
    assert h.handover == "warm"
    same(dt.load(d, "y", conn=conn), b)


def test_cache_keeps_the_most_recently_used_file_names(daemon, conn, monkeypatch):
    monkeypatch.setattr(_handover, "MAX_ENTRIES", 2)
    state = gpt_like(2)
    for file in ("a", "b", "a", "c"):  # c evicts b, the least recently used
        save(conn, daemon.root, "lru", fresh(state), file=file)
    entries = conn._dsckpt_handover.entries
    assert list(entries) == ["a", "c"]
    assert save(conn, daemon.root, "lru2", fresh(state), file="a")[1].handover == "warm"
    assert save(conn, daemon.root, "lru2", fresh(state), file="b")[1].handover == "cold"


def test_refused_start_is_raised_and_the_cache_goes_on(daemon, conn, monkeypatch):
    """The save's start goes out early (the daemon makes the directory and the file while the
    library proves or walks); what the daemon refuses there is raised by dt.save, warm or
    cold, with its reason, and the next save is warm and exact."""
    early = []
    real = dsckpt.Connection.save
    monkeypatch.setattr(dsckpt.Connection, "save", lambda self, *a, **kw: (
        early.append(kw.get("early", False)), real(self, *a, **kw))[1])
    state = gpt_like(2)
    save(conn, daemon.root, "r0", fresh(state))
    busy = os.path.join(daemon.root, "job", "r1")
    with conn.save(busy, "rank0"):  # the file is being saved
        with pytest.raises(dsckpt.DsckptError, match="already being saved") as e:
            dt.save(fresh(state), busy, conn=conn)
        assert e.value.code == dsckpt.Errno.EBUSY
        with pytest.raises(dsckpt.DsckptError, match="already being saved"):
            dt.save(fresh(state), busy, conn=conn, file="rank0")
    os.symlink("/tmp", os.path.join(daemon.root, "escape"))
    with pytest.raises(dsckpt.DsckptError):
        dt.save(fresh(state), os.path.join(daemon.root, "escape", "r2"), conn=conn,
                file="other")  # cold: walked, then refused
    assert early.count(True) == 4  # each dt.save started early
    d, h = save(conn, daemon.root, "r3", fresh(state))
    assert h.handover == "warm"
    same(dt.load(d, conn=conn), state)


def test_blob_version_1_still_loads(daemon, conn, tmp_path):
    """A file written before blob v2 (tensors as _TensorRef placeholders, tables inline)."""
    state = {"w": torch.arange(6.0).reshape(2, 3), "n": [3, "x"], "t": (torch.ones(1),)}
    d, _ = save(conn, daemon.root, "v1", state)
    views, entries = _blob.tables(_blob.read(read_meta(os.path.join(d, "rank0.meta"))[
        _blob.BLOB], d))
    from dsckpt._flatten import _TensorRef
    old = {"w": _TensorRef(0), "n": [3, "x"], "t": (_TensorRef(1),)}
    v1 = pickle.dumps({"format": _blob.BLOB, "version": 1, "torch": torch.__version__,
                       "views": views, "entries": entries,
                       "skeleton": pickle.dumps(old, protocol=4)}, protocol=4)
    name = _blob.BLOB.encode()  # .meta: a msgpack map of str → bin
    (tmp_path / "rank0.meta").write_bytes(b"\x81" + bytes([0xa0 | len(name)]) + name + b"\xc6"
                                          + len(v1).to_bytes(4, "big") + v1)
    os.link(os.path.join(d, "rank0.safetensors"), tmp_path / "rank0.safetensors")
    with pytest.raises(dsckpt.PickleRefused, match="weights_only=False"):
        dt.load(str(tmp_path), "rank0")  # a pickle: loaded only when asked
    same(dt.load(str(tmp_path), "rank0", weights_only=False), state)


def test_save_flags_deferred_or_early(daemon, conn):
    """A save is deferred or early, not both: the library's reason is raised."""
    with pytest.raises(dsckpt.errors.InvalidArgument, match="not both"):
        conn.save(os.path.join(daemon.root, "job", "flags"), "rank0", defer=True, early=True)


def test_plan_binding(daemon, conn):
    buf = dsckpt.HostBuffer(4096)
    arr = buf.numpy("float32")
    arr[:] = 5
    spec = [("a", "F32", (512,), buf.ptr, 2048), ("b", "F32", (512,), buf.ptr + 2048, 2048)]
    with conn.plan(spec) as plan:
        assert plan.count == 2 and not plan.closed
        d = os.path.join(daemon.root, "job", "bind")
        with conn.save(d, "rank0") as s:
            s.prepare_plan(plan)  # host memory: nothing to ask the driver, nothing started
            assert s.add_plan(plan) is False
            s.add_tensors([("c", "F32", (1,), arr[:1].ctypes.data, 4)])  # staged beside it
        with pytest.raises(dsckpt.errors.DsckptError):
            s.prepare_plan(plan)  # ended
        s.wait(dsckpt.Level.DURABLE, T)
        s.close()
        with dsckpt.Connection(daemon.socket, job="pytest", rank=0, world_size=1) as other:
            s2 = other.save(os.path.join(daemon.root, "job", "other"), "rank0")
            with pytest.raises(dsckpt.errors.InvalidArgument, match="another connection"):
                s2.prepare_plan(plan)
            s2.close()  # never ended: abandoned
    assert plan.closed
    plan.close()  # idempotent
    back = dt.read_safetensors(os.path.join(d, "rank0.safetensors"))
    assert sorted(back) == ["a", "b", "c"] and back["b"].sum() == 5 * 512
    import numpy as np
    pageable = np.ones(4, dtype=np.float32)
    with pytest.raises(dsckpt.errors.NotSupported):
        conn.plan([("p", "F32", (4,), pageable.ctypes.data, 16)])
    with pytest.raises(dsckpt.errors.InvalidArgument):
        conn.plan([])
    assert dsckpt.core.in_host_buffer(buf.ptr + 100, 10)
    assert not dsckpt.core.in_host_buffer(buf.ptr + 4090, 10)
    assert not dsckpt.core.in_host_buffer(pageable.ctypes.data, 4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: GPU path not run")
def test_cuda_fork_during_a_prepared_save(daemon, conn, monkeypatch):
    """A fork (a DataLoader worker starting) while the library's look thread asks the driver
    about a prepared plan. The child prepares the plan again (which drops the look the parent
    had and queues one for a thread of its own: no I/O, all GPU tensors) and exits; it must
    come out of both. The parent's saves go on warm and save exactly what the tensors hold."""
    state = {f"w{i}": torch.randn(300_000 + i, device="cuda") for i in range(48)}
    save(conn, daemon.root, "f0", state)
    prepare, match = _handover._Handing.prepare, _handover.Shape.match
    children, prepared = [], []

    def preparing(self, s):
        """_Handing.prepare, remembered."""
        prepared.append((self, s))
        return prepare(self, s)

    def forking(self, root):
        """Shape.match, after a fork (the look thread was given the plan just before)."""
        pid = os.fork()
        if pid == 0:
            handing, s = prepared[-1]
            handing.prepare(s)
            handing.prepare(s)
            os._exit(0)
        children.append(pid)
        return match(self, root)

    monkeypatch.setattr(_handover._Handing, "prepare", preparing)
    monkeypatch.setattr(_handover.Shape, "match", forking)
    for i in range(3):
        for t in state.values():
            t.add_(1)
        d, h = save(conn, daemon.root, f"f{i + 1}", state)
        assert h.handover == "warm", h.handover
        same(dt.load(d, conn=conn), state)
    deadline = time.monotonic() + T
    for pid in children:
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        if done[0] == 0:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail(f"child {pid} hung after fork")
        assert os.WIFEXITED(done[1]) and os.WEXITSTATUS(done[1]) == 0, done


Pair = collections.namedtuple("Pair", "tensor n")


@dataclasses.dataclass
class Fragment:
    numel: int
    start: int


class Stage(int, enum.Enum):
    optimizer_states = 1
    gradients = 2


class Scaler:
    """A loss scaler as DeepSpeed's: attributes only."""

    def __init__(self, scale):
        self.cur_scale = scale
        self.dtype = torch.float16

    def __eq__(self, other):
        return type(other) is Scaler and vars(other) == vars(self)


def zero_like(state):
    """A ZeRO optimizer file's state dict around a trainer's: allowed objects among the
    leaves (loss scaler, stage, fragment addresses) and a namedtuple holding a tensor."""
    return {"optimizer_state_dict": {
        "loss_scaler": Scaler(65536.0), "dynamic_loss_scale": True, "overflow": False,
        "zero_stage": Stage.gradients, "base_optimizer_state": state["optim"],
        "single_partition_of_fp32_groups": [state["model"]["layers.0.weight"]],
        "param_slice_mappings": [collections.OrderedDict(
            (k, Fragment(16, 16 * i)) for i, k in enumerate(state["model"]))],
        "pair": Pair(state["model"]["norm.bias"], 3)}}


def test_warm_save_of_allowed_objects(daemon, conn, allowlist):
    dsckpt.add_safe_types([Pair, Fragment, Stage, Scaler])
    state = gpt_like()
    d0, h0 = save(conn, daemon.root, "z0", zero_like(fresh(state)))
    d1, h1 = save(conn, daemon.root, "z1", zero_like(fresh(state)))
    assert (h0.handover, h1.handover) == ("cold", "warm")
    with dsckpt.Connection(daemon.socket, job="pytest", rank=0, world_size=1) as other:
        d2, h2 = save(other, daemon.root, "z2", zero_like(fresh(state)))
    assert h2.handover == "cold"
    assert files(d1) == files(d0) == files(d2)
    head = json.loads(files(d1)[1]["header"])
    assert head["safe"] == sorted(_tree.type_name(c) for c in (Pair, Fragment, Stage, Scaler))
    back = dt.load(d1, conn=conn)  # no pickle: weights_only's default
    same(back, zero_like(state))
