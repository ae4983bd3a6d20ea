#!/usr/bin/env python3
"""bench_resume.py — time to resume: a trainer SIGKILLed mid-run, a new process started, the
time from its exec to its first finished training step, for each way of restoring (issue 34).

One run (tests/gpu/run-resume starts nothing itself: this script starts, restarts and stops
the daemon it is given, so that it can empty the daemon's cache between methods):

 1. A trainer process (this script, --child train) builds the GPT of bench_train.py with
    AdamW, trains, and after iteration K checkpoints the same state three ways: dsckpt
    (dsckpt.torch.save, committed), torch.save into one file, DCP's FileSystemWriter (where
    torch has it). It runs iteration K+1 and prints its loss (the uninterrupted run's), then
    goes on training until the parent SIGKILLs it.
 2. Each method runs in a fresh process (--child resume --method M), exec'd by the parent at
    time t0; the child notes the wall-clock time after `import torch`, after CUDA is up,
    after the model and optimizer are built, after the restore and after iteration K+1 (its
    loss read back). Methods:
      floor            import torch, CUDA up, the model built on the meta device; no restore;
      dsckpt-built     model built as usual (random init), dsckpt.torch.load +
                       load_state_dict;
      dsckpt-meta      model built under dsckpt.materialize.empty_weights, filled by
                       dsckpt.torch.materialize (no init, no CPU copy);
      torch.load       model built as usual, torch.load + load_state_dict;
      dcp              model built as usual, DCP load through FileSystemReader (get/set_state_dict);
      dcp-meta         the same into a model built under empty_weights and given memory, no
                       init, by dsckpt.materialize.allocate;
    and the dsckpt ones in three states of the node: hot (the daemon keeps the tag in its
    cache, as after the save), warm (the daemon restarted: files in the page cache only),
    cold (the daemon restarted and the files dropped from the page cache with
    posix_fadvise(DONTNEED); no effect on tmpfs, which the table says); plus prefetch: cold,
    with `dsckptctl pull JOB/TAG` started by the "launcher" at t0, beside the new process.
    torch.load and DCP read warm files.
 3. Prints a table last: per method the seconds from exec to the resumed step, split into
    start+import, CUDA init, build, restore, first step; the excess over the floor; whether
    the resumed loss equals the uninterrupted one. Writes resume.json and resume.svg (stacked
    bars, tests/gpu/plot_resume.py) into $OUT, else build/. Exit 1 when a loss differs or a
    method fails.

--preset gpt-8gb (default: d_model 2048, 11 layers, 686M parameters, 8.2 GB with AdamW) or
smoke (a tiny model on the CPU, any torch, for checking the paths end to end).
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

T_START = time.time()  # the child's first moment in Python, before any import below

PRESETS = {
    "gpt-8gb": dict(d_model=2048, layers=11, heads=16, vocab=32000, seq=512, batch=8,
                    every=4, device="cuda"),
    "smoke": dict(d_model=64, layers=2, heads=4, vocab=128, seq=16, batch=4, every=3,
                  device="cpu"),
}
DSCKPT_METHODS = ("dsckpt-built", "dsckpt-meta")
STATES = ("hot", "warm", "cold")


def log(msg):
    """Prints one progress line at once."""
    print(msg, flush=True)


def parse_args(argv):
    """Command line of the parent and of both children."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--socket", required=True, help="dsckptd's socket")
    p.add_argument("--dir", required=True, help="checkpoint root (one of the daemon's roots)")
    p.add_argument("--daemon", help="the daemon's command line (parent: started, restarted "
                   "and stopped here)")
    p.add_argument("--ctl", help="dsckptctl, for the prefetch method")
    p.add_argument("--preset", choices=sorted(PRESETS), default="gpt-8gb")
    p.add_argument("--repeat", type=int, default=1, help="fresh processes per method (median)")
    p.add_argument("--methods", help="comma-separated subset of the rows, e.g. floor,hot:dsckpt-meta")
    p.add_argument("--child", choices=("train", "resume"), help=argparse.SUPPRESS)
    p.add_argument("--method", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------
# The children


def child_setup(a):
    """Imports torch and bench_train's model, brings the device up; the config and marks."""
    import torch
    marks = {"import": time.time()}
    import bench_train as bt  # this directory: the GPT, its Trainer and batches
    cfg = argparse.Namespace(**PRESETS[a.preset], seed=1234, lr=1e-4, accum=1,
                             iters=PRESETS[a.preset]["every"] + 1)
    dev = torch.device(cfg.device if cfg.device == "cpu" or torch.cuda.is_available() else "cpu")
    if dev.type == "cuda":
        torch.cuda.init()
        torch.ones(1, device=dev).add_(1).item()
    marks["cuda"] = time.time()
    return torch, bt, cfg, dev, marks


def tag_of(a):
    """The checkpoint tag's directory and the other methods' paths."""
    job = os.path.join(a.dir, "resume")
    k = PRESETS[a.preset]["every"]
    return (os.path.join(job, f"step{k}"), os.path.join(a.dir, "torchsave", f"step{k}.pt"),
            os.path.join(a.dir, "dcp", f"step{k}"))


def dcp_state(torch, model, opt):
    """DCP's state dicts of model and optimizer (the optimizer's keyed by parameter name),
    or None where this torch lacks torch.distributed.checkpoint.state_dict."""
    try:
        from torch.distributed.checkpoint.state_dict import get_state_dict
    except ImportError:
        return None
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd}


