#!/usr/bin/env python3
"""bench_handover.py — the time of the dsckpt.torch.save call, cold (the first save: the
walk and a new save plan) against warm (the same structure again: the cached hand-over),
for a GPT-like state dict of N tensors: {"model": OrderedDict of N/4 weights, "optim":
{"state": {i: {"step", "exp_avg", "exp_avg_sq"}}, "param_groups": [...]}} as
model.state_dict() and AdamW's state_dict() give it (CPU step scalars included), rebuilt
before every save as a trainer does (new dicts, new detached tensor objects, an lr that
changes). A micro-benchmark, not a test: it prints, it asserts only that warm saves were warm.

  python3 tests/python/bench_handover.py [--tensors 1556] [--saves 20] [--device cpu|cuda]
                                         [--socket PATH] [--root DIR] [--parts]
                                         [--evict-mib MIB] [--zero]

Weights and optimizer states have a storage each, as a model's do (--shared: views of one
storage per kind): rows of three dsckpt host buffers (dsckpt.torch.host_empty) on the CPU,
separate torch.randn tensors on a GPU (the caching allocator packs them into a few segments);
the step scalars are pageable CPU tensors, as AdamW makes them. Without --socket a daemon is started
from $DSCKPTD (default build/dsckptd) on a scratch directory by tests/python/conftest.py
(which imports pytest), logging at the default level (info) as a deployed one does; with one, --root must be a directory the daemon allows. Each save waits for SNAPSHOT
before the next (what a trainer does before its optimizer step), outside the timed call.
With --zero, the state dict is shaped as a DeepSpeed ZeRO optimizer file instead: the
optimizer's state dict inside one holding objects of allowed classes (dsckpt.add_safe_types:
a loss scaler, a stage Enum, a dataclass per parameter in param_slice_mappings), which the
Python encoder writes at every warm save.
With --parts, the steps of a warm save call are timed too (proving the structure, the
blob, each library call: the daemon's part is in the calls that wait for a reply) and their
medians printed. Run with PYTHONPATH=client/python (and DSCKPT_LIB when the library is not
found by itself).
"""
import argparse
import collections
import ctypes
import dataclasses
import enum
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))

import dsckpt  # noqa: E402
import dsckpt.torch as dt  # noqa: E402
from dsckpt import _handover, core  # noqa: E402

# What --parts times: (label, owner, attribute), each a step of a warm save call.
PARTS = [("prepare plan", _handover._Handing, "prepare"),
         ("match containers", _handover.Shape, "match"),
         ("prove tensors", _handover._Tensors, "hold"),
         ("leaves and blob", _handover._Entry, "blob_of"),
         ("SAVE_BEGIN", core.Connection, "save"),
         ("stage + add_plan", _handover._Entry, "add"),
         ("add_blob", core.Save, "add_blob"),
         ("set_stream", core.Save, "set_stream"),
         ("SAVE_END", core.Save, "end")]


