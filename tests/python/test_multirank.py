"""dsckpt.torch.commit across 4 gloo ranks on two daemons (two simulated nodes, one root):
ranks 0-1 talk to daemon A, ranks 2-3 to daemon B, and all write one tag directory. Each
daemon has its own node name ("host"): on one machine, one daemon per root per node."""
import json
import multiprocessing
import os
import signal
import time

import pytest
import torch

import dsckpt
import dsckpt.torch as dt
from ranks import run_ranks

T = 60


def state_of(rank):
    """What rank saves: its own values, so a mix-up shows."""
    return {"rank": rank, "w": torch.full((4096,), float(rank)),
            "layers": [torch.arange(10, dtype=torch.int64) * rank]}


def _four_ranks(rank, world, sockets, root):
    """The scenarios, run by every rank in the same order."""
    conn = dsckpt.Connection(sockets[rank // 2], job="mr", rank=rank, world_size=world)
    dt.set_default_connection(conn)
    job = os.path.join(root, "mr")

    # 1. Committed only once every rank is DURABLE: rank 3 saves late; meanwhile the
    #    others are inside commit() and no manifest may appear.
    d1 = os.path.join(job, "step1")
    if rank == 3:
        time.sleep(1.0)
        assert not os.path.exists(os.path.join(d1, "MANIFEST.json")), "committed too early"
    dt.save(state_of(rank), d1)
    dt.commit(d1, timeout=T)
    manifest = dsckpt.manifest.load(d1)
    ranks = sorted(f["rank"] for f in manifest["files"] if f["kind"] == "safetensors")
    assert ranks == [0, 1, 2, 3] and manifest["world_size"] == 4
    with open(os.path.join(job, "latest")) as f:
        assert f.read() == "step1"
    back = dt.load(d1)  # file rank{rank} of this rank
    assert back["rank"] == rank and torch.equal(back["w"], state_of(rank)["w"])
    assert torch.equal(back["layers"][0], state_of(rank)["layers"][0])

    # 2. A failed save anywhere fails the commit everywhere (rank 1's file cannot be
    #    renamed into place); latest stays at step1.
    d2 = os.path.join(job, "step2")
    if rank == 1:
        os.makedirs(os.path.join(d2, "rank1.safetensors"))
    torch.distributed.barrier()
    dt.save(state_of(rank), d2)
    with pytest.raises(dsckpt.SaveFailed) as info:
        dt.commit(d2, timeout=T)
    if rank != 1:
        assert "another rank" in info.value.message
    assert not os.path.exists(os.path.join(d2, "MANIFEST.json"))

    # 3. A rank without a file: rank 0's daemon refuses, and every rank hears it.
    d3 = os.path.join(job, "step3")
    if rank != 2:
        dt.save(state_of(rank), d3)
    with pytest.raises(dsckpt.CheckpointIncomplete):
        dt.commit(d3, timeout=T)
    with open(os.path.join(job, "latest")) as f:
        assert f.read() == "step1"
    conn.close()


def test_commit_four_ranks_two_daemons(make_daemon):
    a = make_daemon(host="node-a")
    b = make_daemon(root=a.root, host="node-b")
    run_ranks(_four_ranks, 4, [a.socket, b.socket], a.root)
    # Both daemons really took saves: each logged its two ranks' files.
    assert "rank0" in a.read_log() and "rank2" in b.read_log()


def _save_seal_die(rank, world, socket, tag_dir):
    """A rank that saves, seals and is SIGKILLed at once: nothing waits for anything."""
    conn = dsckpt.Connection(socket, job="gone", rank=rank, world_size=world)
    dt.save(state_of(rank), tag_dir, conn=conn)
    conn.seal(tag_dir)
    os.kill(os.getpid(), signal.SIGKILL)


def test_seal_then_every_rank_dies(make_daemon):
    """4 ranks on two daemons (two nodes, one root) save, seal and are killed; the daemons
    commit the tag between them: one manifest, every rank's file, latest, loads equal."""
    a = make_daemon(host="node-a")
    b = make_daemon(root=a.root, host="node-b")
    tag_dir = os.path.join(a.root, "gone", "step7")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_save_seal_die, args=(r, 4, (a, b)[r // 2].socket, tag_dir))
             for r in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(T)
        assert p.exitcode == -signal.SIGKILL
    deadline = time.monotonic() + T
    # latest follows the manifest a moment later (store_commit writes them in that order).
    while not os.path.exists(os.path.join(a.root, "gone", "latest")):
        assert time.monotonic() < deadline, "the daemons did not commit the sealed tag"
        time.sleep(0.05)
    manifest = dsckpt.manifest.load(tag_dir)
    ranks = sorted(f["rank"] for f in manifest["files"] if f["kind"] == "safetensors")
    assert ranks == [0, 1, 2, 3] and manifest["world_size"] == 4
    records = sorted(n for n in os.listdir(tag_dir) if n.startswith("SEAL"))
    # One record per node, or two where a rank sealed late there (the first stays).
    assert {n.rsplit("+", 1)[1] for n in records} == {"node-a.json", "node-b.json"}, records
    # The manifest names the other node's record instead of copying its files (version 2):
    # a rank's own record only is read for its ranks; the other's gone is an error for the
    # whole tag, not a partial list.
    with open(os.path.join(tag_dir, "MANIFEST.json")) as f:
        raw = json.load(f)
    assert raw["version"] == 2 and len(raw["records"]) == 1, raw
    named = raw["records"][0]
    mine = [r for r in range(4) if r not in named["ranks"]]
    os.rename(os.path.join(tag_dir, named["name"]), os.path.join(tag_dir, "moved"))
    only = dsckpt.manifest.load(tag_dir, ranks=mine)
    assert sorted(f["rank"] for f in only["files"] if f["kind"] == "safetensors") == mine
    with pytest.raises(dsckpt.CheckpointIncomplete, match=named["name"].replace("+", r"\+")):
        dsckpt.manifest.load(tag_dir)
    with pytest.raises(dsckpt.CheckpointIncomplete):
        dsckpt.manifest.load(tag_dir, ranks=named["ranks"][:1])
    os.rename(os.path.join(tag_dir, "moved"), os.path.join(tag_dir, named["name"]))
    with open(os.path.join(a.root, "gone", "latest")) as f:
        assert f.read() == "step7"
    for r in range(4):
        back = dt.load(tag_dir, f"rank{r}")
        assert back["rank"] == r and torch.equal(back["w"], state_of(r)["w"])


def _node_local(rank, world, sockets, roots):
    """Two nodes with roots of their own: step1 sealed by both ranks, step2 by rank 0 only;
    every rank agrees on step1, and what it holds of step1 loads back."""
    conn = dsckpt.Connection(sockets[rank], job="local", rank=rank, world_size=world)
    job = os.path.join(roots[rank], "local")
    for step, sealers in (("step1", (0, 1)), ("step2", (0,))):
        d = os.path.join(job, step)
        h = dt.save(state_of(rank), d, conn=conn)
        h.wait_durable(T)
        if rank in sealers:
            conn.seal(d)
    torch.distributed.barrier()
    deadline = time.monotonic() + T
    while not any(n.startswith("SEAL") for n in os.listdir(os.path.join(job, "step1"))):
        assert time.monotonic() < deadline, "no seal record"
        time.sleep(0.02)
    tag = dt.find_latest(job)
    assert tag == "step1", f"rank {rank} chose {tag}"
    back = dt.load(os.path.join(job, tag), f"rank{rank}")
    assert back["rank"] == rank and torch.equal(back["w"], state_of(rank)["w"])
    assert not os.path.exists(os.path.join(job, "step1", "MANIFEST.json"))  # node-local
    conn.close()


def test_find_latest_node_local(make_daemon):
    """Node-local roots: no manifest can be written; a restarted job agrees through its
    process group on the newest tag every rank sealed, never on one a rank did not seal."""
    a = make_daemon(host="node-a")
    b = make_daemon(host="node-b")
    run_ranks(_node_local, 2, [a.socket, b.socket], [a.root, b.root])


def _agree_run(rank, world, socket, root):
    """Ranks saving through dsckpt.torch's own connection, no run in the environment: the
    first save agrees on one run id, every file and the manifest record it."""
    os.environ["DSCKPT_SOCKET"] = socket
    tag = os.path.join(root, "agree", "step1")
    dt.save(state_of(rank), tag)
    dt.commit(tag, timeout=T)
    conn = dt.default_connection()
    assert len(conn.run) == 32, conn.run  # rank 0's uuid4, hex
    with open(os.path.join(tag, f"rank{rank}.safetensors"), "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        assert json.loads(f.read(n))["__metadata__"]["dsckpt.run"] == conn.run
    with open(os.path.join(tag, "MANIFEST.json")) as f:
        assert json.load(f)["run"] == conn.run
    runs = [None] * world
    torch.distributed.all_gather_object(runs, conn.run)
    assert len(set(runs)) == 1, runs


def test_ranks_agree_on_a_run(make_daemon):
    """No run id in the environment: dsckpt.torch's ranks agree on one at their first save."""
    a = make_daemon(host="node-a")
    run_ranks(_agree_run, 2, a.socket, a.root)


def test_connection_run(daemon, monkeypatch):
    """Connection(run=...) sends the run given; None takes the environment's; "" is none."""
    for var in ("DSCKPT_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "PMIX_NAMESPACE",
                "OMPI_MCA_ess_base_jobid"):
        monkeypatch.delenv(var, raising=False)
    with dsckpt.Connection(daemon.socket, job="r", run="given-1") as c:
        assert c.run == "given-1"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "te-7")
    with dsckpt.Connection(daemon.socket, job="r") as c:
        assert c.run == "te-7"
    with dsckpt.Connection(daemon.socket, job="r", run="") as c:
        assert c.run == ""
    with pytest.raises(dsckpt.DsckptError):
        dsckpt.Connection(daemon.socket, job="r", run="bad\nrun")
