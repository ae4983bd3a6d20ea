#!/usr/bin/env python3
"""bench_load.py SOCKET ROOT [GIB] — loading a dsckpt checkpoint back onto the GPU from files
(warm: in the page cache or tmpfs), beside the same run's baselines and bounds.

Saves GIB GiB (default 8) of fp32 CUDA tensors of 256 MiB through the daemon, commits, then
times, median of 3 each (the GPU synchronized before the clock stops):
  dsckpt.torch.load(dir, map_location="cuda")  the library's file path: one parallel read into
                                               pinned memory, one copy to the GPU;
  safetensors.torch.load_file(device="cuda")   the same file through safetensors;
  bound: parallel preadv into pinned memory    the read alone;
  bound: pinned host -> GPU copy               the copy alone.
Prints a table last. Exit status 0, or 77 without torch, CUDA or safetensors.
"""
import os
import statistics
import sys
import time

try:
    import torch
    import safetensors.torch as st
except ImportError as e:
    print(f"SKIP: {e}")
    sys.exit(77)
if not torch.cuda.is_available():
    print("SKIP: no CUDA device")
    sys.exit(77)

import dsckpt
import dsckpt.torch as dt
from dsckpt._files import read_safetensors_buffer

TENSOR = 256 << 20


def timed(fn, reps=3):
    """Median seconds of fn() over reps runs, the GPU synchronized after each."""
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        del out
    return statistics.median(times)


def main():
    sock, root = sys.argv[1], sys.argv[2]
    gib = float(sys.argv[3]) if len(sys.argv) > 3 else 8.0
    n = max(1, int(gib * (1 << 30) // TENSOR))
    state = {f"layer{i}": torch.randn(TENSOR // 4, device="cuda") for i in range(n)}
    size = n * TENSOR
    tag = os.path.join(root, "loadbench", "t1")
    conn = dsckpt.Connection(sock, job="loadbench", rank=0, world_size=1)
    dt.save(state, tag, conn=conn)
    dt.commit(tag, conn=conn, timeout=600)
    path = os.path.join(tag, "rank0.safetensors")
    back = dt.load(tag, map_location="cuda")
    for k, v in state.items():
        if not torch.equal(back[k], v):
            print(f"FAIL: {k} differs after dsckpt.torch.load")
            sys.exit(1)
    del back
    pinned = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    rows = [
        ("dsckpt.torch.load, map_location=cuda", timed(lambda: dt.load(tag,
                                                                       map_location="cuda"))),
        ("safetensors load_file, device=cuda", timed(lambda: st.load_file(path,
                                                                          device="cuda"))),
        ("bound: 8-thread preadv into pinned", timed(lambda: read_safetensors_buffer(
            path, pin=True))),
        ("bound: pinned host -> GPU copy", timed(lambda: pinned.to("cuda", non_blocking=True))),
    ]
    print(f"\n== loading {size / 1e9:.2f} GB ({n} fp32 tensors of 256 MiB) from {root}, warm")
    print(f"{'':42s} {'GB/s':>8s}")
    for name, secs in rows:
        print(f"{name:42s} {size / secs / 1e9:8.2f}")
    conn.close()


if __name__ == "__main__":
    main()