def child_train(a):
    """Trains, checkpoints after iteration K three ways, prints K+1's loss, trains on."""
    torch, bt, cfg, dev, _ = child_setup(a)
    import dsckpt
    import dsckpt.torch as dt
    tag, tfile, dcp_dir = tag_of(a)
    trainer = bt.Trainer(cfg, dev)
    batches = bt.make_batches(cfg, dev)
    k = cfg.every
    for it in range(1, k + 1):
        trainer.forward_backward(batches[it - 1])
        trainer.opt.step()
    state = {"model": trainer.model.state_dict(), "optimizer": trainer.opt.state_dict()}
    with dsckpt.Connection(a.socket, job="resume") as conn:
        h = dt.save(state, tag, conn=conn, file="rank0")
        h.wait_snapshot(timeout=600)
        conn.commit(tag, timeout=600)
    os.makedirs(os.path.dirname(tfile), exist_ok=True)
    torch.save(state, tfile)
    dstate = dcp_state(torch, trainer.model, trainer.opt)
    if dstate is not None:
        import torch.distributed.checkpoint as dcp
        dcp.save(dstate, storage_writer=dcp.FileSystemWriter(dcp_dir))
    loss = trainer.forward_backward(batches[k]).item()
    trainer.opt.step()
    print(json.dumps({"ref_loss": loss, "bytes": bt.state_bytes(state),
                      "params": sum(p.numel() for p in trainer.model.parameters()),
                      "dcp": dstate is not None}), flush=True)
    while True:  # the run goes on until the parent kills it
        trainer.forward_backward(batches[0])
        trainer.opt.step()


def build(bt, cfg, dev, meta):
    """The model and AdamW, initialised as usual or with every parameter on meta."""
    import torch
    if meta:
        from dsckpt.materialize import empty_weights
        with empty_weights():
            model = bt.GPT(cfg.vocab, cfg.seq, cfg.d_model, cfg.layers, cfg.heads, dev)
    else:
        torch.manual_seed(cfg.seed)
        model = bt.GPT(cfg.vocab, cfg.seq, cfg.d_model, cfg.layers, cfg.heads, dev)
    return model, torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.1)


