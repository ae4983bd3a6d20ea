#!/usr/bin/env python3
"""bench_header.py — what dsckpt.torch's loads pay in Python for a file's header before the
daemon is asked (issue 34: 5-12 ms of a fresh process's first load on the H200), on the CPU,
with a synthetic header the size of bench_train's 671M-parameter GPT with AdamW (about 1,500
tensors, each with its dsckpt checksum). A micro-benchmark, not a test: it prints
milliseconds, asserts nothing.

  PYTHONPATH=client/python python3 tests/python/bench_header.py [--layers 30] [--repeat 20]

Rows: reading the header (dsckpt._fill.header, as ``load`` does), and checking destinations
against it (dsckpt._fill.check, as ``load_into`` does: meta-device tensors of the file's
dtypes and shapes). Columns: the process's first call; a call after the file changed (its
mtime moved: parsed again), the fastest of --repeat; a call on the file unchanged since the
last (a trainer's second load of a tag), the fastest of --repeat.
"""
import argparse
import json
import os
import statistics
import struct
import sys
import tempfile
import time

import torch


def gpt_tensors(layers: int):
    """name -> (dtype, shape) of a GPT of ``layers`` blocks (d=2048) and its AdamW state."""
    d, vocab = 2048, 50304
    params = {"model.wte.weight": [vocab, d], "model.wpe.weight": [2048, d]}
    for i in range(layers):
        p = f"model.h.{i}."
        params.update({p + "ln_1.weight": [d], p + "ln_1.bias": [d],
                       p + "attn.c_attn.weight": [3 * d, d], p + "attn.c_attn.bias": [3 * d],
                       p + "attn.c_proj.weight": [d, d], p + "attn.c_proj.bias": [d],
                       p + "ln_2.weight": [d], p + "ln_2.bias": [d],
                       p + "mlp.c_fc.weight": [4 * d, d], p + "mlp.c_fc.bias": [4 * d],
                       p + "mlp.c_proj.weight": [d, 4 * d], p + "mlp.c_proj.bias": [d]})
    params.update({"model.ln_f.weight": [d], "model.ln_f.bias": [d]})
    out = {n: ("F32", s) for n, s in params.items()}
    for k, (n, s) in enumerate(params.items()):
        out[f"optimizer.state.{k}.step"] = ("F32", [])
        out[f"optimizer.state.{k}.exp_avg"] = ("F32", s)
        out[f"optimizer.state.{k}.exp_avg_sq"] = ("F32", s)
    return out


def write_header_only(path: str, tensors) -> None:
    """A safetensors file whose header names every tensor with its offsets and checksum;
    the data region is left sparse (only the header is read here)."""
    header, meta, at = {}, {"dsckpt.data_xxh3": "0123456789abcdef"}, 0
    for i, (name, (dtype, shape)) in enumerate(tensors.items()):
        n = 4
        for x in shape:
            n *= x
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + n]}
        meta["dsckpt.xxh3." + name] = f"{i * 0x9e3779b97f4a7c15 % (1 << 64):016x}"
        at += n
    header["__metadata__"] = meta
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + at)


def timed(fn, repeat: int, before=lambda: None) -> float:
    """The fastest of ``repeat`` calls of fn, in ms (the least disturbed by other work on
    the machine), ``before`` run ahead of each, untimed."""
    best = float("inf")
    for _ in range(repeat):
        before()
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def age(path: str, step=[0]) -> None:
    """Gives path an mtime in the past, another one each call (a file written earlier and
    changed since the last read, as a new tag's file under the same path would be)."""
    step[0] += 1
    t = time.time() - 3600 + step[0]
    os.utime(path, (t, t))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--repeat", type=int, default=30)
    a = p.parse_args()
    from dsckpt import _fill
    from dsckpt._files import ST_DTYPES
    tensors = gpt_tensors(a.layers)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rank0.safetensors")
        write_header_only(path, tensors)
        hlen = struct.unpack("<Q", open(path, "rb").read(8))[0]
        dests = {n: torch.empty(s, dtype=ST_DTYPES[dt], device="meta")
                 for n, (dt, s) in tensors.items()}
        print(f"bench_header: {len(tensors)} tensors, header of {hlen / 1e3:.0f} kB; ms, "
              f"fastest of {a.repeat}")
        print(f"  {'':20} {'first':>8} {'parsed':>8} {'unchanged':>10}")
        for what, fn in (("header (load)", lambda: _fill.header(path)),
                         ("check (load_into)", lambda: _fill.check(path, dests, True))):
            age(path)
            first = timed(fn, 1)
            parsed = timed(fn, a.repeat, lambda: age(path))
            same = timed(fn, a.repeat)
            print(f"  {what:20} {first:8.2f} {parsed:8.2f} {same:10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
