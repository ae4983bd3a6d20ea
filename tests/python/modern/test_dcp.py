"""dsckpt.dcp: DCP saves through dsckptd from 4 gloo ranks holding DTensors sharded over them,
loaded back by 2 and by 8 ranks into other shardings (values equal, through the daemon), async
staging honoured while training goes on, plain dcp.save, a failing rank failing every rank,
and `dsckptctl verify` passing on the tags."""
import json
import os
import pickle
import subprocess

import pytest
import torch

dcp = pytest.importorskip("torch.distributed.checkpoint",
                          reason="torch.distributed.checkpoint missing")
if not hasattr(dcp, "async_save"):
    pytest.skip(f"torch {torch.__version__} has no dcp.async_save", allow_module_level=True)
tensor_mod = pytest.importorskip("torch.distributed.tensor", reason="DTensor missing (torch < 2.4)")

from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

import dsckpt  # noqa: E402
import dsckpt.dcp  # noqa: E402
import dsckpt.torch as dt  # noqa: E402
from conftest import REPO, Daemon  # noqa: E402
from ranks import run_ranks  # noqa: E402

T = 60
DSCKPTCTL = os.path.join(os.path.dirname(os.environ.get("DSCKPTD", os.path.join(
    REPO, "build", "dsckptd"))), "dsckptctl")
SHAPES = {"w1": ((16, 12), torch.float32), "w2": ((10, 6), torch.float32),
          "emb": ((9, 8), torch.bfloat16), "ids": ((7,), torch.int64)}
SHARDED = {"opt": ((8, 5), torch.float32)}  # saved as a ShardedTensor, loaded as a DTensor


def full(name):
    """The whole tensor name stands for: distinct values in every element."""
    shape, dtype = {**SHAPES, **SHARDED}[name]
    n = torch.Size(shape).numel()
    return (torch.arange(n, dtype=torch.float64) * 0.5 + len(name)).reshape(shape).to(dtype)


def model_state(mesh, placements):
    """A model's state dict, every weight a DTensor laid out by placements over mesh, plus a
    replicated plain tensor and values DCP pickles."""
    from torch.distributed.tensor import distribute_tensor
    sd = {name: distribute_tensor(full(name), mesh, placements(name)) for name in SHAPES}
    return {"model": sd, "bias": torch.ones(12) * 3, "step": 7, "extra": {"lr": 0.25}}


def sharded_tensor(name, world):
    """A ShardedTensor (DCP's older sharded type) of full(name), rows split over the ranks."""
    from torch.distributed._shard.sharded_tensor import empty
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec
    spec = ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in range(world)])
    st = empty(spec, *SHARDED[name][0], dtype=SHARDED[name][1])
    for shard in st.local_shards():
        rows = shard.metadata.shard_offsets[0]
        shard.tensor.copy_(full(name)[rows:rows + shard.tensor.shape[0]])
    return st


def empty_like_state(mesh, placements):
    """The same structure filled with zeros and other values, to load into."""
    from torch.distributed.tensor import distribute_tensor
    sd = {name: distribute_tensor(torch.zeros_like(full(name)), mesh, placements(name))
          for name in SHAPES}
    return {"model": sd, "bias": torch.zeros(12), "step": 0, "extra": {"lr": 0.0}}


def _connect(rank, world, socket, job):
    conn = dsckpt.Connection(socket, job=job, rank=rank, world_size=world)
    dt.set_default_connection(conn)
    return conn


