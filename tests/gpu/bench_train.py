#!/usr/bin/env python3
"""bench_train.py — checkpointing a real PyTorch training loop, six ways, in one run.

Over 900 lines: one script, run as is on the GPU node (tests/gpu/run-train), with
save_progress.py beside it; its modes share one model, one batch stream and one timing harness.

A GPT-style decoder (hand-written causal attention + MLP, fp32 weights, bf16 autocast on the
GPU, random tokens, cross-entropy, AdamW) is trained for the same ITERS iterations in each
mode, with a checkpoint of {"model": model.state_dict(), "optim": optimizer.state_dict()}
after every EVERY-th optimizer step:

  baseline     no checkpoint;
  dsckpt       dsckpt.torch.save right after optimizer.step() (tensors by reference),
               wait_snapshot() right before the next optimizer.step(), commit of each tag in a
               background thread on a connection of its own (the daemon's COMMIT waits for
               DURABLE); then a restore check: the last checkpoint that has 3 iterations after
               it is loaded into a fresh model + optimizer, which runs those 3 iterations on the
               same batches: the losses must equal the uninterrupted run's;
               With --ctl, a thread samples each save's bytes snapshotted and flushed over time
               (dsckptctl --json pending, its own process and connection) into "progress";
  dsckpt-dcp   DCP async_save with storage_writer=dsckpt.dcp.Writer (its AsyncStager: the
               tensors go to the daemon by reference); staging_completion (SNAPSHOT) waited
               for before the next optimizer step, the uploads (COMMITTED) after the loop;
  dcp-async    DCP async_save with DCP's own DefaultStager (pinned-memory staging in a thread,
               staging_completion waited for before the next step) and FileSystemWriter, the
               previous upload waited for before the next save (SKIP where unavailable;
               not in the presets: torch 2.11's DefaultStager fails on the H200 with
               KeyError: <class 'type'> in its deep copy of this state, plain dicts too);
  torch.save   blocking torch.save of the state into the checkpoint root;
  dcp          torch.distributed.checkpoint.async_save (single-process gloo group) with its
               defaults (staging on the calling thread, FileSystemWriter), waiting for the
               previous save's future before the next save (SKIP where unavailable).
  dsckpt-remote  the dsckpt mode (no restore check) on --remote-dir, a root with a remote
               tier, every save waited for at REMOTE after the loop (tests/gpu/run-train-tiers);
  dsckpt-peer  the dsckpt mode as rank 0 of a 2-rank job whose rank 1 saves a small file
               through a second daemon (--peer-socket, peer copies on), the tag committed by
               both ranks' seals, every save waited for at REPLICATED after the loop.

Each mode starts from the same seeded model and sees the same batches. Blocked time per
checkpoint = time inside the save call + every wait the loop makes for it. Prints progress,
then a table last; writes every number to $OUT/train.json when OUT is set. Exit status 1 when
the restore check fails or a mode fails, 2 on bad usage or a missing daemon.

--preset picks sizes and schedule (PRESETS below): checkpoint-every-16 (default), steady,
handover (the default's tensors at d_model 512, a checkpoint every 8 iterations: the median of
nine warm save calls), smoke (a tiny model on the CPU, torch 1.13 works, for checking the paths
end to end; also --smoke), tiers (the tier modes' run, tests/gpu/run-train-tiers).
"""
import argparse
import gc
import json
import os
import queue
import shutil
import statistics
import subprocess
import sys
import threading
import time
import traceback

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import dsckpt  # noqa: E402
import dsckpt.torch as dt  # noqa: E402
from save_progress import SaveSampler  # noqa: E402  (this directory)

RESUME_ITERS = 3  # iterations compared after the restore


def log(msg):
    """Prints one progress line at once."""
    print(msg, flush=True)


class Block(nn.Module):
    """One pre-norm decoder block: causal multi-head attention, then a 4x GELU MLP."""

    def __init__(self, d, heads, device):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d, device=device)
        self.qkv = nn.Linear(d, 3 * d, device=device)
        self.proj = nn.Linear(d, d, device=device)
        self.ln2 = nn.LayerNorm(d, device=device)
        self.fc1 = nn.Linear(d, 4 * d, device=device)
        self.fc2 = nn.Linear(4 * d, d, device=device)

    def forward(self, x, mask):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads) \
            .permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
        att = att.masked_fill(mask, float("-inf")).softmax(-1).to(v.dtype)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    """Token + position embeddings, decoder blocks, final norm, untied output head."""

    def __init__(self, vocab, seq, d, layers, heads, device):
        super().__init__()
        self.tok = nn.Embedding(vocab, d, device=device)
        self.pos = nn.Embedding(seq, d, device=device)
        self.blocks = nn.ModuleList(Block(d, heads, device) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, device=device)
        self.head = nn.Linear(d, vocab, bias=False, device=device)
        self.register_buffer("mask", torch.ones(seq, seq, dtype=torch.bool, device=device)
                             .triu(1), persistent=False)

    def forward(self, idx):
        s = idx.shape[1]
        x = self.tok(idx) + self.pos.weight[:s]
        for blk in self.blocks:
            x = blk(x, self.mask[:s, :s])
        return self.head(self.ln_f(x))


class Trainer:
    """A seeded model + AdamW and the step of one iteration."""

    def __init__(self, cfg, dev):
        torch.manual_seed(cfg.seed)
        self.dev = dev
        self.cfg = cfg
        self.model = GPT(cfg.vocab, cfg.seq, cfg.d_model, cfg.layers, cfg.heads, dev)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=0.1)

    def forward_backward(self, batches):
        """Mean loss of one iteration's micro-batches (a 0-d tensor); their gradients,
        accumulated, left in .grad."""
        self.opt.zero_grad(set_to_none=True)
        total = None
        for batch in batches:
            inp, tgt = batch[:, :-1], batch[:, 1:]
            with torch.autocast(self.dev.type, dtype=torch.bfloat16,
                                enabled=self.dev.type == "cuda"):
                logits = self.model(inp)
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                   tgt.reshape(-1)) / len(batches)
            loss.backward()
            total = loss.detach() if total is None else total + loss.detach()
        return total

    def state(self):
        """The checkpointed state: references to the live tensors."""
        return {"model": self.model.state_dict(), "optim": self.opt.state_dict()}


def sync(dev):
    """Waits for the device's queued work."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def state_bytes(obj):
    """Bytes of every tensor in a nested dict/list/tuple."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(state_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(state_bytes(v) for v in obj)
    return 0