def restore(torch, method, a, model, opt, dev):
    """Restores the checkpoint into model and opt by method; the (model, opt) to train."""
    tag, tfile, dcp_dir = tag_of(a)
    if method == "dsckpt-meta":
        import dsckpt.torch as dt
        m = dt.materialize(model, opt, tag, "rank0", device=dev)
        return m.model, m.optimizer
    if method == "dsckpt-built":
        import dsckpt.torch as dt
        sd = dt.load(tag, "rank0", map_location=dev)
    elif method == "torch.load":
        sd = torch.load(tfile, map_location=dev)
    elif method in ("dcp", "dcp-meta"):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict
        if method == "dcp-meta":
            from dsckpt.materialize import allocate
            allocate(model, dev, optimizer=opt)  # memory for DCP to fill, no init
        sd = dcp_state(torch, model, opt)
        dcp.load(sd, storage_reader=dcp.FileSystemReader(dcp_dir))
        set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        return model, opt
    else:
        raise ValueError(method)
    model.load_state_dict(sd["model"])
    opt.load_state_dict(sd["optimizer"])
    return model, opt


def child_resume(a):
    """A restarted trainer: up, built, restored, one iteration; prints its marks."""
    torch, bt, cfg, dev, marks = child_setup(a)
    if a.method != "floor":
        import dsckpt.torch  # noqa: F401  (the import is part of the restart)
    meta = a.method in ("floor", "dsckpt-meta", "dcp-meta")
    model, opt = build(bt, cfg, dev, meta)
    bt.sync(dev)
    marks["build"] = time.time()
    loss = None
    if a.method != "floor":
        model, opt = restore(torch, a.method, a, model, opt, dev)
        bt.sync(dev)
        marks["restore"] = time.time()
        trainer = bt.Trainer.__new__(bt.Trainer)
        trainer.dev, trainer.cfg, trainer.model, trainer.opt = dev, cfg, model, opt
        batches = bt.make_batches(cfg, dev)
        loss = trainer.forward_backward(batches[cfg.every]).item()
        opt.step()
        bt.sync(dev)
        marks["step"] = time.time()
    print(json.dumps({"start": T_START, "marks": marks, "loss": loss}), flush=True)


# ---------------------------------------------------------------------------------------
# The parent


class Daemon:
    """The dsckptd this run starts, restarts (an empty cache) and stops."""

    def __init__(self, cmd, socket, ctl):
        self.cmd, self.socket, self.ctl, self.proc = cmd, socket, ctl, None

    def start(self):
        """Starts it and waits until it answers (120 s at most)."""
        self.proc = subprocess.Popen(self.cmd, shell=True, start_new_session=True)
        import dsckpt
        for _ in range(600):
            if self.proc.poll() is not None:
                raise RuntimeError(f"dsckptd exited with status {self.proc.returncode}")
            try:
                with dsckpt.Connection(self.socket):
                    return
            except Exception:
                time.sleep(0.2)
        raise RuntimeError("dsckptd did not answer within 120 s")

    def stop(self):
        """SIGTERM, waited for (60 s, then SIGKILL)."""
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self):
        """A daemon with an empty cache."""
        self.stop()
        self.start()


def child_cmd(a, *extra):
    """This script as a child, with the parent's options."""
    return [sys.executable, "-u", os.path.abspath(__file__), "--socket", a.socket, "--dir", a.dir,
            "--preset", a.preset, *extra]


def last_json(text):
    """The last line of text that parses as a JSON object, or None."""
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                pass
    return None


def train_and_kill(a):
    """Runs the trainer until its checkpoint and K+1's loss, then SIGKILLs it; its report."""
    proc = subprocess.Popen(child_cmd(a, "--child", "train"), stdout=subprocess.PIPE, text=True)
    report = None
    for line in proc.stdout:
        report = last_json(line)
        if report is not None:
            break
        sys.stdout.write("  train: " + line)
    time.sleep(0.5)  # mid-iteration, somewhere after K+1
    proc.kill()
    proc.wait()
    if report is None:
        raise RuntimeError(f"the trainer exited with status {proc.returncode} before its checkpoint")
    log(f"trainer SIGKILLed after iteration {PRESETS[a.preset]['every'] + 1}: "
        f"{report['params'] / 1e6:.0f}M parameters, {report['bytes'] / 1e9:.2f} GB state, "
        f"reference loss {report['ref_loss']!r}")
    return report