def _save_ranks(rank, world, socket, job_dir):
    """4 ranks: async_save with staging honoured, plain save, and a failing rank."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    conn = _connect(rank, world, socket, "dcp")
    mesh = init_device_mesh("cpu", (world,))
    sd = model_state(mesh, lambda name: [Shard(0)])
    sd["opt"] = sharded_tensor("opt", world)
    # w1's shard in dsckpt host memory: the daemon reads it by reference until SNAPSHOT
    # (other host memory the library copies before add_tensor returns).
    w1 = sd["model"]["w1"]
    local = dt.host_empty(w1.to_local().shape, w1.dtype).copy_(w1.to_local())
    sd["model"]["w1"] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                                           shape=w1.shape, stride=w1.stride())

    # 1. async_save while training goes on: other tensors change at once; the saved ones only
    #    after staging_completion (SNAPSHOT).
    other = torch.zeros(1000)
    resp = dcp.async_save(sd, storage_writer=dsckpt.dcp.Writer(os.path.join(job_dir, "step1"),
                                                                conn=conn, timeout=T))
    other += 1  # training on tensors the checkpoint does not hold
    assert resp.staging_completion.result(timeout=T) is None
    for name in SHAPES:  # the optimizer step: the checkpoint must keep the old values
        sd["model"][name].to_local().add_(100)
    for shard in sd["opt"].local_shards():
        shard.tensor.add_(100)
    sd["extra"]["lr"] = 99.0
    resp.upload_completion.result(timeout=T)
    assert os.path.exists(os.path.join(job_dir, "step1", "MANIFEST.json"))
    with open(os.path.join(job_dir, "latest")) as f:
        assert f.read() == "step1"

    # 2. plain dcp.save of the same (changed) state.
    dcp.save(sd, storage_writer=dsckpt.dcp.Writer(os.path.join(job_dir, "plain"), conn=conn,
                                                  timeout=T))
    assert os.path.exists(os.path.join(job_dir, "plain", "MANIFEST.json"))

    # 3. rank 1's file cannot be renamed into place: the save fails on every rank.
    bad = os.path.join(job_dir, "bad")
    if rank == 1:
        os.makedirs(os.path.join(bad, "__1_0.safetensors"))
    torch.distributed.barrier()
    resp = dcp.async_save(sd, storage_writer=dsckpt.dcp.Writer(bad, conn=conn, timeout=T))
    resp.staging_completion.result(timeout=T)
    with pytest.raises(CheckpointException) as info:  # a BaseException, as DCP raises it
        resp.upload_completion.result(timeout=T)
    assert list(info.value.failures) == [1], str(info.value)
    err = info.value.failures[1][0]
    assert isinstance(err, dsckpt.SaveFailed) and "__1_0.safetensors" in err.message, err
    assert not os.path.exists(os.path.join(bad, "MANIFEST.json"))
    with open(os.path.join(job_dir, "latest")) as f:
        assert f.read() == "plain"

    # 4. A committed tag saved again (the same state into "plain") is replaced in one step at
    #    its commit: a new manifest, latest names it, nothing left beside it.
    with open(os.path.join(job_dir, "plain", "MANIFEST.json")) as f:
        before = json.load(f)["created_ns"]
    torch.distributed.barrier()
    resp = dcp.async_save(sd, storage_writer=dsckpt.dcp.Writer(os.path.join(job_dir, "plain"),
                                                                conn=conn, timeout=T))
    resp.staging_completion.result(timeout=T)
    resp.upload_completion.result(timeout=T)
    with open(os.path.join(job_dir, "plain", "MANIFEST.json")) as f:
        assert json.load(f)["created_ns"] > before
    with open(os.path.join(job_dir, "latest")) as f:
        assert f.read() == "plain"
    assert not os.path.exists(os.path.join(job_dir, ".plain.dsckpt-next"))

    # 5. The daemon refuses a save at staging (a path below no allowed root): staging_completion
    #    raises it (nothing was staged), and write_data reports it, so every rank raises
    #    instead of waiting for the others.
    outside = os.path.join(os.path.dirname(os.path.dirname(job_dir)), "outside", "job", "t")
    resp = dcp.async_save(sd, storage_writer=dsckpt.dcp.Writer(outside, conn=conn, timeout=T))
    with pytest.raises(dsckpt.DsckptError, match="allowed root"):
        resp.staging_completion.result(timeout=T)
    with pytest.raises(CheckpointException) as info:
        resp.upload_completion.result(timeout=T)
    assert sorted(info.value.failures) == [0, 1, 2, 3], str(info.value)
    assert "allowed root" in str(info.value.failures[rank][0]), str(info.value)
    conn.close()


def _load_ranks(rank, world, socket, job_dir, tag, bump):
    """world ranks load tag into another sharding: Shard(1) weights, replicated ids."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    conn = _connect(rank, world, socket, f"dcpload{world}")
    mesh = init_device_mesh("cpu", (world,))
    sd = empty_like_state(mesh, lambda name: [Replicate()] if name in ("ids", "emb")
                          else [Shard(1)])
    from torch.distributed.tensor import distribute_tensor
    sd["opt"] = distribute_tensor(torch.zeros(SHARDED["opt"][0]), mesh, [Shard(1)])
    reader = dsckpt.dcp.Reader(os.path.join(job_dir, tag), conn=conn)
    dcp.load(sd, storage_reader=reader)
    for name in SHAPES:
        got = sd["model"][name].full_tensor()
        want = full(name) + bump
        assert torch.equal(got, want.to(got.dtype)), (name, got, want)
    assert torch.equal(sd["opt"].full_tensor(), full("opt") + bump)
    assert torch.equal(sd["bias"], torch.ones(12) * 3)
    assert sd["step"] == 7
    assert sd["extra"]["lr"] == (0.25 if bump == 0 else 99.0)
    assert reader.sources and set(reader.sources.values()) == {"daemon"}, reader.sources
    conn.close()


