#!/usr/bin/env python3
"""bench_dcp_load.py — DCP loads into CPU memory through dsckpt.dcp.Reader (the tag in the
daemon's host cache) against DCP's FileSystemReader (its files in the page cache), in one run.

  python3 tests/python/bench_dcp_load.py [--mib 1024] [--ranks 4] [--repeat 3]
                                         [--socket SOCK --root DIR] [--profile FILE]

--ranks gloo ranks hold --mib MiB of float32 matrices as DTensors sharded Shard(0) and save
them twice with dcp.save: through dsckpt.dcp.Writer and through DCP's FileSystemWriter. Then
the same ranks load both copies into freshly allocated CPU DTensors (ordinary pageable memory,
as a trainer allocates it), in the same sharding (Shard(0)) and in another one (Shard(1)),
--repeat times each, the readers alternating; the best time counts (the slowest rank's, from
a barrier to a barrier). Every load is checked against the saved values. Prints one line per
load and, per sharding, both best times and their ratio: measurements, not asserted. With
each time, the CPU seconds the ranks (and the daemon, when its pid is known: started here, or
--daemon-pid) spent meanwhile, a figure that a busy machine disturbs less than the time.
--profile FILE writes rank 0's cProfile of its last dsckpt load in each sharding to FILE.same
and FILE.other.

Without --socket a daemon is started from $DSCKPTD (default build/dsckptd) by
tests/python/conftest.py (which imports pytest), with a host cache that holds the state;
with one, --root must be a directory the daemon allows (the state goes to ROOT/bench-dcp-load/).
Torch >= 2.4 (DTensor, dsckpt.dcp). Run with PYTHONPATH=client/python (and DSCKPT_LIB when the
library is not found by itself), or through tests/python/run's environment.
"""
import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
sys.path.insert(0, HERE)  # ranks.py, conftest.py

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import Shard, distribute_tensor  # noqa: E402

import dsckpt  # noqa: E402
import dsckpt.dcp  # noqa: E402
from ranks import run_ranks  # noqa: E402

JOB = "bench-dcp-load"
TENSORS = 8
PRELOAD = ["torch.distributed.checkpoint", "torch.distributed.tensor", "dsckpt.dcp"]


def shapes(mib):
    """TENSORS float32 matrices of about mib MiB in all, every dimension a multiple of 64."""
    cols = 1024
    rows = max(64, round(mib * 2**20 / 4 / TENSORS / cols / 64) * 64)
    return [(f"layers.{i}.weight", (rows, cols)) for i in range(TENSORS)]


def value(name, shape):
    """The saved tensor: distinct values (up to 2^24 elements), the same on every rank."""
    return torch.arange(shape[0] * shape[1], dtype=torch.float32).reshape(shape) \
        .add_(int(name.split(".")[1]))


def state(mesh, mib, dim, fill):
    """The state dict, each matrix a DTensor sharded on dim: the values, or zeros."""
    return {"model": {name: distribute_tensor(
        value(name, shape) if fill else torch.zeros(shape), mesh, [Shard(dim)])
        for name, shape in shapes(mib)}}


def _cpu_s(pid=None):
    """CPU seconds (user + system, every thread) this process has used, or process pid."""
    if pid is None:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _save(rank, world, socket, root, mib):
    """Saves the state through dsckpt and through FileSystemWriter."""
    conn = dsckpt.Connection(socket, job=JOB, rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    sd = state(mesh, mib, 0, True)
    dcp.save(sd, storage_writer=dsckpt.dcp.Writer(os.path.join(root, JOB, "dsckpt"), conn=conn))
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(os.path.join(root, JOB, "fs")))
    conn.close()


def _load(rank, world, socket, root, mib, repeat, out, profile, daemon_pid):
    """Loads both copies repeat times in each sharding; rank 0 writes the times to out."""
    conn = dsckpt.Connection(socket, job=JOB, rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    times = {}
    for dim, sharding in ((0, "same sharding"), (1, "other sharding")):
        for i in range(repeat):
            for reader in (("dsckpt", "fs") if i % 2 == 0 else ("fs", "dsckpt")):
                sd = state(mesh, mib, dim, False)
                where = os.path.join(root, JOB, reader)
                storage = dsckpt.dcp.Reader(where, conn=conn) if reader == "dsckpt" \
                    else dcp.FileSystemReader(where)
                prof = None
                if profile and rank == 0 and reader == "dsckpt" and i == repeat - 1:
                    import cProfile
                    prof = cProfile.Profile()
                dist.barrier()
                t0, cpu0 = time.perf_counter(), _cpu_s()
                d0 = _cpu_s(daemon_pid) if daemon_pid and rank == 0 else 0.0
                if prof:
                    prof.enable()
                dcp.load(sd, storage_reader=storage)
                if prof:
                    prof.disable()
                    prof.dump_stats(f"{profile}.{'same' if dim == 0 else 'other'}")
                cpu = torch.tensor([_cpu_s() - cpu0])
                dist.barrier()
                took = time.perf_counter() - t0
                dist.all_reduce(cpu)
                if daemon_pid and rank == 0:
                    cpu += _cpu_s(daemon_pid) - d0
                for name, shape in shapes(mib):
                    want = value(name, shape).chunk(world, dim)[rank]
                    assert torch.equal(sd["model"][name].to_local(), want), (reader, name)
                if rank == 0:
                    print(f"{sharding:15s} {reader:6s} run {i + 1}: {took:.3f} s, "
                          f"{cpu.item():.2f} CPU s", flush=True)
                    times.setdefault(sharding, {}).setdefault(reader, []).append(
                        (took, cpu.item()))
    if rank == 0:
        with open(out, "w") as f:
            json.dump(times, f)
    conn.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--socket")
    ap.add_argument("--root")
    ap.add_argument("--profile")
    ap.add_argument("--daemon-pid", type=int)
    args = ap.parse_args()
    daemon = None
    if args.socket is None:
        from conftest import Daemon
        daemon = Daemon(cache_gib=max(0.25, args.mib * 1.5 / 1024))
        socket, root = daemon.socket, daemon.root
    else:
        socket, root = args.socket, args.root
    scratch = tempfile.mkdtemp(prefix="bench-dcp-load.")
    try:
        shutil.rmtree(os.path.join(root, JOB), ignore_errors=True)
        run_ranks(_save, args.ranks, socket, root, args.mib, timeout=1200, preload=PRELOAD)
        out = os.path.join(scratch, "times.json")
        run_ranks(_load, args.ranks, socket, root, args.mib, args.repeat, out, args.profile,
                  daemon.proc.pid if daemon else args.daemon_pid, timeout=1200,
                  preload=PRELOAD)
        with open(out) as f:
            times = json.load(f)
        print(f"{args.mib} MiB over {args.ranks} ranks, CPU destinations, best of "
              f"{args.repeat}:")
        for sharding, by in times.items():
            (ours, ours_cpu), (fs, fs_cpu) = min(by["dsckpt"]), min(by["fs"])
            print(f"  {sharding:15s} dsckpt.dcp.Reader {ours:.3f} s ({ours_cpu:.2f} CPU s)   "
                  f"FileSystemReader {fs:.3f} s ({fs_cpu:.2f} CPU s)   ratio {ours / fs:.2f}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if daemon is not None:
            daemon.stop()
        elif args.root:
            shutil.rmtree(os.path.join(root, JOB), ignore_errors=True)


if __name__ == "__main__":
    main()
