#!/usr/bin/env python3
"""bench_node.py — data-parallel training on one node, checkpointed three ways in one launch.

One launch spawns W worker ranks (torch.multiprocessing, W = the GPU count unless --ranks
says otherwise; rank r runs on GPU r % GPUs). Each rank trains bench_train.py's GPT-style
model wrapped in DistributedDataParallel, with AdamW and random tokens of its own (seeded
per rank), for the same ITERS iterations in each mode, checkpointing after every EVERY-th
optimizer step:

  baseline  no checkpoint;
  dsckpt    every rank hands {"model": module.state_dict(), "optim": optimizer.state_dict()}
            to the node's one dsckptd as its own file rank<r> (dsckpt.torch.save right after
            optimizer.step(), wait_snapshot() right before the next step), and commits each
            tag with dsckpt.torch.commit in a background thread, on a connection of its own
            and a gloo group of its own (the commit's all-reduce never meets the training's
            collectives on one group from two threads); then a restore check: every rank
            loads its file of the last checkpoint that has 3 iterations after it into a fresh
            DDP model + optimizer and runs those iterations on the same batches: the losses
            must equal the uninterrupted run's;
  dcp       torch.distributed.checkpoint.async_save with a gloo group for DCP's collectives
            (they run in DCP's background thread), the previous save's future waited for
            before the next save (SKIP where unavailable, e.g. torch 1.13).

Backend: NCCL when every rank has a GPU of its own. With more ranks than GPUs (e.g. 2 or 4
ranks on the one H200 lent today) NCCL refuses two ranks on one device, so the ranks use
gloo, whose all-reduce of CUDA gradients goes through host copies: that checks the paths
with several ranks per daemon, but its iteration times are not a measurement — the real one
needs one rank per GPU. Default size: ~8 GB of fp32 weights + AdamW state per GPU (--state-gb;
layers chosen to fit, so ranks sharing a GPU get smaller models).

Per mode (numbers from every rank, combined on rank 0): iteration time (median of the
slowest rank) over plain iterations, checkpoint iterations and the iterations right after;
blocked time per checkpoint (save call + the wait before the next step, max over ranks);
all ranks' bytes / blocked time; loop time against baseline. Prints a table last (rank 0);
writes every number to $OUT/node-train.json when OUT is set. Exit status 1 when a mode or
the restore check fails, 2 on bad usage or a missing daemon.

--smoke: a tiny model on the CPU, 2 ranks over gloo (torch 1.13 works).
"""
import argparse
import datetime
import json
import os
import shutil
import socket
import statistics
import sys
import time
import traceback

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # no NVLink multicast on the lent machines
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import bench_train as bt  # noqa: E402  (this directory: the model, modes and helpers)
import dsckpt  # noqa: E402
import dsckpt.torch as dt  # noqa: E402

RESUME_ITERS = bt.RESUME_ITERS
JOB = "bench-node"


def log(msg):
    """Prints one progress line at once."""
    print(msg, flush=True)


class DDPTrainer(bt.Trainer):
    """bench_train's seeded GPT + AdamW, the model wrapped in DistributedDataParallel (the
    optimizer keeps the same parameters); the checkpointed state is the unwrapped module's.
    The causal mask, a constant buffer built alike on every rank, is left out of DDP (it
    would broadcast it at start and before every forward; gloo cannot broadcast bool)."""

    def __init__(self, cfg, dev):
        super().__init__(cfg, dev)
        DDP._set_params_and_buffers_to_ignore_for_model(self.model, ["mask"])
        self.model = DDP(self.model, device_ids=[dev.index] if dev.type == "cuda" else None)

    def state(self):
        return {"model": self.model.module.state_dict(), "optim": self.opt.state_dict()}


