"""dsckpt.dcp's async_save, issue 31.9 and 31.10: a replicated tensor (a plain tensor, a
Replicate DTensor, a DTensor replicated over one dimension of a 2-D mesh) is written once
for the whole job, as DCP's FileSystemWriter writes it, from the snapshot staging took (the
values changed after staging_completion are not saved), and loads back exact in the same and
in another sharding; and without a daemon, staging_completion raises the daemon's error while
every rank's upload fails (none waits for another)."""
import gc
import json
import os
import threading

import pytest
import torch

dcp = pytest.importorskip("torch.distributed.checkpoint",
                          reason="torch.distributed.checkpoint missing")
if not hasattr(dcp, "async_save"):
    pytest.skip(f"torch {torch.__version__} has no dcp.async_save", allow_module_level=True)
pytest.importorskip("torch.distributed.tensor", reason="DTensor missing (torch < 2.4)")

from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

import dsckpt  # noqa: E402
import dsckpt.dcp  # noqa: E402
import dsckpt.torch as dt  # noqa: E402
from conftest import Daemon  # noqa: E402
from ranks import run_ranks  # noqa: E402

T = 60
REP = (256, 1024)       # 1 MiB of float32, replicated over the 4 ranks
HYB = (8, 4096)         # 128 KiB: Shard(0) on a 2x2 mesh's first dim, Replicate on the other
SHARD = (16, 512)       # 32 KiB, Shard(0) over the 4 ranks
PLAIN = (64, 64)        # 16 KiB plain tensor every rank holds


def full(shape, base):
    """A tensor of distinct values."""
    n = torch.Size(shape).numel()
    return (torch.arange(n, dtype=torch.float32) + base).reshape(shape)


def _save_ranks(rank, world, socket, tag):
    """4 ranks async_save replicated and sharded tensors, then change them all."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    conn = dsckpt.Connection(socket, job="rep", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    mesh2 = init_device_mesh("cpu", (2, 2))
    sd = {"rep": distribute_tensor(full(REP, 1), mesh, [Replicate()]),
          "hyb": distribute_tensor(full(HYB, 2), mesh2, [Shard(0), Replicate()]),
          "shard": distribute_tensor(full(SHARD, 3), mesh, [Shard(0)]),
          "plain": full(PLAIN, 4), "step": 5}
    resp = dcp.async_save(sd, storage_writer=dsckpt.dcp.Writer(tag, conn=conn, timeout=T))
    resp.staging_completion.result(timeout=T)
    for name in ("rep", "hyb", "shard"):  # the optimizer step after SNAPSHOT
        sd[name].to_local().add_(1000)
    sd["plain"].add_(1000)
    resp.upload_completion.result(timeout=T)
    conn.close()


def _load_ranks(rank, world, socket, tag, other):
    """world ranks load the tag, in the saved sharding or (other) in another one."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    conn = dsckpt.Connection(socket, job=f"repload{world}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    if other:
        sd = {"rep": distribute_tensor(torch.zeros(REP), mesh, [Shard(1)]),
              "hyb": distribute_tensor(torch.zeros(HYB), mesh, [Replicate()]),
              "shard": distribute_tensor(torch.zeros(SHARD), mesh, [Shard(1)])}
    else:
        mesh2 = init_device_mesh("cpu", (2, 2))
        sd = {"rep": distribute_tensor(torch.zeros(REP), mesh, [Replicate()]),
              "hyb": distribute_tensor(torch.zeros(HYB), mesh2, [Shard(0), Replicate()]),
              "shard": distribute_tensor(torch.zeros(SHARD), mesh, [Shard(0)])}
    sd.update(plain=torch.zeros(PLAIN), step=0)
    dcp.load(sd, storage_reader=dsckpt.dcp.Reader(tag, conn=conn))
    for name, shape, base in (("rep", REP, 1), ("hyb", HYB, 2), ("shard", SHARD, 3)):
        assert torch.equal(sd[name].full_tensor(), full(shape, base)), name
    assert torch.equal(sd["plain"], full(PLAIN, 4)) and sd["step"] == 5
    conn.close()


def _tensors_on_disk(tag):
    """name → [files holding it] and the bytes of tensor data, over the tag's rank files."""
    where, nbytes = {}, 0
    for f in sorted(os.listdir(tag)):
        if not (f.startswith("__") and f.endswith(".safetensors")):
            continue
        with open(os.path.join(tag, f), "rb") as fh:
            head = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        head.pop("__metadata__", None)
        for name, info in head.items():
            where.setdefault(name.split("@")[0], []).append(f)
            nbytes += info["data_offsets"][1] - info["data_offsets"][0]
    return where, nbytes


