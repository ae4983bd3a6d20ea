#!/usr/bin/env python3
"""dcp_reshard.py — a resharded DCP restore of CUDA tensors through dsckptd, timed against DCP's
own FileSystemReader.

  python3 tests/gpu/dcp_reshard.py [--mb 512] [--device cuda|cpu] [--repeat 2]
                                   [--socket SOCK --root DIR]

4 gloo ranks hold a GPT-like state (a bf16 embedding, two fp32 matrices and their AdamW moments,
about --mb MiB in all, plus a step count) as DTensors sharded Shard(0) over the ranks, every
local shard on cuda:0, and save it twice with dcp.save: through dsckpt.dcp.Writer (each rank
with its own dsckpt.Connection) and through DCP's FileSystemWriter. Then 2 ranks load both
copies into Shard(1) DTensors and 8 ranks into Shard(0) ones (destinations on cuda:0), through
dsckpt.dcp.Reader and through FileSystemReader, --repeat times each (the order alternates; the
best time counts). Every restored local shard must equal, bit for bit, its slice of the full
tensor, whose elements are a hash of their index: each rank computes its own expected slice.

All ranks share one GPU, which NCCL refuses, so the process group is gloo alone. DeviceMesh
takes a gloo-only group for device type "cuda" once each process has picked its device
(torch.cuda.set_device(0) before init_device_mesh), and the DTensors are built with
DTensor.from_local(..., run_check=False), so no collective ever touches a CUDA tensor: DCP's
own collectives carry pickled objects on the CPU (gloo), and the timings are gathered as CPU
tensors. The ranks are forked from a fork server that imported torch, DCP and dsckpt but never
touched CUDA (each rank starts CUDA itself). Torch >= 2.4 (torch.distributed.tensor, dsckpt.dcp).

Prints one line per load (seconds, max over ranks, and GB/s of the whole state), then a table;
writes $OUT/dcp-reshard.json when OUT is set. Exit status: 0 all equal, 1 otherwise, 77 skipped
(no CUDA, no DTensor/DCP). Without --socket a daemon is started from $DSCKPTD (default
build/dsckptd) by tests/python/conftest.py (which imports pytest); with one, --root must be a
directory the daemon allows; the checkpoints go to ROOT/dcp-reshard/. --device cpu runs the
same on CPU tensors (how CI runs it: tests/python/modern/test_dcp_reshard.py). Run with
PYTHONPATH=client/python (and DSCKPT_LIB when the library is not found by itself).
"""
import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "python"))  # ranks.py, conftest.py

try:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    import dsckpt
    import dsckpt.dcp
    from ranks import run_ranks
    MISSING = None
except ImportError as e:  # torch < 2.4, or no torch at all
    MISSING = str(e)

SKIP = 77
SAVERS = 4
LOADS = ((2, 1), (8, 0))  # (ranks, the dimension they shard on)
JOB = "dcp-reshard"
STEP = 1000
T = 240
# What the fork server the ranks are forked from imports once (none of it touches CUDA).
PRELOAD = ["torch.distributed.checkpoint", "torch.distributed.tensor", "dsckpt.dcp"]


def specs(mb):
    """The state's tensors, (path in the state dict, shape, dtype), about mb MiB in all: every
    dimension a multiple of 64 so that 2, 4 and 8 ranks split it evenly."""
    d = max(64, round(math.sqrt(mb * 2**20 / 124) / 64) * 64)  # 124 d² bytes
    weights = [("embed.weight", (4 * d, d), torch.bfloat16),
               ("layers.0.attn.qkv.weight", (d, 3 * d), torch.float32),
               ("layers.0.mlp.fc.weight", (4 * d, d), torch.float32)]
    out = [(("model", name), shape, dtype) for name, shape, dtype in weights]
    out += [(("optim", "state", name, m), shape, torch.float32)
            for name, shape, _ in weights for m in ("exp_avg", "exp_avg_sq")]
    return out


def nbytes(mb):
    """Bytes of all the state's tensors."""
    return sum(math.prod(shape) * dtype.itemsize for _, shape, dtype in specs(mb))