class Node:
    """This rank's place in the job: rank, world, device and the gloo groups beside the
    training's default group (control: results and barriers; commit; dcp)."""

    def __init__(self, rank, world, dev, timeout):
        self.rank, self.world, self.dev = rank, world, dev
        self.ctl = dist.new_group(backend="gloo", timeout=timeout)
        self.commit = dist.new_group(backend="gloo", timeout=timeout)
        self.dcp = dist.new_group(backend="gloo", timeout=timeout)

    def on_zero(self, fn):
        """Runs fn on rank 0 after every rank got here, then lets every rank go on."""
        dist.barrier(group=self.ctl)
        if self.rank == 0:
            fn()
        dist.barrier(group=self.ctl)


class NodeDsckpt(bt.Dsckpt):
    """bench_train's dsckpt mode for one rank of many: its own file rank<r>, commits through
    dsckpt.torch.commit over the node's commit group, in the background thread."""

    def __init__(self, root, sock, node):
        super().__init__(root, sock, JOB, rank=node.rank, world=node.world, group=node.commit)
        self.node = node

    def cleanup(self, keep=None):
        self.close()
        self.node.on_zero(lambda: shutil.rmtree(self.root, ignore_errors=True))


class NodeDcp(bt.DcpAsync):
    """bench_train's DCP mode with async_save bound to the node's dcp group."""

    def __init__(self, root, node):
        super().__init__(root, group=node.dcp)  # the process group exists: it makes none
        self.node = node

    def cleanup(self):
        self.node.on_zero(super().cleanup)


def train(mode, cfg, node, batches, ckpt_iters):
    """Trains cfg.iters iterations of a fresh DDP trainer with mode's checkpoints (bench_train's
    loop; rank 0 logs); returns this rank's numbers in seconds, losses included."""
    res, trainer, _ = bt.run_mode(mode, cfg, node.dev, batches, ckpt_iters,
                                  make_trainer=DDPTrainer, verbose=node.rank == 0)
    nbytes = res["ckpt_bytes"] or bt.state_bytes(trainer.state())
    del trainer
    return {"iter_s": [x / 1e3 for x in res["iter_ms"]], "losses": res["losses"],
            "save_s": [x / 1e3 for x in res["save_call_ms"]],
            "wait_s": [x / 1e3 for x in res["wait_ms"]],
            "blocked_s": [x / 1e3 for x in res["blocked_ms"]], "nbytes": nbytes,
            "loop_s": res["loop_s"], "loop_s_after_first": res["loop_s_after_first"],
            "drain_s": res["drain_s"]}


def restore_check(cfg, node, batches, tag, start, ref_losses):
    """Loads this rank's file of tag into a fresh DDP model + optimizer, runs iterations
    start+1..start+RESUME_ITERS on the same batches and compares the losses with the
    uninterrupted run's."""
    t0 = time.perf_counter()
    state = dt.load(tag, f"rank{node.rank}")  # back onto the GPU it was saved from
    load_s = time.perf_counter() - t0
    trainer = DDPTrainer(cfg, node.dev)
    trainer.model.module.load_state_dict(state["model"])
    trainer.opt.load_state_dict(state["optim"])
    del state
    bt.free_memory(node.dev)
    rows = []
    for it in range(start + 1, start + RESUME_ITERS + 1):
        got = trainer.forward_backward(batches[it - 1]).item()
        trainer.opt.step()
        want = ref_losses[it - 1]
        rel = abs(got - want) / max(abs(want), 1e-30)
        rows.append({"rank": node.rank, "iter": it, "restored": got, "uninterrupted": want,
                     "rel_diff": rel, "exact": got == want, "ok": got == want or rel <= 1e-6})
    del trainer
    bt.free_memory(node.dev)
    return {"load_s": load_s, "rows": rows}


def med_ms(xs):
    """Median in ms, or None for no values."""
    return statistics.median(xs) * 1e3 if xs else None