@pytest.fixture(scope="module")
def saved():
    """One daemon; 4 ranks async_saved tag "t"."""
    d = Daemon()
    tag = os.path.join(d.root, "rep", "t")
    try:
        run_ranks(_save_ranks, 4, d.socket, tag, timeout=300)
        yield d, tag
    finally:
        d.stop()


def test_replicated_tensors_written_once(saved):
    """Issue 31.9: every replicated chunk is in one file only; the tag's tensor bytes are the
    state's own bytes (before: 4 copies of rep and plain, 2 of each hyb chunk)."""
    _, tag = saved
    where, nbytes = _tensors_on_disk(tag)
    assert len(where["rep"]) == 1 and len(where["plain"]) == 1, where
    assert len(where["hyb"]) == 2, where     # its two row chunks, one file each
    assert len(where["shard"]) == 4, where
    want = 4 * (torch.Size(REP).numel() + torch.Size(HYB).numel()
                + torch.Size(SHARD).numel() + torch.Size(PLAIN).numel())
    assert nbytes == want, (nbytes, want)


def test_replicated_load_same_sharding(saved):
    d, tag = saved
    run_ranks(_load_ranks, 4, d.socket, tag, False, timeout=300)


def test_replicated_load_other_sharding(saved):
    d, tag = saved
    run_ranks(_load_ranks, 2, d.socket, tag, True, timeout=300)


def _no_daemon_ranks(rank, world, socket, tag):
    """Rank 1 has no daemon: its staging raises DaemonUnavailable; both uploads fail. The
    run is the environment's: only rank 1 saves through dsckpt.torch's connection, whose
    agreement on a run (a collective) rank 0 would never join."""
    os.environ["DSCKPT_RUN_ID"] = "nod"
    if rank == 1:
        os.environ["DSCKPT_SOCKET"] = socket + ".none"
        writer = dsckpt.dcp.Writer(tag, timeout=T)
    else:
        conn = dsckpt.Connection(socket, job="nod", rank=rank, world_size=world)
        writer = dsckpt.dcp.Writer(tag, conn=conn, timeout=T)
    resp = dcp.async_save({"w": torch.ones(8) * rank}, storage_writer=writer)
    if rank == 1:
        with pytest.raises(dsckpt.DaemonUnavailable, match="no dsckptd"):
            resp.staging_completion.result(timeout=T)
    else:
        assert resp.staging_completion.result(timeout=T) is None
    with pytest.raises(CheckpointException) as info:
        resp.upload_completion.result(timeout=T)
    assert list(info.value.failures) == [1], str(info.value)


def test_no_daemon_on_one_rank(daemon):
    """Issue 31.10, two ranks, the daemon missing for rank 1: its staging_completion raises,
    and the save fails on both ranks without waiting for each other."""
    run_ranks(_no_daemon_ranks, 2, daemon.socket, os.path.join(daemon.root, "nod", "t"),
              timeout=300)
    assert not os.path.exists(os.path.join(daemon.root, "nod", "t", "MANIFEST.json"))


def _group_freed(rank, world):
    """After destroy_process_group: no gloo thread is left (the group was freed then), and a
    garbage collection in another thread than the main one, as the interpreter exits, frees
    nothing of it (torch aborts the process when it does)."""
    left = sorted(n for n in (open(f"/proc/self/task/{t}/comm").read().strip()
                              for t in os.listdir("/proc/self/task"))
                  if n.startswith(("pt_gloo", "gloo")))
    assert not left, f"rank {rank}: the process group outlived destroy_process_group: {left}"
    threading.Thread(target=gc.collect, daemon=True).start()


def test_no_daemon_frees_group(daemon):
    """Issue 31.1: after rank 1's failed staging, its process group is freed by
    destroy_process_group (before, the staging error's traceback held async_save's frame,
    and with it the group, in a reference cycle; the garbage collector freed it later in
    whichever thread it ran, and at interpreter exit torch aborted the rank: "terminate
    called without an active exception")."""
    run_ranks(_no_daemon_ranks, 2, daemon.socket, os.path.join(daemon.root, "nod2", "t"),
              timeout=300, after=_group_freed)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_no_daemon_fails_staging(monkeypatch, tmp_path):
    """Issue 31.10, one process: staging_completion raises "daemon not running" (it said
    success before), and so does the upload."""
    monkeypatch.setenv("DSCKPT_SOCKET", str(tmp_path / "none.sock"))
    dt.set_default_connection(None)
    try:
        resp = dcp.async_save({"w": torch.ones(4)}, no_dist=True,
                              storage_writer=dsckpt.dcp.Writer(str(tmp_path / "job" / "t")))
        with pytest.raises(dsckpt.DaemonUnavailable, match="no dsckptd"):
            resp.staging_completion.result(timeout=T)
        with pytest.raises((CheckpointException, dsckpt.DaemonUnavailable)):
            resp.upload_completion.result(timeout=T)
    finally:
        dt.set_default_connection(None)
