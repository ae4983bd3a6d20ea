#!/usr/bin/env python3
"""bench_ds_load.py — DeepSpeed's engine.load_checkpoint through dsckpt beside DeepSpeed's own
loader, ZeRO stages 1 and 3, in one run (issue 34, item 5).

For each ZeRO stage the GPT of bench_train.py (AdamW, WarmupLR, bf16 by default) is trained in
one process (world size 1; NCCL, or gloo with --cpu) for K iterations, saved at iteration K
twice, once by DeepSpeed's TorchCheckpointEngine (torch.save) and once through dsckpt
(dsckpt.deepspeed.install, committed), and trained N more: those N losses are the reference.
Then each way of resuming runs R times in the same process, each time a fresh engine:

  deepspeed        model built and initialised (other seed), deepspeed.initialize,
                   load_checkpoint of DeepSpeed's files (torch.load);
  dsckpt           the same, the engine's checkpoint engine ours (install), load_checkpoint
                   of the dsckpt tag following `latest` (the daemon's cache holds it: hot);
  deepspeed-meta   model built under dsckpt.materialize.empty_weights (no init),
                   dsckpt.deepspeed.resume.resume: allocate, initialize, load_checkpoint of
                   DeepSpeed's files;
  dsckpt-meta      the same with ours selected by the config's "dsckpt" block (enable()).

and N iterations follow, whose losses must equal the reference exactly. First, what the meta
path refuses: deepspeed.initialize of a meta model, a resume with nothing saved, an optimizer
made over the meta parameters. Prints a PASS/FAIL
line per stage and way, then a table last: per stage and way, the medians of the model build,
deepspeed.initialize, load_checkpoint, their sum, the state's bytes over load_checkpoint's
time, and whether the losses are equal. Exit status 1 on any failure. Without --cpu it needs a
GPU and says so. Run by tests/gpu/run-ds (make bench-ds-load).
"""
import argparse
import os
import shutil
import socket
import sys
import time
import traceback

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
WAYS = ("deepspeed", "dsckpt", "deepspeed-meta", "dsckpt-meta")


def log(msg):
    """Prints one progress line at once."""
    print(msg, flush=True)


def parse_args(argv):
    """The command line; --cpu (or --smoke) sizes a small model."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--socket", required=True, help="dsckptd's socket")
    p.add_argument("--dir", required=True, help="checkpoint root (one of the daemon's roots)")
    p.add_argument("--cpu", action="store_true", help="CPU accelerator and gloo, small model")
    p.add_argument("--smoke", action="store_true", help="same as --cpu")
    p.add_argument("--stages", default="1,3", help="ZeRO stages, comma separated")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--before", type=int, default=3, help="iterations before the save (K)")
    p.add_argument("--after", type=int, default=2, help="iterations compared after it (N)")
    p.add_argument("--repeat", type=int, default=2, help="loads per way (R)")
    p.add_argument("--d-model", type=int)
    p.add_argument("--layers", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--vocab", type=int)
    p.add_argument("--seq", type=int)
    p.add_argument("--batch", type=int)
    p.add_argument("--timeout", type=float, default=300.0, help="dsckpt waits, seconds")
    a = p.parse_args(argv)
    a.cpu = a.cpu or a.smoke
    small = dict(d_model=64, layers=2, heads=4, vocab=256, seq=32, batch=4)
    large = dict(d_model=1536, layers=8, heads=16, vocab=32000, seq=512, batch=8)
    for k, v in (small if a.cpu else large).items():
        setattr(a, k, getattr(a, k) or v)
    a.stages = [int(s) for s in a.stages.split(",") if s]
    if any(s not in (1, 2, 3) for s in a.stages) or a.before < 1 or a.after < 1 or a.repeat < 1:
        p.error("stages are 1..3, --before, --after and --repeat ≥ 1")
    return a


def free_port():
    """A TCP port nobody listens on now (for torch.distributed's store)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Bench:
    """One run: the model, batches and DeepSpeed configuration of every stage."""

    def __init__(self, a):
        import torch
        self.a, self.torch = a, torch
        self.dev = torch.device("cpu") if a.cpu else torch.device("cuda", 0)
        self.batches = [torch.randint(0, a.vocab, (a.batch, a.seq + 1),
                                      generator=torch.Generator().manual_seed(4321 + i))
                        .to(self.dev) for i in range(a.before + a.after)]

    def config(self, stage, ours):
        """DeepSpeed's configuration; its dsckpt block selects ours when enabled."""
        a = self.a
        cfg = {"train_batch_size": a.batch, "train_micro_batch_size_per_gpu": a.batch,
               "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
               "steps_per_print": 1 << 30, "zero_optimization": {"stage": stage},
               "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01,
                                                         "torch_adam": True}},
               "scheduler": {"type": "WarmupLR",
                             "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-3,
                                        "warmup_num_steps": 100}},
               "dsckpt": {"socket": a.socket, "job": f"zero{stage}", "timeout": a.timeout,
                          "enabled": ours}}
        if a.dtype == "bf16":
            cfg["bf16"] = {"enabled": True}
        if stage == 3:
            cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 0
        return cfg

    def model(self, seed, meta):
        """The GPT, initialised from seed, or with every parameter on meta."""
        import bench_train as bt
        from dsckpt.materialize import empty_weights
        a = self.a
        if meta:
            with empty_weights():
                return bt.GPT(a.vocab, a.seq, a.d_model, a.layers, a.heads, self.dev)
        self.torch.manual_seed(seed)
        return bt.GPT(a.vocab, a.seq, a.d_model, a.layers, a.heads, self.dev)

    def train(self, engine, batches):
        """One engine iteration per batch; the losses as Python floats."""
        import torch.nn.functional as F
        losses = []
        for t in batches:
            x, y = t[:, :-1], t[:, 1:]
            logits = engine(x)
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        return losses

    def sync(self):
        """Waits for the GPU's queued work."""
        if self.dev.type == "cuda":
            self.torch.cuda.synchronize()

    def free(self, engine):
        """Destroys an engine (ours closed too) and lets its memory go."""
        import dsckpt.deepspeed as dd
        ce = engine.checkpoint_engine
        engine.destroy()
        if isinstance(ce, dd.DsckptCheckpointEngine):
            ce.close()
        if self.dev.type == "cuda":
            self.torch.cuda.empty_cache()