def combine(name, ranks, ckpt_iters):
    """One mode's numbers over every rank: each iteration and each checkpoint counts at its
    slowest rank."""
    n = len(ranks[0]["iter_s"])
    slowest = [max(r["iter_s"][i] for r in ranks) for i in range(n)]
    after = {c + 1 for c in ckpt_iters} if name != "baseline" else set()
    at = set(ckpt_iters) if name != "baseline" else set()
    nckpt = min(len(r["blocked_s"]) for r in ranks)
    blocked = [max(r["blocked_s"][k] for r in ranks) for k in range(nckpt)]
    nbytes = sum(r["nbytes"] or 0 for r in ranks)
    res = {
        "mode": name,
        "iter_ms_slowest_rank": [x * 1e3 for x in slowest],
        "iter_ms_plain": med_ms([slowest[i - 1] for i in range(2, n + 1)
                                 if i not in at and i not in after]),
        "iter_ms_ckpt": med_ms([slowest[i - 1] for i in range(2, n + 1) if i in at]),
        "iter_ms_after": med_ms([slowest[i - 1] for i in range(2, n + 1) if i in after]),
        "blocked_ms": [x * 1e3 for x in blocked],
        "blocked_ms_median": med_ms(blocked),
        "blocked_ms_max": max(blocked) * 1e3 if blocked else None,
        "ckpt_bytes_all_ranks": nbytes,
        "effective_gbps": None,
        "loop_s_after_first": max(r["loop_s_after_first"] for r in ranks),
        "drain_s": max(r["drain_s"] for r in ranks),
        "per_rank": ranks,
    }
    if blocked and statistics.median(blocked) > 0:
        res["effective_gbps"] = nbytes / statistics.median(blocked) / 1e9
    return res


def table(results, base):
    """The summary table (printed last); adds each mode's slowdown against baseline."""
    def row(r, slow):
        gb = r["ckpt_bytes_all_ranks"] / 1e9 if r["ckpt_bytes_all_ranks"] and r["blocked_ms"] \
            else None
        return (f"{r['mode']:<16} {bt.fmt(r['iter_ms_plain'], '14.1f')} "
                f"{bt.fmt(r['iter_ms_ckpt'], '7.1f')} {bt.fmt(r['iter_ms_after'], '7.1f')} "
                f"{bt.fmt(r['blocked_ms_median'], '21.2f')} "
                f"{bt.fmt(r['blocked_ms_max'], '9.2f')} {bt.fmt(gb, '8.3f')} "
                f"{bt.fmt(r['effective_gbps'], '10.1f')} {bt.pct(slow, 8)}")
    return bt.table_of(results, base,
                       f"{'mode':<16} {'iter ms: plain':>14} {'ckpt':>7} {'next':>7} "
                       f"{'blocked/ckpt ms: med':>21} {'max':>9} {'GB/ckpt':>8} "
                       f"{'eff. GB/s':>10} {'vs base':>8}", row)


def make_mode(name, cfg, node):
    """The mode called name, None where it is unavailable here (the same on every rank)."""
    if name == "baseline":
        return bt.NoCkpt()
    if name == "dsckpt":
        return NodeDsckpt(cfg.dir, cfg.socket, node)
    if name == "dcp":
        try:
            return NodeDcp(cfg.dir, node)
        except (ImportError, NotImplementedError, AttributeError) as e:
            if node.rank == 0:
                log(f"  SKIP: dcp.async_save unavailable: {e}")
            return None
    raise ValueError(f"unknown mode {name!r}")


def run_one(name, cfg, node, batches, ckpt_iters, resumable):
    """Runs one mode on this rank: its numbers, its restore check (dsckpt) and its error."""
    mine = {"error": None}
    mode = None
    try:
        mode = make_mode(name, cfg, node)
        if mode is None:
            return {"skipped": "torch.distributed.checkpoint.async_save unavailable"}
        res = train(mode, cfg, node, batches, ckpt_iters)
        mine.update(res)
        bt.free_memory(node.dev)
        if name == "dsckpt":
            mine["commit_s"] = {os.path.basename(k): v for k, v in mode.committed.items()}
            if resumable:
                start = resumable[-1]
                mine["restore"] = restore_check(cfg, node, batches, mode.tag_dir(start),
                                                start, res["losses"])
                mine["restore"]["tag"] = mode.tag_dir(start)
    except Exception as e:
        traceback.print_exc()
        log(f"  rank {node.rank}: {name}: FAILED: {type(e).__name__}: {e}")
        mine["error"] = f"{type(e).__name__}: {e}"
    finally:
        if mode is not None:
            try:
                if isinstance(mode, bt.DcpAsync):
                    mode.finish()
                mode.cleanup()
            except Exception as e:
                log(f"  rank {node.rank}: {name}: cleanup failed: {e}")
        bt.free_memory(node.dev)
    return mine