def drop_page_cache(paths):
    """Evicts every file under paths from the page cache (posix_fadvise DONTNEED)."""
    for top in paths:
        for d, _, files in os.walk(top) if os.path.isdir(top) else [("", [], [top])]:
            for f in files:
                p = os.path.join(d, f)
                try:
                    fd = os.open(p, os.O_RDONLY)
                except OSError:
                    continue
                try:
                    os.fdatasync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


def read_through(paths):
    """Reads every file under paths once (into the page cache)."""
    for top in paths:
        for d, _, files in os.walk(top) if os.path.isdir(top) else [("", [], [top])]:
            for f in files:
                with open(os.path.join(d, f), "rb") as fh:
                    while fh.read(1 << 24):
                        pass


def run_child(a, method, prefetch=None):
    """One fresh process restoring by method (with `dsckptctl pull` started beside it when
    prefetch names the tag); its times relative to exec, or an error string."""
    t0 = time.time()
    pull = None
    if prefetch is not None:
        pull = subprocess.Popen([a.ctl, "-s", a.socket, "pull", prefetch],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # DSCKPT_SOCKET: the trainer finds this run's daemon as a user's finds theirs (without
    # it, dsckpt.torch asks the system socket, finds none and reads the files itself).
    r = subprocess.run(child_cmd(a, "--child", "resume", "--method", method),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600,
                       env=dict(os.environ, DSCKPT_SOCKET=a.socket))
    if pull is not None:
        _, err = pull.communicate(timeout=600)
        if pull.returncode != 0:
            return f"dsckptctl pull: {err.strip()}"
    rep = last_json(r.stdout)
    if r.returncode != 0 or rep is None:
        return f"exit {r.returncode}: {(r.stderr or r.stdout).strip().splitlines()[-1:]}"
    m = rep["marks"]
    out = {"start": rep["start"] - t0, "import": m["import"] - t0, "cuda": m["cuda"] - t0,
           "build": m["build"] - t0, "loss": rep["loss"]}
    if "restore" in m:
        out.update(restore=m["restore"] - t0, step=m["step"] - t0)
    out["total"] = out.get("step", out["build"])
    return out


def rows_wanted(a, has_dcp, can_prefetch):
    """The rows of this run, in order: (label, state, method)."""
    rows = [("floor", "hot", "floor")]
    rows += [(f"{m} hot", "hot", m) for m in DSCKPT_METHODS]
    rows += [("torch.load", "hot", "torch.load")]
    if has_dcp:
        rows += [("dcp", "hot", "dcp"), ("dcp-meta", "hot", "dcp-meta")]
    rows += [(f"{m} {s}", s, m) for s in ("warm", "cold") for m in DSCKPT_METHODS]
    if can_prefetch:
        rows += [(f"{m} cold+prefetch", "prefetch", m) for m in DSCKPT_METHODS]
    if a.methods:
        keep = set(a.methods.split(","))
        rows = [r for r in rows if r[0] in keep or r[2] in keep]
    return rows


def measure(a, daemon, rows, paths, tag):
    """Runs every row a.repeat times; {label: [results or error strings]}."""
    results = {}
    for label, state, method in rows:
        results[label] = []
        for _ in range(a.repeat):
            if state in ("warm", "cold", "prefetch"):
                daemon.restart()
                (drop_page_cache if state != "warm" else read_through)(paths)
            r = run_child(a, method, prefetch=tag if state == "prefetch" else None)
            results[label].append(r)
            log(f"  {label}: " + (r if isinstance(r, str) else
                                  f"{r['total']:.2f} s to the resumed step"))
    return results


def median_of(runs, key):
    """The median of key over the runs that succeeded, or None."""
    vals = sorted(r[key] for r in runs if isinstance(r, dict) and key in r)
    return vals[len(vals) // 2] if vals else None


def table(results, ref_loss, on_tmpfs):
    """The summary table; whether every row succeeded with the uninterrupted loss."""
    ok = True
    floor = median_of(results.get("floor", []), "total")
    hdr = (f"{'method':<28}{'exec→step s':>12}{'import':>8}{'cuda':>7}{'build':>7}"
           f"{'restore':>8}{'step':>7}{'over floor':>11}  loss")
    lines = [hdr, "-" * len(hdr)]
    for label, runs in results.items():
        bad = [r for r in runs if isinstance(r, str)]
        if bad:
            ok = False
            lines.append(f"{label:<28}FAILED: {bad[0]}")
            continue
        med = {k: median_of(runs, k) for k in ("import", "cuda", "build", "restore", "step",
                                               "total")}
        parts = [med["import"], med["cuda"] - med["import"], med["build"] - med["cuda"]]
        parts += ([med["restore"] - med["build"], med["step"] - med["restore"]]
                  if med["restore"] is not None else [None, None])
        equal = "-"
        if label != "floor":
            good = all(r["loss"] == ref_loss or abs(r["loss"] - ref_loss) <= 1e-6 * abs(ref_loss)
                       for r in runs)
            equal = "equal" if good else "DIFFERS"
            ok = ok and good
        over = "-" if floor is None or label == "floor" else f"{med['total'] - floor:+.2f}"
        lines.append(f"{label:<28}{med['total']:>12.2f}"
                     + "".join(f"{p:>{w}.2f}" if p is not None else f"{'-':>{w}}"
                               for p, w in zip(parts, (8, 7, 7, 8, 7)))
                     + f"{over:>11}  {equal}")
    if on_tmpfs:
        lines.append("cold: the root is on tmpfs, where dropping the page cache does nothing "
                     "(cold = warm)")
    return "\n".join(lines), ok


def write_results(a, doc):
    """resume.json and its plot resume.svg (plot_resume.py) into $OUT, else the repository's
    build/."""
    import plot_resume
    out = os.environ.get("OUT")
    if not (out and os.path.isdir(out)):
        out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build")
        os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "resume.json"), "w") as f:
        json.dump(doc, f, indent=1)
    with open(os.path.join(out, "resume.svg"), "w") as f:
        f.write(plot_resume.svg(doc))
    log(f"results: {os.path.normpath(os.path.join(out, 'resume.json'))} and resume.svg")