def _load_one_buffer(rank, world, socket, job_dir):
    """Issue 31.11: a resharding load into CPU memory fills every stored chunk of every file
    into one scratch buffer of dsckpt host memory, allocated once (it was one buffer per
    chunk, each mapped, faulted in and unmapped again), and loads the values exact."""
    import dsckpt.dcp.reader as reader_mod
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    conn = _connect(rank, world, socket, f"dcpbuf{world}")
    mesh = init_device_mesh("cpu", (world,))
    sd = {"model": {name: distribute_tensor(torch.zeros_like(full(name)), mesh, [Shard(1)])
                    for name in ("w1", "w2")}}
    made = []
    real = reader_mod.host_empty

    def counting(*args, **kw):
        made.append(args)
        return real(*args, **kw)
    reader_mod.host_empty = counting
    try:
        dcp.load(sd, storage_reader=dsckpt.dcp.Reader(os.path.join(job_dir, "step1"),
                                                      conn=conn))
    finally:
        reader_mod.host_empty = real
    for name in ("w1", "w2"):
        assert torch.equal(sd["model"][name].full_tensor(), full(name)), name
    assert len(made) == 1, made  # before: 8 (w1 and w2 from each of the 4 files)
    conn.close()


@pytest.fixture(scope="module")
def saved():
    """One daemon; 4 ranks saved tags step1 (async), plain (dcp.save) and bad (failed)."""
    d = Daemon()
    job_dir = os.path.join(d.root, "dcp")
    try:
        run_ranks(_save_ranks, 4, d.socket, job_dir, timeout=300)
        yield d, job_dir
    finally:
        d.stop()