def restore_summary(ranks, resumable):
    """The restore check over every rank (rank 0's view)."""
    if not resumable:
        return {"ok": False, "error": f"no checkpoint with {RESUME_ITERS} iterations after it "
                                      "(raise --iters)"}
    if any(r.get("restore") is None for r in ranks):
        return {"ok": False, "error": "a rank did not run it"}
    rows = [row for r in ranks for row in r["restore"]["rows"]]
    return {"ok": all(row["ok"] for row in rows), "tag": ranks[0]["restore"]["tag"],
            "load_s_max": max(r["restore"]["load_s"] for r in ranks), "iters": rows}


def worker(rank, cfg, status):
    """One rank: joins the job, runs every mode, and on rank 0 reports."""
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // cfg.ranks))
    if cfg.smoke:
        dev, backend = torch.device("cpu"), "gloo"
    else:
        dev = torch.device("cuda", rank % cfg.gpus)
        backend = "nccl" if cfg.ranks <= cfg.gpus else "gloo"
        torch.cuda.set_device(dev)
        cfg.device = f"{cfg.gpus} x {torch.cuda.get_device_name(dev)}"
    torch.use_deterministic_algorithms(True, warn_only=True)
    det = getattr(torch.utils, "deterministic", None)
    if det is not None and hasattr(det, "fill_uninitialized_memory"):
        det.fill_uninitialized_memory = False  # no NaN fill of every torch.empty
    timeout = datetime.timedelta(seconds=cfg.pg_timeout)
    extra = {"device_id": dev} if backend == "nccl" else {}
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=cfg.ranks,
                            timeout=timeout, **extra)
    node = Node(rank, cfg.ranks, dev, timeout)
    rank_cfg = argparse.Namespace(**{**vars(cfg), "seed": cfg.seed + 1000 * rank})
    batches = bt.make_batches(rank_cfg, dev)  # this rank's own tokens (the model seed is shared)
    ckpt_iters = set(range(cfg.every, cfg.iters + 1, cfg.every))
    resumable = [c for c in sorted(ckpt_iters) if c + RESUME_ITERS <= cfg.iters]
    results, base, restore, failures = [], None, None, 0
    for name in [m.strip() for m in cfg.modes.split(",") if m.strip()]:
        left = [cfg.budget - (time.monotonic() - cfg.t_start)]
        dist.broadcast_object_list(left, src=0, group=node.ctl)  # every rank decides alike
        if left[0] < cfg.budget / 4:
            if rank == 0:
                log(f"== {name}: SKIP: only {left[0]:.0f} s of the {cfg.budget:.0f} s budget left")
            results.append({"mode": name, "skipped": f"out of time ({left[0]:.0f} s left)"})
            continue
        if rank == 0:
            log(f"== {name}")
        mine = run_one(name, cfg, node, batches, ckpt_iters, resumable)
        ranks = [None] * cfg.ranks if rank == 0 else None
        dist.gather_object(mine, ranks, dst=0, group=node.ctl)
        if rank != 0:
            continue
        if mine.get("skipped"):
            results.append({"mode": name, "skipped": mine["skipped"]})
            continue
        bad = [f"rank {i}: {r['error']}" for i, r in enumerate(ranks) if r["error"]]
        if bad:
            failures += 1
            results.append({"mode": name, "error": "; ".join(bad)})
            if name == "dsckpt":
                restore = {"ok": False, "error": "dsckpt mode failed"}
            continue
        res = combine(name, ranks, ckpt_iters)
        results.append(res)
        base = res if name == "baseline" else base
        log(f"  [{name}] median iteration {bt.fmt(res['iter_ms_plain'], '.1f')} ms (slowest "
            f"rank); blocked per checkpoint (max over ranks) "
            f"{', '.join(f'{x:.1f}' for x in res['blocked_ms']) or '-'} ms; drain "
            f"{res['drain_s']:.2f} s")
        if name == "dsckpt":
            res["commit_s_rank0"] = ranks[0]["commit_s"]
            log(f"  [dsckpt] seconds from save to COMMITTED (rank 0): {ranks[0]['commit_s']}")
            restore = restore_summary(ranks, resumable)
            for row in restore.get("iters", []):
                log(f"  restore rank {row['rank']} iter {row['iter']}: restored "
                    f"{row['restored']!r} uninterrupted {row['uninterrupted']!r} rel diff "
                    f"{row['rel_diff']:.3g} "
                    f"{'exact' if row['exact'] else 'OK' if row['ok'] else 'MISMATCH'}")
            log(f"  restore check: {'PASS' if restore['ok'] else 'FAILED'}"
                + (f" ({restore['error']})" if restore.get("error") else "")
                + (f" (load {restore['load_s_max']:.2f} s)" if "load_s_max" in restore else ""))
    if rank == 0:
        if restore is None and "dsckpt" in cfg.modes:
            restore = {"ok": False, "error": "dsckpt mode did not run"}
        report(cfg, backend, results, base, restore, failures)
        status.value = 1 if failures or (restore is not None and not restore.get("ok")) else 0
    dist.barrier(group=node.ctl)
    dist.destroy_process_group()


