#!/usr/bin/env python3
"""bench_stage.py — how fast dsckpt.torch.save hands over an ordinary CPU tensor (memory
torch allocated, which the library copies into its shared memory: client/lib/stage.c),
against the machine's own copy and against dsckpt.torch.host_empty memory (no copy), in one
run. A micro-benchmark, not a test: it prints GB/s (GB = 1e9 B), asserts nothing.

  python3 tests/python/bench_stage.py [--mib 1024] [--saves 5] [--socket PATH --root DIR]

Rows: the save call of a plain tensor, first save (the library's staging memory is new) and
later saves (median; each waits for SNAPSHOT and lets its save go first, as a trainer does
before its next checkpoint, so the staging memory is reused); the save call of a host_empty
tensor; and the baselines: torch's copy_ into a tensor touched before (memory bandwidth,
median of --saves), into a new tensor (fresh pages, first touch), and numpy's copy of the
same bytes. Without --socket a daemon is started from $DSCKPTD (default build/dsckptd) on a
scratch directory by tests/python/conftest.py. Run with PYTHONPATH=client/python (and
DSCKPT_LIB when the library is not found by itself).
"""
import argparse
import os
import statistics
import sys
import time
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def gbps(nbytes, seconds):
    """nbytes over seconds in GB/s."""
    return nbytes / 1e9 / seconds


def timed(fn):
    """fn's wall time in seconds."""
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def save_call(dt, conn, state, path):
    """The seconds of one dsckpt.torch.save call of state into path; waits for SNAPSHOT and
    DURABLE afterwards, untimed, and lets the save go."""
    t = time.perf_counter()
    h = dt.save(state, path, conn=conn)
    took = time.perf_counter() - t
    h.wait_snapshot()
    h.wait_durable()
    del h
    return took


def main(argv):
    """Runs the rows and prints them."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mib", type=int, default=1024, help="tensor size (MiB)")
    p.add_argument("--saves", type=int, default=5, help="saves (and baseline copies) per row")
    p.add_argument("--socket", help="a running daemon's socket (default: start one)")
    p.add_argument("--root", help="a directory that daemon allows (with --socket)")
    a = p.parse_args(argv)
    import dsckpt
    import dsckpt.torch as dt
    daemon = None
    if a.socket:
        socket, root = a.socket, a.root
    else:
        from conftest import Daemon
        daemon = Daemon(cache_gib=0.25)   # a larger save streams through it
        socket, root = daemon.socket, daemon.root
    n = a.mib << 20
    try:
        conn = dsckpt.Connection(socket, job="bench-stage", rank=0, world_size=1)
        src = torch.randn(n // 4)
        print(f"bench_stage: {a.mib} MiB fp32, torch {torch.__version__}, "
              f"{os.cpu_count()} CPUs, {a.saves} saves per row")

        # Baselines first, in the same run.
        dst = torch.empty_like(src)
        dst.copy_(src)                           # touched once
        warm = [timed(lambda: dst.copy_(src)) for _ in range(a.saves)]
        fresh = [timed(lambda: torch.empty_like(src).copy_(src)) for _ in range(a.saves)]
        s_np, d_np = src.numpy(), np.empty(n // 4, dtype=np.float32)
        d_np[:] = s_np
        npy = [timed(lambda: np.copyto(d_np, s_np)) for _ in range(a.saves)]

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")      # the once-per-process copy warning
            plain = [save_call(dt, conn, {"w": src}, os.path.join(root, "bench", f"p{i}"))
                     for i in range(a.saves)]
        host = dt.host_empty(src.shape, src.dtype)
        host.copy_(src)
        pinned = [save_call(dt, conn, {"w": host}, os.path.join(root, "bench", f"h{i}"))
                  for i in range(a.saves)]
        conn.close()
    finally:
        if daemon is not None:
            daemon.stop()
    rows = [("dsckpt.torch.save, plain tensor, first save", plain[0]),
            ("dsckpt.torch.save, plain tensor, later saves (median)",
             statistics.median(plain[1:]) if len(plain) > 1 else plain[0]),
            ("dsckpt.torch.save, host_empty tensor (median)", statistics.median(pinned)),
            ("baseline: torch copy_ into touched memory (median)", statistics.median(warm)),
            ("baseline: torch copy_ into new memory (median)", statistics.median(fresh)),
            ("baseline: numpy copyto into touched memory (median)", statistics.median(npy))]
    for what, s in rows:
        print(f"  {what:56s} {s * 1e3:9.1f} ms  {gbps(n, s):7.2f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