def saved_bytes(tag_dir):
    """Bytes of the files DeepSpeed's loader reads in a tag (ours: the safetensors files)."""
    names = [n for n in os.listdir(tag_dir) if n.endswith((".pt", ".safetensors"))]
    return sum(os.path.getsize(os.path.join(tag_dir, n)) for n in names
               if not os.path.islink(os.path.join(tag_dir, n)))


def save_both(b, stage, root):
    """Trains K, saves with DeepSpeed's engine and through dsckpt, trains N; the reference
    losses (problems if the two runs' N losses differ) and the two save directories."""
    import deepspeed
    import dsckpt.deepspeed as dd
    a, k = b.a, b.a.before
    dirs = {w: os.path.join(root, w, f"zero{stage}") for w in ("deepspeed", "dsckpt")}
    ref = None
    for way, d in dirs.items():
        engine, _, _, _ = deepspeed.initialize(model=b.model(1, False),
                                               config=b.config(stage, False))
        if way == "dsckpt":
            ce = dd.install(engine, {"socket": a.socket, "job": f"zero{stage}",
                                     "timeout": a.timeout})
        b.train(engine, b.batches[:k])
        engine.save_checkpoint(d, tag=f"step{k}")
        losses = b.train(engine, b.batches[k:])
        if way == "dsckpt":
            ce.wait_committed()
        b.free(engine)
        if ref is not None and losses != ref:
            raise AssertionError(f"saving through dsckpt changed the losses: {losses} != {ref}")
        ref = losses
    return ref, dirs


class LoadTimer:
    """Adds up the time spent in DeepSpeedEngine.load_checkpoint while installed."""

    def __init__(self, b):
        from deepspeed.runtime.engine import DeepSpeedEngine
        self.b, self.cls, self.inner, self.seconds = b, DeepSpeedEngine, None, 0.0
        self.inner = DeepSpeedEngine.load_checkpoint
        timer = self

        def load_checkpoint(engine, *args, **kwargs):
            """DeepSpeed's, timed to the end of the device's work."""
            t = time.perf_counter()
            try:
                return timer.inner(engine, *args, **kwargs)
            finally:
                timer.b.sync()
                timer.seconds += time.perf_counter() - t

        DeepSpeedEngine.load_checkpoint = load_checkpoint

    def close(self):
        """Puts DeepSpeed's method back."""
        self.cls.load_checkpoint = self.inner


def resume_once(b, stage, way, d):
    """One fresh engine resumed by way from d: (times, losses after it)."""
    import deepspeed
    import dsckpt.deepspeed as dd
    from dsckpt.deepspeed.resume import resume
    a, meta, ours = b.a, way.endswith("-meta"), way.startswith("dsckpt")
    timer = LoadTimer(b)
    try:
        t0 = time.perf_counter()
        model = b.model(2, meta)
        b.sync()
        t1 = time.perf_counter()
        if meta:  # model_parameters named on meta: resume maps them to the allocated ones
            engine = resume(model, d, config=b.config(stage, ours),
                            model_parameters=[{"params": list(model.parameters())}]).engine
        else:
            engine, _, _, _ = deepspeed.initialize(model=model, config=b.config(stage, False))
            if ours:
                dd.install(engine, {"socket": a.socket, "job": f"zero{stage}",
                                    "timeout": a.timeout})
            path, _ = engine.load_checkpoint(d)
            if path is None:
                raise AssertionError(f"load_checkpoint({d}) loaded nothing")
        b.sync()
        t2 = time.perf_counter()
    finally:
        timer.close()
    if ours != isinstance(engine.checkpoint_engine, dd.DsckptCheckpointEngine):
        raise AssertionError(f"{way}: the engine's checkpoint engine is "
                             f"{type(engine.checkpoint_engine).__name__}")
    losses = b.train(engine, b.batches[a.before:])
    b.free(engine)
    times = {"build": t1 - t0, "load": timer.seconds, "init": t2 - t1 - timer.seconds,
             "total": t2 - t0}
    return times, losses