def test_saved_by_four_ranks_verify(saved):
    d, job_dir = saved
    for tag in ("step1", "plain"):
        out = subprocess.run([DSCKPTCTL, "verify", os.path.join(job_dir, tag)],
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr
        names = os.listdir(os.path.join(job_dir, tag))
        assert "dcp_metadata.meta" in names, names
        assert "__3_0.safetensors" in names or "__3_1.safetensors" in names, names
    with pytest.raises(dsckpt.CheckpointIncomplete):  # the failed save left no manifest
        dsckpt.dcp.Reader(os.path.join(job_dir, "bad")).read_metadata()


def test_files_are_plain_safetensors(saved):
    safetensors = pytest.importorskip("safetensors.torch", reason="safetensors missing")
    d, job_dir = saved
    got = safetensors.load_file(os.path.join(job_dir, "step1", "__1_0.safetensors"))
    # rank 1 holds rows 4..7 of w1 (16 rows over 4 ranks)
    assert torch.equal(got["model.w1@4_0"], full("w1")[4:8])
    assert torch.equal(got["opt@2_0"], full("opt")[2:4])  # a ShardedTensor's local shard


def test_load_two_ranks_other_sharding(saved):
    d, job_dir = saved
    run_ranks(_load_ranks, 2, d.socket, job_dir, "step1", 0, timeout=300)


def test_load_eight_ranks_other_sharding(saved):
    d, job_dir = saved
    run_ranks(_load_ranks, 8, d.socket, job_dir, "plain", 100, timeout=300)


def test_load_reshards_through_one_buffer(saved):
    d, job_dir = saved
    run_ranks(_load_one_buffer, 2, d.socket, job_dir, timeout=300)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_one_process_without_torch_distributed(daemon, conn):
    """dcp.save and dcp.load with no process group: plain tensors, a dtype safetensors cannot
    name (complex: pickled into a blob), a non-contiguous view, nested containers."""
    tag = os.path.join(daemon.root, "pytest", "single")
    w = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    sd = {"w": w, "wt": w.t(), "c": torch.tensor([1 + 2j, 3 - 4j]),
          "nested": {"h": torch.ones(3, dtype=torch.float16), "xs": [torch.zeros(2), 5]}}
    dcp.save(sd, storage_writer=dsckpt.dcp.Writer(tag, conn=conn, timeout=T), no_dist=True)
    out = subprocess.run([DSCKPTCTL, "verify", tag], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    back = {"w": torch.zeros(4, 6), "wt": torch.zeros(6, 4),
            "c": torch.zeros(2, dtype=torch.cfloat),
            "nested": {"h": torch.zeros(3, dtype=torch.float16), "xs": [torch.ones(2), 0]}}
    reader = dsckpt.dcp.Reader(tag, conn=conn)
    dcp.load(back, storage_reader=reader, no_dist=True)
    assert torch.equal(back["w"], w) and torch.equal(back["wt"], w.t())
    assert torch.equal(back["c"], sd["c"]) and torch.equal(back["nested"]["h"], torch.ones(3))
    assert torch.equal(back["nested"]["xs"][0], torch.zeros(2)) and back["nested"]["xs"][1] == 5
    assert set(reader.sources.values()) == {"daemon"}, reader.sources
    with pytest.raises(TypeError, match="THREAD"):  # async_save's PROCESS executor pickles it
        pickle.dumps(dsckpt.dcp.Writer(tag, conn=conn))


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_reader_without_daemon_checks_checksums(daemon, conn, monkeypatch, tmp_path):
    """Issue 31.2: with 4 bytes of a tensor flipped, the Reader's own read of the file (no
    daemon answers) fails naming the tensor's checksum, instead of loading the garbage."""
    tag = os.path.join(daemon.root, "pytest", "rot")
    sd = {"w": torch.arange(24, dtype=torch.float32).reshape(4, 6), "b": torch.ones(8)}
    dcp.save(sd, storage_writer=dsckpt.dcp.Writer(tag, conn=conn, timeout=T), no_dist=True)
    files = [f for f in os.listdir(tag) if f.endswith(".safetensors") and f.startswith("__")]
    assert len(files) == 1, files   # the rank's data file (beside dcp_metadata.safetensors)
    with open(os.path.join(tag, files[0]), "r+b") as f:   # the last tensor's last 4 bytes
        f.seek(-4, os.SEEK_END)
        raw = f.read(4)
        f.seek(-4, os.SEEK_END)
        f.write(bytes(b ^ 0xff for b in raw))
    monkeypatch.setenv("DSCKPT_SOCKET", str(tmp_path / "none.sock"))
    dt.set_default_connection(None)
    try:
        back = {"w": torch.zeros(4, 6), "b": torch.zeros(8)}
        with pytest.raises(CheckpointException) as e:
            dcp.load(back, storage_reader=dsckpt.dcp.Reader(tag), no_dist=True)
        failure = e.value.failures[0]
        err = failure[0] if isinstance(failure, tuple) else failure  # (exception, traceback)
        assert isinstance(err, dsckpt.LoadFailed) and err.cause == dsckpt.Errno.ECHECKSUM, err
        assert "checksum mismatch" in err.message and files[0] in err.message, err
    finally:
        dt.set_default_connection(None)