def free_memory(dev):
    """Drops unreachable objects and returns cached device memory."""
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def median(xs):
    """Median, or None for no values."""
    return statistics.median(xs) if xs else None


class Mode:
    """How one mode checkpoints: save() after a step, before_step() before the next step,
    finish() after the loop (not on the critical path), cleanup() to delete its files."""

    name = "?"

    def save(self, it, trainer):
        pass

    def before_step(self, it):
        pass

    def finish(self):
        pass

    def extra(self):
        """Numbers of its own for the mode's result (after finish())."""
        return {}

    def cleanup(self):
        pass


class NoCkpt(Mode):
    name = "baseline"


class TorchSave(Mode):
    """Blocking torch.save into root/torchsave/step<N>.pt."""

    name = "torch.save"

    def __init__(self, root):
        self.dir = os.path.join(root, "torchsave")
        os.makedirs(self.dir, exist_ok=True)

    def save(self, it, trainer):
        torch.save(trainer.state(), os.path.join(self.dir, f"step{it}.pt"))

    def cleanup(self):
        shutil.rmtree(self.dir, ignore_errors=True)


class DcpAsync(Mode):
    """torch.distributed.checkpoint.async_save into root/dcp/step<N>; the previous save's
    future is waited for before the next save (the staging future, where async_save returns
    one, before the next optimizer step)."""

    name = "dcp.async_save"

    def __init__(self, root, group=None, subdir="dcp"):
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        if not hasattr(dcp, "async_save"):
            raise NotImplementedError(f"torch {torch.__version__} has no "
                                      "torch.distributed.checkpoint.async_save")
        self.dist, self.dcp = dist, dcp
        self.dir = os.path.join(root, subdir)
        os.makedirs(self.dir, exist_ok=True)
        self.own_group = False
        if not dist.is_initialized():
            store = os.path.join(root, "dcp-pg-store")
            if os.path.exists(store):
                os.unlink(store)
            dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
            self.own_group = True
        self.upload = None
        self.staging = None
        # DCP's collectives run in its background thread: a group of their own keeps them
        # apart from the training's (several ranks).
        self.group_kw = {"process_group": group} if group is not None else {}

    def save(self, it, trainer):
        if self.upload is not None:
            self.upload.result()
        r = self.dcp.async_save(self.state(trainer), **self.group_kw, **self.save_kwargs(it),
                                checkpoint_id=os.path.join(self.dir, f"step{it}"))
        if hasattr(r, "upload_completion"):
            self.staging, self.upload = r.staging_completion, r.upload_completion
        else:
            self.upload = r

    def save_kwargs(self, it):
        """async_save's arguments beyond the state, the group and the directory."""
        return {}

    def state(self, trainer):
        """The state as DCP wants it: get_state_dict's FQN-keyed dicts where this torch has
        it, else the plain state dicts."""
        try:
            from torch.distributed.checkpoint.state_dict import get_state_dict
        except ImportError:
            return trainer.state()
        model_sd, optim_sd = get_state_dict(trainer.model, trainer.opt)
        return {"model": model_sd, "optim": optim_sd}

    def before_step(self, it):
        if self.staging is not None:
            self.staging.result()
            self.staging = None

    def finish(self):
        if self.upload is not None:
            self.upload.result()
            self.upload = None

    def cleanup(self):
        if self.own_group:
            self.dist.destroy_process_group()
            self.own_group = False
        shutil.rmtree(self.dir, ignore_errors=True)


class DcpStager(DcpAsync):
    """DcpAsync with DCP's own background staging: async_save(async_stager=DefaultStager(
    StagingOptions(...))), which copies the state into pinned host memory (on the GPU) in a
    thread and returns staging_completion, waited for before the next optimizer step; the
    FileSystemWriter's upload is waited for before the next save, as in DcpAsync (SKIP where
    this torch has no DefaultStager)."""

    name = "dcp.async+stager"

    def __init__(self, root, cuda, group=None):
        from torch.distributed.checkpoint import staging
        if not hasattr(staging, "DefaultStager"):
            raise NotImplementedError(f"torch {torch.__version__} has no "
                                      "torch.distributed.checkpoint.staging.DefaultStager")
        # THREAD checkpointer: no shared memory; pinned memory and non-blocking copies need CUDA.
        # Made before the process group, so that an API this torch lacks leaves nothing behind.
        self.stager = staging.DefaultStager(staging.StagingOptions(
            use_pinned_memory=cuda, use_shared_memory=False, use_async_staging=True,
            use_non_blocking_copy=cuda))
        super().__init__(root, group, subdir="dcp-stager")

    def save_kwargs(self, it):
        """The stager, shared by every save (it keeps its pinned buffers)."""
        return {"async_stager": self.stager}

    def state(self, trainer):
        """DcpAsync's state in plain dicts: DefaultStager's deep copy (torch 2.11) fails on
        a state dict's OrderedDict and its _metadata (KeyError: <class 'type'>, seen on the
        H200), which a user of it would have to work around the same way."""
        def plain(x):
            if isinstance(x, dict):
                return {k: plain(v) for k, v in x.items()}
            if isinstance(x, list):
                return [plain(v) for v in x]
            return x
        return plain(super().state(trainer))

    def cleanup(self):
        """Closes the stager (its thread and pinned memory), then DcpAsync's clean-up."""
        close = getattr(self.stager, "close", None)
        if close is not None:
            close()
        super().cleanup()