def report(cfg, backend, results, base, restore, failures):
    """Rank 0: writes $OUT/node-train.json and prints the summary."""
    summary = table(results, base)
    info = {"torch": torch.__version__, "backend": backend, "ranks": cfg.ranks,
            "gpus": cfg.gpus, "device": cfg.device, "params_per_rank": cfg.params,
            "config": {k: v for k, v in vars(cfg).items() if k != "t_start"},
            "checkpoint_iters": list(range(cfg.every, cfg.iters + 1, cfg.every)),
            "dsckpt_lib": dsckpt._lib.path, "results": results, "restore": restore,
            "failures": failures, "wall_s": time.monotonic() - cfg.t_start}
    out = os.environ.get("OUT")
    if out and os.path.isdir(out):
        with open(os.path.join(out, "node-train.json"), "w") as f:
            json.dump(info, f, indent=1)
    log("")
    log(f"== bench-node summary ({cfg.ranks} ranks on {cfg.device}, {backend}; "
        f"{cfg.params * 12 / 1e9:.2f} GB weights + AdamW per rank; checkpoint every {cfg.every} "
        f"of {cfg.iters} iterations; times of the slowest rank, blocked = max over ranks; "
        "vs base = loop time after the first iteration)")
    if backend == "gloo" and not cfg.smoke:
        log("NOTE: ranks share GPUs (gloo, gradients through host copies): the paths are "
            "checked, the times are not a measurement (that needs one rank per GPU)")
    log(summary)
    if restore is not None:
        log(f"restore check: {'PASS' if restore.get('ok') else 'FAILED'}"
            + (f" ({restore['error']})" if restore.get("error") else ""))


def params_of(cfg, layers):
    """Parameters of bench_train's GPT with cfg's sizes and the given layer count."""
    d = cfg.d_model
    return layers * (12 * d * d + 13 * d) + (2 * cfg.vocab + cfg.seq + 2) * d