def check_refusals(b, root):
    """What the meta path must refuse, each a PASS/FAIL line: deepspeed.initialize itself
    (module.to(device) of meta tensors), a resume with nothing to load (the parameters are
    uninitialised memory), an optimizer object made over the meta parameters; all passed."""
    import deepspeed
    from dsckpt.deepspeed.resume import resume
    empty = os.path.join(root, "empty")
    os.makedirs(empty, exist_ok=True)
    meta = b.model(2, True)
    opt = b.torch.optim.AdamW(meta.parameters(), lr=1e-3)
    cfg = b.config(1, False)
    cases = (("initialize(meta model)", NotImplementedError,
              lambda: deepspeed.initialize(model=b.model(2, True), config=cfg)),
             ("resume(nothing saved)", FileNotFoundError,
              lambda: resume(b.model(2, True), empty, config=cfg)),
             ("resume(optimizer over meta)", ValueError,
              lambda: resume(meta, empty, optimizer=opt, config=cfg)))
    ok = True
    for name, want, call in cases:
        try:
            call()
            got = "no error"
        except Exception as e:  # which one is the finding
            got = e
        good = isinstance(got, want)
        ok = ok and good
        log(f"{'PASS' if good else 'FAIL'} refused: {name}: "
            + (f"{type(got).__name__}: {str(got).splitlines()[0][:120]}" if good
               else f"wanted {want.__name__}, got {got!r}"))
    return ok


def median(xs):
    """The median of a non-empty list."""
    return sorted(xs)[len(xs) // 2]


def run_stage(b, stage, root):
    """Every way of stage: rows of the table, and whether all passed."""
    log(f"== ZeRO-{stage}: train {b.a.before}, save twice, train {b.a.after}")
    ref, dirs = save_both(b, stage, root)
    nbytes = {w: saved_bytes(os.path.join(d, f"step{b.a.before}")) for w, d in dirs.items()}
    rows, ok = [], True
    for way in WAYS:
        src = "dsckpt" if way.startswith("dsckpt") else "deepspeed"
        d = dirs[src]
        runs, problem = [], None
        for _ in range(b.a.repeat):
            try:
                times, losses = resume_once(b, stage, way, d)
            except Exception as e:  # any failure is the finding
                traceback.print_exc()
                problem = f"{type(e).__name__}: {e}"
                break
            if losses != ref:
                problem = f"losses {losses} != uninterrupted {ref}"
            runs.append(times)
        ok = ok and problem is None
        log(f"{'PASS' if problem is None else 'FAIL'} zero{stage} {way}"
            + (f": {problem}" if problem else ""))
        med = {k: median([r[k] for r in runs]) for k in runs[0]} if runs else None
        rows.append((stage, way, med, nbytes[src],
                     problem))
    shutil.rmtree(os.path.join(root, "deepspeed"), ignore_errors=True)
    return rows, ok


def table(rows):
    """The summary table."""
    hdr = (f"{'stage':<7}{'way':<16}{'build s':>9}{'init s':>9}{'load s':>9}{'total s':>9}"
           f"{'GB/s':>7}  losses")
    out = [hdr, "-" * len(hdr)]
    for stage, way, med, nbytes, problem in rows:
        if med is None:
            out.append(f"zero{stage:<3}{way:<16}FAILED: {problem}")
            continue
        rate = nbytes / med["load"] / 1e9 if med["load"] > 0 else float("nan")
        out.append(f"zero{stage:<3}{way:<16}{med['build']:>9.3f}{med['init']:>9.3f}"
                   f"{med['load']:>9.3f}{med['total']:>9.3f}{rate:>7.2f}  "
                   + ("equal" if problem is None else "DIFFER"))
    return "\n".join(out)


def main(argv):
    a = parse_args(argv)
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                       "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
    if a.cpu:
        os.environ["DS_ACCELERATOR"] = "cpu"
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch
    if not a.cpu and not torch.cuda.is_available():
        log("bench_ds_load: no CUDA device here; run it on the GPU node (make bench-ds-load) "
            "or with --cpu")
        return 2
    import deepspeed
    import dsckpt.deepspeed as dd
    dd.enable()  # the -meta ways select ours by the config's block
    b = Bench(a)
    rows, ok = [], check_refusals(b, a.dir)
    for stage in a.stages:
        r, good = run_stage(b, stage, a.dir)
        rows += r
        ok = ok and good
    log("")
    log(f"== bench-ds-load: DeepSpeed {deepspeed.__version__}, {a.dtype}, d_model {a.d_model},"
        f" {a.layers} layers; seconds, medians of {a.repeat}; GB/s = the tag's files over "
        "load_checkpoint; losses: the next iterations against the uninterrupted run's")
    log(table(rows))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