class DsckptDcp(DcpAsync):
    """DCP async_save through dsckpt.dcp.Writer (DCP's StorageWriter and AsyncStager on
    dsckptd) into root/<job>/step<N>: staging hands the tensors to the daemon by reference and
    staging_completion resolves at SNAPSHOT, waited for before the next optimizer step; the
    upload (DCP's plan, Metadata, commit) resolves at COMMITTED in a thread of DCP's. As in the
    dsckpt mode, a save does not wait for the previous one's commit (async_save starts an
    executor per save); finish() waits for every upload. One process: no_dist, so that two
    uploads in flight run no collectives side by side. Each save has a connection of its own,
    closed when its upload is done, so that two uploads in flight share nothing."""

    name = "dsckpt.dcp"

    def __init__(self, root, socket, job):
        import dsckpt.dcp as ddcp
        super().__init__(root, subdir=job)
        self.Writer = ddcp.Writer
        self.socket, self.job = socket, job
        self.uploads, self.conns = [], []
        self.saved_at = {}
        self.committed = {}   # tag -> seconds from save to COMMITTED

    def save(self, it, trainer):
        """async_save into step<it> on a new connection; its staging is waited for in
        before_step, its upload only in finish()."""
        d = os.path.join(self.dir, f"step{it}")
        self.saved_at[d] = time.perf_counter()
        conn = dsckpt.Connection(self.socket, job=self.job, rank=0, world_size=1)
        self.conns.append(conn)
        r = self.dcp.async_save(self.state(trainer), checkpoint_id=d, no_dist=True,
                                storage_writer=self.Writer(d, conn=conn, timeout=300))
        self.staging = r.staging_completion
        r.upload_completion.add_done_callback(lambda f, d=d: self._uploaded(f, d))
        self.uploads.append(r.upload_completion)

    def _uploaded(self, future, d):
        """Notes when tag d was COMMITTED (DCP's thread calls it when the upload is done)."""
        if future.exception() is None:
            self.committed[os.path.basename(d)] = time.perf_counter() - self.saved_at[d]

    def finish(self):
        """Waits for staging and for every upload (COMMITTED); raises the first error."""
        self.before_step(None)
        try:
            for u in self.uploads:
                u.result()
        finally:
            self.uploads = []
            self.close()

    def extra(self):
        """Seconds from each save call to COMMITTED, by tag."""
        return {"commit_s": dict(self.committed)}

    def close(self):
        """Closes the saves' connections (their uploads are over)."""
        for c in self.conns:
            if not c.closed:
                c.close()
        self.conns = []

    def cleanup(self):
        """Closes the connections, then DcpAsync's clean-up."""
        self.close()
        super().cleanup()


class Dsckpt(Mode):
    """dsckpt.torch.save after the step, wait_snapshot before the next step, commits in a
    background thread on a second connection. With several ranks each saves its own file
    rank<r> and the commit goes through dsckpt.torch.commit over group (a group of its own:
    the commit thread's collectives must not meet the training's).

    The tiers (--remote-dir, --peer-socket): wait_level (Level.REMOTE or Level.REPLICATED)
    is waited for on every save after the loop (level_timeout seconds in all), off the
    timed iterations; peer, a connection to a second daemon as rank 1 of a 2-rank job on
    the same root, makes each tag a 2-node commit that the daemons replicate: the commit
    thread saves rank 1's small file there and seals it, seals rank 0, and waits for the
    tag's MANIFEST.json (a tag committed by a COMMIT, without seal records, is not sent)."""

    name = "dsckpt"

    def __init__(self, root, socket, job, rank=0, world=1, group=None, sampler=None,
                 name=None, wait_level=None, peer=None, run=None, level_timeout=120.0):
        if name:
            self.name = name
        self.root = os.path.join(root, job)
        self.sampler = sampler   # a SaveSampler, or None
        self.snapshot_s = {}     # tag -> seconds from the save call until wait_snapshot returned
        self.progress, self.sampler_errors = None, []   # the sampler's, once stopped
        self.rank, self.group = rank, group
        self.wait_level, self.peer, self.level_timeout = wait_level, peer, level_timeout
        self.handles = []      # every save's handle, when wait_level is set
        self.reached = {}      # tag -> seconds from its save until its wait for wait_level ended
        self.level_errors = []
        self.conn = dsckpt.Connection(socket, job=job, rank=rank, world_size=world, run=run)
        self.commit_conn = dsckpt.Connection(socket, job=job, rank=rank, world_size=world,
                                             run=run)
        self.handle = None
        self.calls = []       # (how dt.save handed over, ms in the call) per checkpoint
        self.tags = []
        self.saved_at = {}
        self.committed = {}   # tag -> seconds from save to COMMITTED
        self.errors = []
        self.queue = queue.Queue()
        self.thread = threading.Thread(target=self._committer, name="dsckpt-commit", daemon=True)
        self.thread.start()

    def tag_dir(self, it):
        return os.path.join(self.root, f"step{it}")

    def _committer(self):
        """Commits each tag handed over, in order (COMMIT waits until it is DURABLE)."""
        while True:
            tag = self.queue.get()
            if tag is None:
                return
            try:
                if self.peer is not None:
                    self._commit_two_nodes(tag)
                elif self.group is None:
                    self.commit_conn.commit(tag, timeout=300)
                else:
                    dt.commit(tag, self.group, conn=self.commit_conn, timeout=300)
                self.committed[tag] = time.perf_counter() - self.saved_at[tag]
            except Exception as e:  # reported by finish()
                self.errors.append(f"commit {tag}: {e}")

    def _commit_two_nodes(self, tag):
        """Rank 1 saves a small file into tag through the second daemon and seals; rank 0
        seals; the daemons commit the tag once both files are DURABLE: waits (300 s at most)
        for its MANIFEST.json."""
        small = {"rank": torch.arange(1024, dtype=torch.float32)}
        h = dt.save(small, tag, conn=self.peer, file="rank1", track=False)
        h.wait_snapshot(timeout=300)
        self.peer.seal(tag)
        self.commit_conn.seal(tag)
        manifest, end = os.path.join(tag, "MANIFEST.json"), time.monotonic() + 300
        while not os.path.exists(manifest):
            if time.monotonic() > end:
                raise TimeoutError(f"{tag} not committed 300 s after both ranks sealed it")
            time.sleep(0.005)

    def save(self, it, trainer):
        d = self.tag_dir(it)
        self.saved_at[d] = time.perf_counter()
        if self.sampler is not None:
            self.sampler.track(d, self.saved_at[d])
        state = trainer.state()
        t0 = time.perf_counter()
        self.handle = dt.save(state, d, conn=self.conn, file=f"rank{self.rank}", track=False)
        self.calls.append((self.handle.handover, (time.perf_counter() - t0) * 1e3))
        if self.wait_level is not None:
            self.handles.append(self.handle)
        self.nbytes = self.handle.nbytes
        self.tags.append(d)
        self.queue.put(d)

    def before_step(self, it):
        if self.handle is not None:
            self.handle.wait_snapshot(timeout=300)
            d = self.tags[-1]
            self.snapshot_s[os.path.basename(d)] = time.perf_counter() - self.saved_at[d]
            self.handle = None

    def finish(self):
        self.before_step(None)
        self.queue.put(None)
        self.thread.join(timeout=600)
        if self.thread.is_alive():
            self.errors.append("commit thread still running after 600 s")
        elif self.wait_level is not None and not self.errors:
            self._wait_level()
        if self.sampler is not None:
            self.progress = self.sampler.stop()
            for e in self.progress:
                e["snapshot_s"] = self.snapshot_s.get(e["tag"])
            self.sampler_errors = self.sampler.errors[:5]
            self.sampler = None
        if self.errors:
            raise RuntimeError("; ".join(self.errors))

    def _wait_level(self):
        """Waits for every save to reach wait_level, level_timeout seconds in all; notes
        the seconds from each save call until its wait returned (an upper bound: a save that
        got there during an earlier wait is seen only when its own wait is asked), and why
        a save did not get there."""
        end = time.monotonic() + self.level_timeout
        for d, h in zip(self.tags, self.handles):
            try:
                h.wait(self.wait_level, timeout=max(0.1, end - time.monotonic()))
                self.reached[os.path.basename(d)] = time.perf_counter() - self.saved_at[d]
            except dsckpt.DsckptError as e:
                self.level_errors.append(f"{os.path.basename(d)}: {type(e).__name__}: {e}")

    def extra(self):
        """The sampled progress of each save (when a SaveSampler ran), with the time
        wait_snapshot returned; with wait_level, which tags reached it."""
        out = {}
        if self.wait_level is not None:
            out.update(level=self.wait_level.name, level_tags=len(self.tags),
                       level_reached=dict(self.reached), level_errors=self.level_errors[:5])
        if self.progress is not None:
            out.update(progress=self.progress, progress_errors=self.sampler_errors)
        return out

    def close(self):
        for c in (self.conn, self.commit_conn, self.peer):
            if c is not None and not c.closed:
                c.close()

    def cleanup(self, keep=None):
        if self.sampler is not None:  # finish() did not run: the mode failed
            self.sampler.halt()
            self.sampler = None
        self.close()
        if keep is None:
            shutil.rmtree(self.root, ignore_errors=True)
            return
        for d in self.tags:
            if d != keep:
                shutil.rmtree(d, ignore_errors=True)