def values(i, shape, dtype, block, device):
    """Tensor i's elements in block ((row0, row1), (col0, col1)): a hash of each element's
    index, exact in fp32, then cast to dtype (the same rounding wherever it is computed)."""
    (r0, r1), (c0, c1) = block
    rows = torch.arange(r0, r1, dtype=torch.int64, device=device).unsqueeze(1)
    cols = torch.arange(c0, c1, dtype=torch.int64, device=device)
    h = (rows * shape[1] + cols + i * 1000003) * 2654435761 % 65521
    return ((h - 32760).to(torch.float32) / 256).to(dtype)


def block(shape, world, rank, dim):
    """The rows and columns that rank holds of a 2-D tensor split evenly on dim."""
    spans = [(0, shape[0]), (0, shape[1])]
    n = shape[dim] // world
    spans[dim] = (rank * n, (rank + 1) * n)
    return spans


def state(mesh, rank, world, dim, a, fill):
    """The rank's state dict: each tensor a DTensor Shard(dim) over mesh whose local shard is
    its expected slice (fill) or zeros, and the step count (or 0)."""
    sd = {"step": STEP if fill else 0}
    for i, (path, shape, dtype) in enumerate(specs(a.mb)):
        span = block(shape, world, rank, dim)
        local = (values(i, shape, dtype, span, a.device) if fill else
                 torch.zeros([e - s for s, e in span], dtype=dtype, device=a.device))
        node = sd
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = DTensor.from_local(local, mesh, [Shard(dim)], run_check=False)
    return sd


def mismatches(sd, rank, world, dim, a):
    """How many of the rank's restored tensors (and the step count) differ from what was
    saved, compared bit for bit."""
    bad = int(sd["step"] != STEP)
    for i, (path, shape, dtype) in enumerate(specs(a.mb)):
        got = sd
        for key in path:
            got = got[key]
        want = values(i, shape, dtype, block(shape, world, rank, dim), a.device)
        bad += not torch.equal(got.to_local().view(torch.uint8), want.view(torch.uint8))
    return bad


def sync(device):
    """Waits for the device's queued work."""
    if device == "cuda":
        torch.cuda.synchronize()


def setup(rank, world, a, job):
    """The rank's device, one-dimensional mesh over all ranks, and daemon connection."""
    if a.device == "cuda":
        torch.cuda.set_device(0)  # before the mesh: every rank on the one GPU
    mesh = init_device_mesh(a.device, (world,))
    return mesh, dsckpt.Connection(a.socket, job=job, rank=rank, world_size=world)


def timed(device, fn):
    """Runs fn on every rank at once; the seconds of the slowest rank."""
    sync(device)
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    sync(device)
    secs = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(secs, op=dist.ReduceOp.MAX)
    return secs.item()


def verdict(result):
    """How a result's values compared: equal, DIFFERENT, or - (a save: not compared)."""
    return {None: "-", True: "equal", False: "DIFFERENT"}[result.get("equal")]


def report(rank, out, name, result):
    """Rank 0 prints one result line and keeps the result in out/name.json."""
    if rank != 0:
        return
    gbps = result["bytes"] / result["seconds"] / 1e9
    result["gbps"] = round(gbps, 3)
    print(f"  {name:<24} {result['seconds']:8.3f} s {gbps:7.2f} GB/s  "
          f"{verdict(result)}", flush=True)
    with open(os.path.join(out, name + ".json"), "w") as f:
        json.dump(result, f)


def save_rank(rank, world, a, tags, out):
    """4 ranks save the state through dsckpt.dcp.Writer, then through FileSystemWriter."""
    mesh, conn = setup(rank, world, a, JOB)
    sd = state(mesh, rank, world, 0, a, fill=True)
    writers = {"dsckpt": lambda: dsckpt.dcp.Writer(tags["dsckpt"], conn=conn, timeout=T),
               "fs": lambda: dcp.FileSystemWriter(tags["fs"])}
    for kind, writer in writers.items():
        secs = timed(a.device, lambda: dcp.save(sd, storage_writer=writer()))
        report(rank, out, f"save-{kind}", {"case": f"save {world}", "backend": kind,
                                           "seconds": secs, "bytes": nbytes(a.mb)})
    conn.close()