def parse_args(argv):
    """Command line: sizes default to the GPU run, --smoke to a tiny 2-rank CPU run."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--socket", required=True, help="dsckptd's socket")
    p.add_argument("--dir", required=True, help="checkpoint root (one of the daemon's roots)")
    p.add_argument("--smoke", action="store_true", help="tiny model on the CPU, gloo")
    p.add_argument("--ranks", type=int, help="ranks (default: the GPU count; smoke: 2)")
    p.add_argument("--iters", type=int)
    p.add_argument("--every", type=int)
    p.add_argument("--state-gb", type=float, default=8.0,
                   help="fp32 weights + AdamW state per GPU that picks --layers (default 8)")
    p.add_argument("--d-model", type=int)
    p.add_argument("--layers", type=int, help="default: from --state-gb")
    p.add_argument("--heads", type=int)
    p.add_argument("--vocab", type=int)
    p.add_argument("--seq", type=int)
    p.add_argument("--batch", type=int, help="per rank")
    p.add_argument("--accum", type=int, default=1,
                   help="micro-batches of --batch per iteration (gradient accumulation)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--modes", default="baseline,dsckpt,dcp",
                   help="comma-separated, run in this order")
    p.add_argument("--budget", type=float, default=420.0,
                   help="seconds; a mode is skipped once less than a quarter is left")
    p.add_argument("--pg-timeout", type=float, default=300.0,
                   help="seconds a collective may wait before it fails")
    a = p.parse_args(argv)
    if a.smoke:
        dflt = dict(ranks=2, iters=11, every=4, d_model=64, layers=2, heads=4, vocab=128,
                    seq=16, batch=4)
    else:  # checkpoints after 8, 16, 24, 32; the one of 32 is restored and run to 35
        dflt = dict(ranks=None, iters=35, every=8, d_model=2048, layers=None, heads=16,
                    vocab=32000, seq=512, batch=32)
    for k, v in dflt.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.iters < 1 or a.every < 1 or a.accum < 1 or a.d_model % a.heads or \
            (a.ranks is not None and a.ranks < 1):
        p.error("need --iters >= 1, --every >= 1, --accum >= 1, --ranks >= 1 and --d-model "
                "divisible by --heads")
    return a


def free_port():
    """A TCP port on the loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv):
    cfg = parse_args(argv)
    cfg.t_start = time.monotonic()
    if cfg.smoke:
        cfg.gpus, cfg.device = 0, "cpu"
    elif not torch.cuda.is_available():
        log("bench-node: SKIP: torch sees no CUDA device (use --smoke for the CPU)")
        return 0
    else:
        cfg.gpus, cfg.device = torch.cuda.device_count(), "cuda"
        cfg.ranks = cfg.ranks or cfg.gpus
    per_gpu = 1 if cfg.smoke else -(-cfg.ranks // cfg.gpus)
    if cfg.layers is None:
        per_layer, fixed = params_of(cfg, 1) - params_of(cfg, 0), params_of(cfg, 0)
        cfg.layers = max(1, round((cfg.state_gb * 1e9 / per_gpu / 12 - fixed) / per_layer))
    cfg.params = params_of(cfg, cfg.layers)
    if not bt.ready(cfg, "bench-node"):
        return 2
    backend = "gloo" if cfg.smoke or cfg.ranks > cfg.gpus else "nccl"
    log(f"bench-node: torch {torch.__version__}, {cfg.ranks} ranks on {cfg.device} "
        f"({per_gpu} per {'GPU' if cfg.gpus else 'CPU'}), {backend}; per rank ~"
        f"{cfg.params / 1e9:.3f} B params (~{cfg.params * 12 / 1e9:.2f} GB weights + AdamW): "
        f"d_model {cfg.d_model}, {cfg.layers} layers, {cfg.heads} heads, vocab {cfg.vocab}, "
        f"batch {cfg.batch} x seq {cfg.seq}; {cfg.iters} iterations, checkpoints after "
        f"{list(range(cfg.every, cfg.iters + 1, cfg.every))}")
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    status = mp.get_context("spawn").Value("i", 1)
    try:
        mp.spawn(worker, args=(cfg, status), nprocs=cfg.ranks, join=True)
    except Exception as e:
        log(f"bench-node: FAILED: a rank died: {type(e).__name__}: {e}")
        return 1
    return status.value


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