def run_mode(mode, cfg, dev, batches, ckpt_iters, make_trainer=None, verbose=True):
    """Trains cfg.iters iterations of a fresh make_trainer(cfg, dev) (default Trainer) with
    mode's checkpoints; returns its numbers, the trainer and the loss of every iteration.
    verbose: log every iteration."""
    trainer = (make_trainer or Trainer)(cfg, dev)
    sync(dev)
    iter_s, blocked, save_s, wait_s, losses = [], [], [], [], {}
    nbytes, waiting = None, False
    t_loop = time.perf_counter()
    for it in range(1, cfg.iters + 1):
        t0 = time.perf_counter()
        loss = trainer.forward_backward(batches[it - 1])
        w0 = time.perf_counter()
        mode.before_step(it)
        if waiting:  # the wait before this step belongs to the previous checkpoint
            w = time.perf_counter() - w0
            blocked[-1] += w
            wait_s.append(w)
            waiting = False
        trainer.opt.step()
        if it in ckpt_iters and not isinstance(mode, NoCkpt):
            if nbytes is None:  # counted once, outside the iteration's time
                c0 = time.perf_counter()
                nbytes = state_bytes(trainer.state())
                t0 += time.perf_counter() - c0
            s0 = time.perf_counter()
            mode.save(it, trainer)
            s = time.perf_counter() - s0
            save_s.append(s)
            blocked.append(s)
            waiting = True
        losses[it] = loss.item()
        sync(dev)
        iter_s.append(time.perf_counter() - t0)
        if verbose:
            log(f"  [{mode.name}] iter {it:3d} loss {losses[it]:.6f} {iter_s[-1] * 1e3:9.1f} ms"
                + ("  checkpoint" if it in ckpt_iters else ""))
    loop_s = time.perf_counter() - t_loop
    f0 = time.perf_counter()
    mode.finish()
    drain_s = time.perf_counter() - f0
    extra = mode.extra()
    steady = iter_s[1:] if len(iter_s) > 1 else iter_s  # the first iteration warms up
    overhead = ckpt_overhead(iter_s, ckpt_iters) if not isinstance(mode, NoCkpt) else None
    res = {
        "mode": mode.name, "iters": cfg.iters, "checkpoint_iters": sorted(ckpt_iters),
        "iter_ms": [x * 1e3 for x in iter_s], "losses": [losses[i] for i in sorted(losses)],
        "iter_ms_median": median(steady) * 1e3, "iter_ms_mean": statistics.mean(steady) * 1e3,
        "loop_s": loop_s, "loop_s_after_first": sum(steady), "drain_s": drain_s,
        "ckpt_bytes": nbytes, "save_call_ms": [x * 1e3 for x in save_s],
        "wait_ms": [x * 1e3 for x in wait_s], "blocked_ms": [x * 1e3 for x in blocked],
        "blocked_ms_median": median(blocked) * 1e3 if blocked else None,
        "blocked_ms_max": max(blocked) * 1e3 if blocked else None,
        "effective_gbps": None,
        "ckpt_overhead_ms": overhead and overhead["ms"],
        "quiet_iter_ms": overhead and overhead["quiet_ms"],
        "ckpt_overhead_pct": overhead and overhead["pct"],
    }
    res.update(extra)
    if blocked and nbytes and median(blocked) > 0:
        res["effective_gbps"] = nbytes / median(blocked) / 1e9
    if verbose:
        log(f"  [{mode.name}] median iteration {res['iter_ms_median']:.1f} ms; blocked per "
            f"checkpoint {', '.join(f'{x:.1f}' for x in res['blocked_ms']) or '-'} ms; "
            f"drain after the loop {drain_s:.2f} s")
    return res, trainer, losses


def ckpt_overhead(iter_s, ckpt_iters):
    """What each checkpoint added to the loop: the time of its iteration and of the next one
    (where wait_snapshot falls) minus two quiet iterations (the median of those touching no
    checkpoint, after the first). As a share of one quiet iteration it is the slowdown a
    checkpoint in every iteration would cost while the flush keeps up."""
    touched = {i for c in ckpt_iters for i in (c, c + 1)}
    quiet = [t for i, t in enumerate(iter_s, 1) if i > 1 and i not in touched]
    if not quiet:
        return None
    q = median(quiet)
    ms = [(iter_s[c - 1] + (iter_s[c] if c < len(iter_s) else q) - 2 * q) * 1e3
          for c in sorted(ckpt_iters) if c <= len(iter_s)]
    return {"ms": ms, "quiet_ms": q * 1e3,
            "pct": 100.0 * median(ms) / (q * 1e3) if ms else None}