def parent(a):
    """The whole run (see the module's documentation); the exit status."""
    if not a.daemon:
        log("bench_resume: --daemon is needed (tests/gpu/run-resume gives it)")
        return 2
    daemon = Daemon(a.daemon, a.socket, a.ctl)
    daemon.start()
    try:
        ref = train_and_kill(a)
        tag, tfile, dcp_dir = tag_of(a)
        paths = [tag, tfile] + ([dcp_dir] if ref["dcp"] else [])
        job_tag = f"{os.path.join(a.dir, 'resume')}/{os.path.basename(tag)}"
        rows = rows_wanted(a, ref["dcp"], bool(a.ctl))
        results = measure(a, daemon, rows, paths, job_tag)
    finally:
        daemon.stop()
    on_tmpfs = subprocess.run(["stat", "-f", "-c", "%T", a.dir], capture_output=True,
                              text=True).stdout.strip() == "tmpfs"
    summary, ok = table(results, ref["ref_loss"], on_tmpfs)
    write_results(a, {"preset": a.preset, "trainer": ref, "results": results,
                      "tmpfs": on_tmpfs})
    log("")
    log(f"== bench-resume, preset {a.preset}: {ref['params'] / 1e6:.3g}M parameters + AdamW, "
        f"{ref['bytes'] / 1e9:.3g} GB; seconds from exec, medians of {a.repeat}; "
        f"loss = iteration {PRESETS[a.preset]['every'] + 1} against the uninterrupted run's")
    log(summary)
    return 0 if ok else 1


def main(argv):
    a = parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if a.child == "train":
        return child_train(a)
    if a.child == "resume":
        return child_resume(a)
    return parent(a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