def time_parts():
    """Wraps each of PARTS to record its seconds; returns {label: [seconds]}."""
    times = {label: [] for label, _, _ in PARTS}

    def wrap(label, fn):
        def timed(*args, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                times[label].append(time.perf_counter() - t0)
        return timed
    for label, owner, attr in PARTS:
        setattr(owner, attr, wrap(label, getattr(owner, attr)))
    return times


def own_storages(pool):
    """pool's rows, each a tensor with a storage of its own over the pool's memory (as a
    model's parameters are: separate storages, packed into a few allocator segments)."""
    rows = []
    for row in pool.unbind(0):
        raw = (ctypes.c_uint8 * (row.numel() * row.element_size())).from_address(row.data_ptr())
        raw._pool = pool  # the memory lives as long as any row
        rows.append(torch.frombuffer(raw, dtype=row.dtype).view(row.shape))
    return rows


def make_state(nparams, device, shared=False):
    """Weights and AdamW state for nparams parameters of 64 elements each (the tensor count
    is the point, not the bytes), and a function that rebuilds the state dict. Each tensor
    has a storage of its own, as a model's do (separate torch.randn calls on a GPU, which the
    caching allocator packs into a few segments; rows of three dsckpt host buffers on the
    CPU); shared: all rows of a kind views of one storage instead (the proof then checks
    every storage offset too)."""
    if device == "cpu":  # one buffer per kind, as a caching allocator's segments
        pools = [dt.host_empty((nparams, 8, 8)).normal_() for _ in range(3)]
        kinds = [list(p.unbind(0)) if shared else own_storages(p) for p in pools]
    elif shared:
        kinds = [list(torch.randn(nparams, 8, 8, device=device).unbind(0)) for _ in range(3)]
    else:
        kinds = [[torch.randn(8, 8, device=device) for _ in range(nparams)] for _ in range(3)]
    weights = kinds[0]
    states = [{"step": torch.tensor(10.0), "exp_avg": m, "exp_avg_sq": v}
              for m, v in zip(kinds[1], kinds[2])]
    lr = [1e-3]

    def state_dict():
        lr[0] *= 0.999  # a scheduler: param_groups changes every save
        model = collections.OrderedDict(
            (f"layers.{i // 4}.w{i % 4}", w.detach()) for i, w in enumerate(weights))
        model._metadata = collections.OrderedDict(
            (f"layers.{i}", {"version": 1}) for i in range(nparams // 4))
        optim = {"state": {i: dict(s) for i, s in enumerate(states)},
                 "param_groups": [{"lr": lr[0], "betas": (0.9, 0.95), "eps": 1e-8,
                                   "weight_decay": 0.1, "params": list(range(nparams))}]}
        return {"model": model, "optim": optim}
    return state_dict


class LossScaler:
    """DeepSpeed's static loss scaler: attributes only."""

    def __init__(self, scale):
        self.cur_scale = scale
        self.dynamic = False


class ZeroStage(int, enum.Enum):
    """DeepSpeed's ZeroStageEnum."""

    optimizer_states = 1
    gradients = 2


@dataclasses.dataclass
class FragmentAddress:
    """DeepSpeed's fragment_address."""

    numel: int
    start: int


def zero_file(state_dict):
    """state_dict() as DeepSpeed's ZeRO-2 optimizer file holds it (stage_1_and_2.py's
    state_dict()): allowed objects among the leaves."""
    def made():
        sd = state_dict()
        names = list(sd["model"])
        return {"optimizer_state_dict": {
            "loss_scaler": LossScaler(1.0), "dynamic_loss_scale": False, "overflow": False,
            "clip_grad": 1.0, "base_optimizer_state": sd["optim"],
            "single_partition_of_fp32_groups": list(sd["model"].values()),
            "zero_stage": ZeroStage.gradients, "group_paddings": [0], "partition_count": [1],
            "ds_version": "0.19.8",
            "param_slice_mappings": [collections.OrderedDict(
                (n, FragmentAddress(64, 64 * i)) for i, n in enumerate(names))]},
            "ds_config": {"zero_optimization": {"stage": 2}}}
    dsckpt.add_safe_types([LossScaler, ZeroStage, FragmentAddress])
    return made


def run(conn, root, state_dict, saves, device, evict=None):
    """Times each save call; returns [(handover, seconds)]: the first save, the warm ones,
    then cold saves of the same state dict under other file names (no first-call costs).
    evict: a CPU buffer written before each state_dict(), as a training step would."""
    out = []
    for i in range(saves + 3):
        if evict is not None:
            evict.fill_(i & 0xff)
        sd = state_dict()
        if device != "cpu":
            torch.cuda.synchronize()
        file = "rank0" if i < saves else f"other{i}"
        t0 = time.perf_counter()
        h = dt.save(sd, os.path.join(root, "bench", f"s{i}"), conn=conn, file=file,
                    track=False)
        out.append((h.handover, time.perf_counter() - t0))
        h.wait_snapshot(120)
    return out


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tensors", type=int, default=1556, help="tensors (4 per parameter)")
    p.add_argument("--saves", type=int, default=20)
    p.add_argument("--device", default="cpu")
    p.add_argument("--socket")
    p.add_argument("--root")
    p.add_argument("--parts", action="store_true", help="time the steps of warm saves too")
    p.add_argument("--zero", action="store_true", help="a DeepSpeed ZeRO optimizer file")
    p.add_argument("--evict-mib", type=int, default=0,
                   help="write this many MiB before each save, pushing the tensors' objects out "
                   "of the CPU's caches as training does between checkpoints (e.g. 1024)")
    p.add_argument("--shared", action="store_true",
                   help="each kind of tensor a view of one storage, not a storage each")
    a = p.parse_args(argv)
    parts = time_parts() if a.parts else None
    daemon = None
    if a.socket is None:
        sys.path.insert(0, HERE)
        from conftest import Daemon
        daemon = Daemon(cache_gib=1, log_level="info")  # as deployed: no line per request
        a.socket, a.root = daemon.socket, daemon.root
    try:
        conn = dsckpt.Connection(a.socket, job="bench", rank=0, world_size=1)
        evict = torch.empty(a.evict_mib << 20, dtype=torch.uint8) if a.evict_mib else None
        state_dict = make_state(max(a.tensors // 4, 1), a.device, a.shared)
        times = run(conn, a.root, zero_file(state_dict) if a.zero else state_dict, a.saves,
                    a.device, evict)
        conn.close()
    finally:
        if daemon is not None:
            daemon.stop()
    first = times[0][1] * 1e3
    cold = statistics.median(t * 1e3 for _, t in times[a.saves:])
    warm = [t * 1e3 for how, t in times[1:a.saves]]
    hows = collections.Counter(how for how, _ in times[1:a.saves])
    print(f"bench_handover: torch {torch.__version__}, {a.device}, {a.tensors // 4 * 4} "
          f"tensors, {a.saves} saves" + (f", {a.evict_mib} MiB written before each"
                                         if a.evict_mib else "")
          + (", a ZeRO optimizer file" if a.zero else ""))
    print(f"  first save call {first:9.3f} ms  ({times[0][0]}, with first-call costs)")
    print(f"  cold save call  {cold:9.3f} ms median of 3 (the walk and new plans: another file)")
    print(f"  warm save call  {statistics.median(warm):9.3f} ms median, "
          f"{min(warm):.3f} min, {max(warm):.3f} max  ({dict(hows)})")
    print(f"  cold / warm     {cold / statistics.median(warm):9.1f} x")
    for label, secs in (parts or {}).items():
        warm_secs = secs[1:a.saves]  # each step ran once per save (the first save: cold)
        if warm_secs:
            print(f"    {label:18s} {statistics.median(warm_secs) * 1e3:7.3f} ms median")
    return 0 if set(hows) == {"warm"} else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