def restore_check(cfg, dev, batches, tag, start, ref_losses):
    """Loads tag into a fresh model + optimizer, runs iterations start+1..start+RESUME_ITERS
    on the same batches and compares the losses with the uninterrupted run's."""
    t0 = time.perf_counter()
    state = dt.load(tag, "rank0")  # tensors go back to the devices they were saved from
    load_s = time.perf_counter() - t0
    trainer = Trainer(cfg, dev)
    trainer.model.load_state_dict(state["model"])
    trainer.opt.load_state_dict(state["optim"])
    del state
    free_memory(dev)
    rows, ok = [], True
    for it in range(start + 1, start + RESUME_ITERS + 1):
        got = trainer.forward_backward(batches[it - 1]).item()
        trainer.opt.step()
        want = ref_losses[it]
        rel = abs(got - want) / max(abs(want), 1e-30)
        good = got == want or rel <= 1e-6
        ok = ok and good
        rows.append({"iter": it, "restored": got, "uninterrupted": want, "rel_diff": rel,
                     "exact": got == want})
        log(f"  restore iter {it}: restored loss {got!r}  uninterrupted {want!r}  "
            f"rel diff {rel:.3g}  {'exact' if got == want else 'OK' if good else 'MISMATCH'}")
    del trainer
    free_memory(dev)
    return rows, ok, load_s


def ready(cfg, who):
    """Whether the checkpoint root exists and the daemon answers (else says why)."""
    if not os.path.isdir(cfg.dir):
        log(f"{who}: checkpoint root {cfg.dir} does not exist")
        return False
    try:
        with dsckpt.Connection(cfg.socket):
            pass
    except Exception as e:
        log(f"{who}: cannot reach dsckptd at {cfg.socket}: {e}")
        return False
    return True


def make_batches(cfg, dev):
    """The seeded random token micro-batches of every iteration (accum x batch x seq+1),
    shared by all modes."""
    g = torch.Generator().manual_seed(cfg.seed + 1)
    return [torch.randint(0, cfg.vocab, (cfg.accum, cfg.batch, cfg.seq + 1), generator=g)
            .to(dev) for _ in range(cfg.iters)]


def fmt(v, spec):
    """v formatted, '-' (as wide) for None."""
    width = int(spec.split(".")[0].lstrip("+") or 0)
    return f"{'-':>{width}}" if v is None else format(v, spec)


def pct(v, width):
    """v as a signed percentage right-aligned in width columns, '-' for None."""
    return f"{(fmt(v, f'+{width - 1}.1f') + '%') if v is not None else '-':>{width}}"


# The daemons' counters a tier mode reads before and after itself (dsckptctl --json metrics).
TIER_COUNTERS = ("uploaded_bytes", "uploads_done", "peer_bytes_sent", "peer_copies_sent",
                 "peer_bytes_received", "peer_copies_received")