def load_rank(rank, world, a, dim, tags, out):
    """world ranks load both copies into Shard(dim) DTensors, a.repeat times each, and check
    every local shard; the best time of each reader counts."""
    mesh, conn = setup(rank, world, a, f"{JOB}-load{world}")
    readers = {"dsckpt": lambda: dsckpt.dcp.Reader(tags["dsckpt"], conn=conn),
               "fs": lambda: dcp.FileSystemReader(tags["fs"])}
    best = {}
    for rep in range(a.repeat):
        for kind in (("dsckpt", "fs") if rep % 2 == 0 else ("fs", "dsckpt")):
            sd = state(mesh, rank, world, dim, a, fill=False)
            reader = readers[kind]()
            secs = timed(a.device, lambda: dcp.load(sd, storage_reader=reader))
            bad = mismatches(sd, rank, world, dim, a)
            if kind == "dsckpt" and set(reader.sources.values()) - {"daemon"}:
                print(f"rank {rank}: not served by the daemon: {reader.sources}", flush=True)
                bad += 1
            bad = torch.tensor([bad])
            dist.all_reduce(bad)
            prev = best.get(kind, {"seconds": math.inf, "equal": True})
            best[kind] = {"case": f"{SAVERS}->{world} Shard({dim})", "backend": kind,
                          "seconds": min(secs, prev["seconds"]), "bytes": nbytes(a.mb),
                          "equal": prev["equal"] and bad.item() == 0}
    for kind, result in best.items():
        report(rank, out, f"load{world}-{kind}", result)
    conn.close()


def unsupported(device):
    """Why this machine cannot run the check, or None."""
    if MISSING:
        return f"torch with DTensor and DCP (>= 2.4) and dsckpt.dcp needed: {MISSING}"
    if device == "cuda" and not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return None


def run_all(a):
    """The save, then each load, on their own ranks; the results in the order they ran."""
    tags = {k: os.path.join(a.root, JOB, f"{k}-{os.getpid()}") for k in ("dsckpt", "fs")}
    out = tempfile.mkdtemp(prefix="dcp-reshard.")
    try:
        run_ranks(save_rank, SAVERS, a, tags, out, timeout=T, preload=PRELOAD)
        for world, dim in LOADS:
            run_ranks(load_rank, world, a, dim, tags, out, timeout=T, preload=PRELOAD)
        names = [f"save-{k}" for k in ("dsckpt", "fs")]
        names += [f"load{w}-{k}" for w, _ in LOADS for k in ("dsckpt", "fs")]
        results = []
        for name in names:
            with open(os.path.join(out, name + ".json")) as f:
                results.append(json.load(f))
        return results
    finally:
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(tags["fs"], ignore_errors=True)  # DCP's copy is ours; the daemon's stays


def summarize(a, results):
    """Prints the table and writes $OUT/dcp-reshard.json; whether every load was equal."""
    ok = all(r.get("equal", True) for r in results)
    where = torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu"
    print(f"dcp-reshard: torch {torch.__version__}, {where}, {nbytes(a.mb) / 2**20:.0f} MiB "
          f"in {len(specs(a.mb))} tensors, best of {a.repeat}")
    print(f"  {'case':<16} {'backend':<7} {'seconds':>8} {'GB/s':>7}  values")
    for r in results:
        print(f"  {r['case']:<16} {r['backend']:<7} {r['seconds']:8.3f} {r['gbps']:7.2f}  "
              f"{verdict(r)}")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "dcp-reshard.json"), "w") as f:
            json.dump({"torch": torch.__version__, "device": where, "bytes": nbytes(a.mb),
                       "repeat": a.repeat, "ok": ok, "results": results}, f, indent=1)
    return ok


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=float, default=512, help="MiB of state in all (default 512)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--repeat", type=int, default=2, help="loads per reader and case")
    p.add_argument("--socket")
    p.add_argument("--root")
    a = p.parse_args(argv)
    why = unsupported(a.device)
    if why:
        print(f"SKIP: {why}")
        return SKIP
    daemon = None
    if a.socket is None:
        from conftest import Daemon
        daemon = Daemon(cache_gib=max(0.25, 2 * a.mb / 1024))
        a.socket, a.root = daemon.socket, daemon.root
    try:
        results = run_all(a)
    finally:
        if daemon is not None:
            daemon.stop()
    return 0 if summarize(a, results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