def daemon_counters(ctl, socket):
    """TIER_COUNTERS of the daemon at socket now (dsckptctl --json metrics); {} without ctl."""
    if not ctl or not socket:
        return {}
    out = subprocess.run([ctl, "-s", socket, "--json", "metrics"], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    m = json.loads(out)
    m = m.get("metrics", m)
    return {k: m[k] for k in TIER_COUNTERS if isinstance(m.get(k), (int, float))}


def counters_delta(before, after):
    """after - before, per counter both have."""
    return {k: after[k] - before[k] for k in after if k in before}


def tier_verdict(r):
    """OK, or FAIL and why, for a tier mode's result: every tag at its level, and bytes moved
    by the daemon (its counters) — a run that uploaded or replicated nothing fails."""
    n, got = r.get("level_tags", 0), len(r.get("level_reached", {}))
    moved = r.get("tier_bytes")
    if not n:
        return "FAIL: no checkpoint"
    if got < n:
        return f"FAIL: {got} of {n} tags {r['level']}" + (
            f" ({r['level_errors'][0]})" if r.get("level_errors") else "")
    if not moved:
        return f"FAIL: the daemon counted no bytes {r.get('tier_what', 'moved')}"
    return "OK"


def tier_table(results, base, local):
    """The tiers' table: each dsckpt mode's iterations, slowdown against the baseline and
    against the local-only dsckpt mode, blocked time and save call per checkpoint, and for a
    tier how many tags reached its level and the bytes its daemon counted."""
    lines = [f"{'variant':<16} {'iter ms med':>11} {'mean':>8} {'vs base':>8} {'vs local':>8} "
             f"{'blocked ms':>10} {'call ms':>8} {'warm':>6} {'commit s':>8} {'tier':<18} "
             f"{'MB':>9}  verdict"]
    for r in results:
        if r.get("skipped") or r.get("error"):
            why = f"SKIP: {r['skipped']}" if r.get("skipped") else f"FAILED: {r['error']}"
            lines.append(f"{r['mode']:<16} {why}")
            continue
        def vs(ref):
            if ref is None or ref is r or not ref.get("loop_s_after_first"):
                return None
            return 100.0 * (r["loop_s_after_first"] / ref["loop_s_after_first"] - 1)
        tier, mb, verdict = "-", None, ""
        if r.get("level"):
            tier = f"{len(r['level_reached'])}/{r['level_tags']} {r['level']}"
            mb = r["tier_bytes"] / 1e6 if r.get("tier_bytes") is not None else None
            verdict = tier_verdict(r)
        lines.append(f"{r['mode']:<16} {fmt(r['iter_ms_median'], '11.1f')} "
                     f"{fmt(r['iter_ms_mean'], '8.1f')} {pct(vs(base), 8)} "
                     f"{pct(vs(local) if r.get('level') else None, 8)} "
                     f"{fmt(r.get('blocked_ms_median'), '10.1f')} "
                     f"{fmt(r.get('save_call_ms_median'), '8.2f')} "
                     f"{fmt(r.get('save_call_warm_median_ms'), '6.2f')} "
                     f"{fmt(median(list(r.get('commit_s', {}).values())), '8.2f')} {tier:<18} "
                     f"{fmt(mb, '9.1f')}  {verdict}")
    return "\n".join(lines)


def table_of(results, base, header, row):
    """A summary table: the header, then per mode its SKIP/FAILED line or row(r, slowdown),
    the slowdown being its loop time after the first iteration against base's, in percent
    (also stored in r)."""
    lines = [header]
    for r in results:
        if r.get("skipped") or r.get("error"):
            why = f"SKIP: {r['skipped']}" if r.get("skipped") else f"FAILED: {r['error']}"
            lines.append(f"{r['mode']:<16} {why}")
            continue
        slow = None
        if base is not None:
            slow = 100.0 * (r["loop_s_after_first"] / base["loop_s_after_first"] - 1)
            r["slowdown_pct"] = slow
        lines.append(row(r, slow))
    return "\n".join(lines)


def table(results, base):
    """The summary table (printed last)."""
    def row(r, slow):
        gb = r["ckpt_bytes"] / 1e9 if r["ckpt_bytes"] else None
        return (f"{r['mode']:<16} {fmt(r['iter_ms_median'], '13.1f')} "
                f"{fmt(r['blocked_ms_median'], '22.2f')} {fmt(gb, '8.3f')} "
                f"{fmt(r['effective_gbps'], '10.1f')} {pct(slow, 9)} "
                f"{pct(r.get('ckpt_overhead_pct'), 9)}")
    return table_of(results, base,
                    f"{'mode':<16} {'iter ms (med)':>13} {'blocked/ckpt ms (med)':>22} "
                    f"{'ckpt GB':>8} {'eff. GB/s':>10} {'slowdown':>9} {'per-ckpt':>9}", row)


# Sizes and schedules. The GPU presets train a 2048 x 32-layer GPT (vocab 32000): 1.74 B
# params, 20.9 GB of weights + AdamW state, a 380 ms snapshot at 55 GB/s.
#   checkpoint-every-16  batch 16 (280 ms iterations): all six modes, two checkpoints;
#   steady               batch 32, so that forward+backward outlasts the snapshot, a
#                        checkpoint every 32 iterations (the 1.3-1.5 GB/s flush of this
#                        machine's /dev/shm needs ~15 s per checkpoint): baseline + dsckpt;
#   every-iteration      a checkpoint after every iteration: 8 layers (0.53 B params, 6.4 GB of
#                        state), 24 micro-batches of 32 x 512 per iteration (393 K tokens, a
#                        global batch of the usual size), so that the flush (1.3-3 GB/s here)
#                        keeps up with 6.4 GB per ~4 s iteration: baseline + dsckpt;
#   smoke                a tiny model on the CPU (torch 1.13 works), all modes.
_GPT = dict(d_model=2048, layers=32, heads=16, vocab=32000, seq=512, accum=1)
PRESETS = {
    "checkpoint-every-16": dict(_GPT, iters=40, every=16, batch=16,
                                modes="baseline,dsckpt,dsckpt-dcp,dcp,torch.save"),
    "steady": dict(_GPT, iters=100, every=32, batch=32, modes="baseline,dsckpt"),
    # The default's 1,556 tensors (its layers and heads' structure) at a fraction of the
    # bytes, so that one run times nine warm save calls instead of one (issue 14).
    "handover": dict(_GPT, d_model=512, heads=8, iters=80, every=8, batch=16, modes="dsckpt"),
    "every-iteration": dict(_GPT, layers=8, iters=12, every=1, batch=32, accum=24,
                            modes="baseline,dsckpt"),
    # The tiers (tests/gpu/run-train-tiers): the every-iteration preset's 8 layers (6.4 GB of
    # state) at 4 micro-batches of 32 (~0.5 s iterations), a checkpoint every 16 iterations,
    # so that each checkpoint's flush, upload or copy overlaps the iterations after it.
    "tiers": dict(_GPT, layers=8, iters=64, every=16, batch=32, accum=4,
                  modes="baseline,dsckpt,dsckpt-remote,dsckpt-peer"),
    "smoke": dict(iters=11, every=4, d_model=64, layers=2, heads=4, vocab=128, seq=16,
                  batch=4, accum=1, modes="baseline,dsckpt,dsckpt-dcp,dcp,torch.save"),
}


TIER_MODES = ("dsckpt-remote", "dsckpt-peer")


def tier_mode(name, cfg):
    """Mode dsckpt-remote (a root with a remote tier) or dsckpt-peer (a 2-rank job, rank 1 on
    the second daemon) and the daemons' counters before it; (None, why) without its daemon."""
    if name == "dsckpt-remote":
        if not cfg.remote_dir:
            return None, "no --remote-dir (a root with a remote tier)"
        before = {"a": daemon_counters(cfg.ctl, cfg.socket)}
        return Dsckpt(cfg.remote_dir, cfg.socket, "bench-train-remote", name=name,
                      wait_level=dsckpt.Level.REMOTE, level_timeout=cfg.level_timeout), before
    if not cfg.peer_socket:
        return None, cfg.peer_skip or "no --peer-socket (a second daemon, peer copies on)"
    run = f"bench-train-peer-{os.getpid()}"
    peer = dsckpt.Connection(cfg.peer_socket, job="bench-train-peer", rank=1, world_size=2,
                             run=run)
    before = {"a": daemon_counters(cfg.ctl, cfg.socket),
              "b": daemon_counters(cfg.ctl, cfg.peer_socket)}
    return Dsckpt(cfg.dir, cfg.socket, "bench-train-peer", world=2, name=name,
                  wait_level=dsckpt.Level.REPLICATED, peer=peer, run=run,
                  level_timeout=cfg.level_timeout), before


def tier_counters(res, name, cfg, before):
    """Adds to a tier mode's result its daemons' counters over the mode and the bytes its tier
    moved (uploaded, or sent to the peer)."""
    res["counters"] = counters_delta(before["a"], daemon_counters(cfg.ctl, cfg.socket))
    if "b" not in before:
        res["tier_what"] = "uploaded"
        res["tier_bytes"] = res["counters"].get("uploaded_bytes")
        return
    res["peer_counters"] = counters_delta(before["b"], daemon_counters(cfg.ctl, cfg.peer_socket))
    res["tier_what"] = "received by the second daemon"
    res["tier_bytes"] = res["peer_counters"].get("peer_bytes_received")


def parse_args(argv):
    """Command line: sizes default to the GPU run, --smoke to a tiny CPU run."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--socket", required=True, help="dsckptd's socket")
    p.add_argument("--dir", required=True, help="checkpoint root (one of the daemon's roots)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="checkpoint-every-16",
                   help="sizes and schedule (each option below overrides its value)")
    p.add_argument("--smoke", action="store_true", help="same as --preset smoke")
    p.add_argument("--iters", type=int)
    p.add_argument("--every", type=int)
    p.add_argument("--d-model", type=int)
    p.add_argument("--layers", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--vocab", type=int)
    p.add_argument("--seq", type=int)
    p.add_argument("--batch", type=int)
    p.add_argument("--accum", type=int, help="micro-batches of --batch per iteration")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--modes", help="comma-separated, run in this order")
    p.add_argument("--budget", type=float, default=420.0,
                   help="seconds; a mode is skipped once less than a quarter is left")
    p.add_argument("--ctl", help="dsckptctl: with it the dsckpt mode samples its saves' progress "
                   "(dsckptctl --json pending, from a thread) into the results")
    p.add_argument("--parts", action="store_true", help="time the steps of each dsckpt.torch.save "
                   "call too (tests/python/bench_handover.py's PARTS) and print them")
    p.add_argument("--remote-dir", help="a checkpoint root of the daemon's with a remote tier: "
                   "mode dsckpt-remote saves there and waits for REMOTE after the loop")
    p.add_argument("--peer-socket", help="a second daemon's socket, on --dir too, peer copies "
                   "on in both: mode dsckpt-peer saves a 2-rank job (rank 1 there, small) and "
                   "waits for REPLICATED after the loop")
    p.add_argument("--peer-skip", help="why there is no second daemon (shown as the SKIP of "
                   "mode dsckpt-peer)")
    p.add_argument("--peer-error", help="why the second daemon could not be had (mode "
                   "dsckpt-peer FAILED)")
    p.add_argument("--tier-what", default="", help="words for the tiers' table title (where "
                   "the remote and the second daemon are)")
    p.add_argument("--level-timeout", type=float, default=120.0,
                   help="seconds, per tier mode, for its saves to reach REMOTE or REPLICATED "
                   "after the loop")
    p.add_argument("--progress-ms", type=float, default=20.0,
                   help="the sampling period of --ctl until SNAPSHOT, ms (0: no sampling; "
                   "250 ms while the saves only flush)")
    a = p.parse_args(argv)
    if a.smoke:
        a.preset = "smoke"
    a.smoke = a.preset == "smoke"
    dflt = PRESETS[a.preset]
    for k, v in dflt.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.iters < 1 or a.every < 1 or a.accum < 1 or a.d_model % a.heads:
        p.error("need --iters, --every, --accum >= 1 and --d-model divisible by --heads")
    return a


def save_parts():
    """The steps of dsckpt.torch.save timed from now on ({label: [seconds]}, one entry per
    call of each step, the restore check's loads excluded), as bench_handover --parts does."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import bench_handover
    return bench_handover.time_parts()


def write_json(info):
    """Writes info to $OUT/train.json when OUT names a directory; also after each mode (with
    "partial": true), so that a crash or a kill in a later mode keeps what was measured."""
    out = os.environ.get("OUT")
    if out and os.path.isdir(out):
        with open(os.path.join(out, "train.json"), "w") as f:
            json.dump(info, f, indent=1)


def main(argv):
    cfg = parse_args(argv)
    t_start = time.monotonic()
    if cfg.smoke:
        dev = torch.device("cpu")
    elif not torch.cuda.is_available():
        log("bench-train: SKIP: torch sees no CUDA device (use --smoke for the CPU)")
        return 0
    else:
        dev = torch.device("cuda", 0)
        torch.cuda.set_device(dev)
    torch.use_deterministic_algorithms(True, warn_only=True)
    det = getattr(torch.utils, "deterministic", None)
    if det is not None and hasattr(det, "fill_uninitialized_memory"):
        det.fill_uninitialized_memory = False  # no NaN fill of every torch.empty
    if not ready(cfg, "bench-train"):
        return 2

    ckpt_iters = set(range(cfg.every, cfg.iters + 1, cfg.every))
    resumable = [c for c in sorted(ckpt_iters) if c + RESUME_ITERS <= cfg.iters]
    params = 12 * cfg.layers * cfg.d_model ** 2 + 13 * cfg.layers * cfg.d_model \
        + (2 * cfg.vocab + cfg.seq + 2) * cfg.d_model
    info = {"torch": torch.__version__, "device": torch.cuda.get_device_name(dev)
            if dev.type == "cuda" else "cpu", "params": params, "config": vars(cfg),
            "checkpoint_iters": sorted(ckpt_iters), "dsckpt_lib": dsckpt._lib.path}
    log(f"bench-train: torch {info['torch']} on {info['device']}; ~{params / 1e9:.3f} B params "
        f"(~{params * 12 / 1e9:.2f} GB weights + AdamW state); d_model {cfg.d_model}, "
        f"{cfg.layers} layers, {cfg.heads} heads, vocab {cfg.vocab}, {cfg.accum} x batch "
        f"{cfg.batch} x seq {cfg.seq}; {cfg.iters} iterations, checkpoints after "
        f"{sorted(ckpt_iters)}")
    batches = make_batches(cfg, dev)
    results, base, restore, failures = [], None, None, 0
    names = [m.strip() for m in cfg.modes.split(",") if m.strip()]
    for name in names:
        left = cfg.budget - (time.monotonic() - t_start)
        if left < cfg.budget / 4:
            log(f"== {name}: SKIP: only {left:.0f} s of the {cfg.budget:.0f} s budget left")
            results.append({"mode": name, "skipped": f"out of time ({left:.0f} s left)"})
            continue
        log(f"== {name}")
        mode = trainer = None
        try:
            if name == "baseline":
                mode = NoCkpt()
            elif name == "torch.save":
                mode = TorchSave(cfg.dir)
            elif name == "dcp":
                try:
                    mode = DcpAsync(cfg.dir)
                except (ImportError, NotImplementedError, AttributeError) as e:
                    log(f"  SKIP: dcp.async_save unavailable: {e}")
                    results.append({"mode": "dcp.async_save", "skipped": str(e)})
                    continue
            elif name == "dcp-async":
                try:
                    mode = DcpStager(cfg.dir, dev.type == "cuda")
                except (ImportError, NotImplementedError, AttributeError, TypeError) as e:
                    log(f"  SKIP: DCP's DefaultStager unavailable: {e}")
                    results.append({"mode": DcpStager.name, "skipped": str(e)})
                    continue
            elif name == "dsckpt-dcp":
                try:
                    mode = DsckptDcp(cfg.dir, cfg.socket, "bench-train-dcp")
                except (ImportError, NotImplementedError, AttributeError) as e:
                    log(f"  SKIP: dsckpt.dcp unavailable: {e}")
                    results.append({"mode": DsckptDcp.name, "skipped": str(e)})
                    continue
            elif name == "dsckpt":
                parts = save_parts() if cfg.parts else None
                sampler = SaveSampler(cfg.ctl, cfg.socket, cfg.progress_ms / 1e3) \
                    if cfg.ctl and cfg.progress_ms > 0 else None
                mode = Dsckpt(cfg.dir, cfg.socket, "bench-train", sampler=sampler)
            elif name == "dsckpt-peer" and cfg.peer_error:
                log(f"  FAILED: {cfg.peer_error}")
                results.append({"mode": name, "error": cfg.peer_error})
                failures += 1
                continue
            elif name in TIER_MODES:
                parts = None
                mode, before = tier_mode(name, cfg)
                if mode is None:
                    log(f"  SKIP: {before}")
                    results.append({"mode": name, "skipped": before})
                    continue
            else:
                raise ValueError(f"unknown mode {name!r}")
            res, trainer, losses = run_mode(mode, cfg, dev, batches, ckpt_iters)
            results.append(res)
            if name == "baseline":
                base = res
            if name == "dsckpt-dcp":
                log(f"  [dsckpt.dcp] seconds from save to COMMITTED: {res['commit_s']}")
            if name in TIER_MODES:
                tier_counters(res, name, cfg, before)
                log(f"  [{name}] {res['level']} by (s after the save): {res['level_reached']}; "
                    f"daemon counters over the mode: {res['counters']}"
                    + (f"; second daemon: {res['peer_counters']}" if 'peer_counters' in res
                       else "") + f"; {tier_verdict(res)}")
                if tier_verdict(res) != "OK":
                    failures += 1
            if isinstance(mode, Dsckpt):
                res["commit_s"] = {os.path.basename(k): v for k, v in mode.committed.items()}
                log(f"  [{name}] seconds from save to COMMITTED: {res['commit_s']}")
                res["save_calls"] = mode.calls
                res["save_call_ms_median"] = median([ms for _, ms in mode.calls])
                log(f"  [{name}] dsckpt.torch.save call (state_dict() excluded): "
                    + ", ".join(f"{how} {ms:.2f} ms" for how, ms in mode.calls))
                warm = [ms for how, ms in mode.calls if how == "warm"]
                if warm:
                    res["save_call_warm_median_ms"] = statistics.median(warm)
                    log(f"  [{name}] warm save call: median {statistics.median(warm):.2f} ms "
                        f"of {len(warm)} (min {min(warm):.2f}, max {max(warm):.2f})")
            if name == "dsckpt":
                if parts is not None:
                    res["save_parts_ms"] = {k: [t * 1e3 for t in v] for k, v in parts.items()}
                    for label, ms in res["save_parts_ms"].items():
                        log(f"    {label:<20} " + ", ".join(f"{t:.3f}" for t in ms) + " ms")
                del trainer
                trainer = None
                free_memory(dev)
                if not resumable:
                    log(f"  restore check: FAILED: no checkpoint with {RESUME_ITERS} "
                        "iterations after it (raise --iters)")
                    restore = {"ok": False, "error": "no resumable checkpoint"}
                else:
                    start = resumable[-1]
                    tag = mode.tag_dir(start)
                    mode.cleanup(keep=tag)
                    log(f"  restore check: {tag} into a fresh model + optimizer, "
                        f"iterations {start + 1}..{start + RESUME_ITERS}")
                    rows, ok, load_s = restore_check(cfg, dev, batches, tag, start, losses)
                    restore = {"ok": ok, "tag": tag, "load_s": load_s, "iters": rows}
                    log(f"  restore check: {'PASS' if ok else 'FAILED'} "
                        f"(load {load_s:.2f} s)")
        except Exception as e:
            traceback.print_exc()
            log(f"  {name}: FAILED: {type(e).__name__}: {e}")
            results.append({"mode": getattr(mode, "name", name), "error": f"{type(e).__name__}"})
            failures += 1
            if name == "dsckpt":
                restore = {"ok": False, "error": str(e)}
        finally:
            del trainer  # its GPU memory goes before the next mode
            if mode is not None:
                try:
                    if isinstance(mode, DcpAsync):
                        mode.finish()
                    mode.cleanup()
                except Exception as e:
                    log(f"  {name}: cleanup failed: {e}")
            mode = None
            free_memory(dev)
            write_json(dict(info, results=results, restore=restore, failures=failures,
                            partial=True, wall_s=time.monotonic() - t_start))
    if restore is None and "dsckpt" in names:  # the mode, not dsckpt-dcp
        restore = {"ok": False, "error": "dsckpt mode did not run"}
    summary = table(results, base)
    info.update(results=results, restore=restore, failures=failures,
                wall_s=time.monotonic() - t_start)
    write_json(info)
    log("")
    log(f"== bench-train summary, preset {cfg.preset} ({info['device']}, "
        f"{params * 12 / 1e9:.1f} GB state, {cfg.accum} x batch {cfg.batch}, checkpoint "
        f"every {cfg.every} of {cfg.iters} iterations; slowdown = loop time after the first iteration vs "
        "baseline; per-ckpt = median time a checkpoint added to its iteration and the next, "
        "as a share of one iteration: the slowdown of a checkpoint every iteration)")
    log(summary)
    if restore is not None:
        log(f"restore check: {'PASS' if restore.get('ok') else 'FAILED'}"
            + (f" ({restore['error']})" if restore.get("error") else ""))
    if any(n in TIER_MODES for n in names):
        local = next((r for r in results if r["mode"] == "dsckpt" and "iter_ms" in r), None)
        log("")
        log(f"== bench-train tiers{' (' + cfg.tier_what + ')' if cfg.tier_what else ''}: "
            f"{params * 12 / 1e9:.1f} GB state, a checkpoint every {cfg.every} of {cfg.iters} "
            "iterations; vs base / vs local = loop time after the first iteration against the "
            "baseline's / the local-only dsckpt mode's; blocked = median per checkpoint (save "
            "call + wait_snapshot); call / warm = median dsckpt.torch.save call (the "
            "hand-over), all / warm (a cached plan); commit s = median seconds from a save call "
            "to COMMITTED; tier = tags "
            f"at REMOTE / REPLICATED within {cfg.level_timeout:.0f} s after the loop; MB = bytes "
            "uploaded by daemon A (uploaded_bytes) / received by daemon B "
            "(peer_bytes_received) during the mode")
        log(tier_table(results, base, local))
    return 1 if failures or (restore is not None and not restore.get("ok")) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
