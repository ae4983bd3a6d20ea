#!/usr/bin/env python3
"""ds_train.py — real DeepSpeed training (ZeRO stage 1 and 3) checkpointed through dsckpt.

For each ZeRO stage a small GPT-style decoder (hand-written causal attention + GELU MLP, bf16
by default, AdamW given to deepspeed.initialize, WarmupLR, gradient clipping) is trained in a
single process (world size 1, NCCL; gloo with --cpu) three times on the same batches:

  reference  K+N iterations, no checkpoint: the uninterrupted losses;
  torch      K iterations, engine.save_checkpoint(dir, tag) with DeepSpeed's default
             TorchCheckpointEngine (torch.save), N more; then a fresh engine (other seed)
             load_checkpoint(dir, tag) and the same N iterations: DeepSpeed's own control;
  dsckpt     the same with dsckpt.deepspeed.install(engine, config): each file handed to the
             daemon by reference, the SNAPSHOT wait inside the next engine.step(), the commit
             (MANIFEST.json, `latest`) in the engine's background thread. Before the reload:
             every file of the tag is a safetensors file safetensors.safe_open reads, DeepSpeed's
             names are symlinks to them, MANIFEST.json lists them, and `latest` names the tag.
             The fresh engine loads with load_checkpoint(dir) (following `latest`);
  auto       dsckpt by configuration alone: `import dsckpt.deepspeed.auto` at start-up (when
             this engine is asked for) and a "dsckpt" block enabled in the DeepSpeed config, the
             training code as torch's (no install()); deepspeed.initialize must have picked
             DsckptCheckpointEngine, then the same checks as dsckpt. The other runs' configs
             carry the block with "enabled": false, so the import leaves them to DeepSpeed.

--fixed-tag saves as DeepSpeed users with a fixed tag do: save_checkpoint(dir, tag="last")
after K-1 iterations, one more iteration (whose step queues that version's commit), then
save_checkpoint(dir, tag="last") again after K, while the first version is still being
flushed or committed (the table's "1st pending" says whether it was): the second save must
not fail, `last` must end as the second version, whole, and the reload must resume from
iteration K. The torch engine overwrites the tag in place, as DeepSpeed does.

A run passes when the N losses after each reload equal the reference's exactly (deterministic
settings), and the saving runs' own N losses do too (saving changed nothing). Then the fp32
weights `python -m dsckpt zero-to-fp32` consolidates from each dsckpt run's tag must equal, bit
for bit, what DeepSpeed's own zero_to_fp32 makes of the torch run's tag (saved at the same step
of the same deterministic run), and so must what the zero_to_fp32.py DeepSpeed copied beside
each dsckpt run's tags (ours) writes, run as DeepSpeed's script is (SAVE_DIR OUTPUT_DIR -t
TAG): a row "<engine>-fp32" per dsckpt engine. Prints a PASS or
FAIL line per stage and engine, then a table with the time save_checkpoint blocked, the wait in
the next step, and the time until the checkpoint was committed (MANIFEST.json written). Exit
status 1 on any failure, 2 on bad usage. --cpu (or --smoke) runs on the CPU (DS_ACCELERATOR=cpu,
gloo), with a smaller model.
"""
import argparse
import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import traceback

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS


def log(msg):
    """Prints one progress line at once."""
    print(msg, flush=True)


def parse_args():
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--socket", required=True, help="dsckptd's socket")
    p.add_argument("--dir", required=True, help="checkpoint root (one of the daemon's roots)")
    p.add_argument("--cpu", action="store_true", help="CPU accelerator and gloo, small model")
    p.add_argument("--smoke", action="store_true", help="same as --cpu")
    p.add_argument("--stages", default="1,3", help="ZeRO stages, comma separated")
    p.add_argument("--engines", default="torch,dsckpt,auto",
                   help="checkpoint engines compared: torch, dsckpt, auto")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--before", type=int, default=6, help="iterations before the save (K)")
    p.add_argument("--after", type=int, default=4, help="iterations compared after it (N)")
    p.add_argument("--d-model", type=int)
    p.add_argument("--layers", type=int)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--seq", type=int)
    p.add_argument("--batch", type=int)
    p.add_argument("--timeout", type=float, default=300.0, help="dsckpt waits, seconds")
    p.add_argument("--fixed-tag", action="store_true",
                   help='save tag "last" twice, the second before the first is committed')
    a = p.parse_args()
    a.cpu = a.cpu or a.smoke
    a.d_model = a.d_model or (128 if a.cpu else 512)
    a.layers = a.layers or (2 if a.cpu else 4)
    a.seq = a.seq or (32 if a.cpu else 256)
    a.batch = a.batch or (4 if a.cpu else 16)
    if a.cpu:
        a.heads = min(a.heads, 4)
        a.vocab = min(a.vocab, 512)
    a.stages = [int(s) for s in a.stages.split(",") if s]
    a.engines = [e for e in a.engines.split(",") if e]
    if any(s not in (0, 1, 2, 3) for s in a.stages) or \
            any(e not in ("torch", "dsckpt", "auto") for e in a.engines) or \
            a.before < 1 + a.fixed_tag or a.after < 1:
        p.error("stages are 0..3, engines torch, dsckpt and auto, --before ≥ 1 (2 with "
                "--fixed-tag) and --after ≥ 1")
    return a


def free_port():
    """A TCP port nobody listens on now (for torch.distributed's store)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ARGS = parse_args()
os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                   "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
if ARGS.cpu:
    os.environ["DS_ACCELERATOR"] = "cpu"

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import deepspeed  # noqa: E402
import dsckpt.deepspeed  # noqa: E402

if "auto" in ARGS.engines:
    import dsckpt.deepspeed.auto  # noqa: E402,F401  (the one line a training script adds)

try:
    from safetensors import safe_open
except ImportError:
    safe_open = None

DEVICE = torch.device("cpu") if ARGS.cpu else torch.device("cuda", 0)


class Block(nn.Module):
    """One pre-norm decoder block: causal multi-head attention, then a 4x GELU MLP."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads) \
            .permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
        mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    """Token + position embeddings, decoder blocks, final norm, untied output head."""

    def __init__(self, vocab, d, layers, heads, seq):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def make_batches(n):
    """n (input, target) batches of random tokens, the same on every call."""
    g = torch.Generator().manual_seed(4321)
    out = []
    for _ in range(n):
        t = torch.randint(0, ARGS.vocab, (ARGS.batch, ARGS.seq + 1), generator=g)
        out.append((t[:, :-1].to(DEVICE), t[:, 1:].to(DEVICE)))
    return out


def ds_config(stage, kind):
    """The DeepSpeed configuration of one run of engine kind; its dsckpt block is enabled for
    auto only (install() of the dsckpt runs is given the block itself)."""
    cfg = {
        "train_batch_size": ARGS.batch,
        "train_micro_batch_size_per_gpu": ARGS.batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "steps_per_print": 1 << 30,
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {"stage": stage},
        "scheduler": {"type": "WarmupLR",
                      "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-3,
                                 "warmup_num_steps": 100}},
        # ZeRO's optimizer files hold DeepSpeed's own objects (loss scaler, ZeroStageEnum,
        # fragment addresses): allowed classes, so the default weights_only loads them.
        "dsckpt": {"socket": ARGS.socket, "job": f"zero{stage}", "timeout": ARGS.timeout,
                   "enabled": kind == "auto"},
    }
    if ARGS.dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    if stage == 3:  # partition every parameter, however small
        cfg["zero_optimization"].update({"stage3_param_persistence_threshold": 0,
                                         "stage3_max_live_parameters": 1 << 20})
    return cfg


def build(stage, seed, kind="torch"):
    """A DeepSpeed engine over a fresh model whose weights come from seed, configured for
    engine kind."""
    torch.manual_seed(seed)
    model = GPT(ARGS.vocab, ARGS.d_model, ARGS.layers, ARGS.heads, ARGS.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt,
                                           config=ds_config(stage, kind))
    return engine


def ours(engine, stage, kind, row):
    """The dsckpt checkpoint engine of a run of kind: installed (dsckpt), the one the config
    selected (auto), None for torch; a problem in row when the config's block did not decide
    (auto without ours, torch with it: "enabled": false must leave DeepSpeed's)."""
    if kind == "dsckpt":
        return dsckpt.deepspeed.install(engine, {"socket": ARGS.socket, "job": f"zero{stage}",
                                                 "timeout": ARGS.timeout})
    ce = engine.checkpoint_engine
    is_ours = isinstance(ce, dsckpt.deepspeed.DsckptCheckpointEngine)
    if is_ours != (kind == "auto"):
        row["problems"].append(f"the config's dsckpt block (enabled: {kind == 'auto'}) got "
                               f"{type(ce).__name__}")
    return ce if kind == "auto" and is_ours else None


def train(engine, batches):
    """One engine iteration per batch; the losses as Python floats."""
    losses = []
    for x, y in batches:
        logits = engine(x)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def sync():
    """Waits for the GPU's queued work (nothing on the CPU)."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def free(engine):
    """Destroys an engine and lets its memory go."""
    engine.destroy()
    del engine
    if DEVICE.type == "cuda":
        torch.cuda.empty_cache()


class Timed:
    """Wraps a checkpoint engine's commit() to add up the time DeepSpeed spends in it."""

    def __init__(self, ce):
        self.ce, self.inner, self.seconds = ce, ce.commit, 0.0
        ce.commit = self

    def __call__(self, info):
        t = time.perf_counter()
        try:
            return self.inner(info)
        finally:
            self.seconds += time.perf_counter() - t


def check_files(save_dir, tag):
    """Problems with a committed dsckpt tag: safetensors, links, manifest, latest."""
    problems = []
    tag_dir = os.path.join(save_dir, tag)
    try:
        with open(os.path.join(save_dir, "latest")) as f:
            latest = f.read()
        if latest.strip() != tag:
            problems.append(f"latest names {latest!r}, not {tag!r}")
    except OSError as e:
        problems.append(f"no latest: {e}")
    files = sorted(glob.glob(os.path.join(tag_dir, "*.safetensors")))
    if not files:
        problems.append(f"no safetensors file in {tag_dir}")
    tensors = empty = 0
    for path in files:
        if safe_open is None:
            problems.append("safetensors is not installed: files not checked")
            break
        try:
            with safe_open(path, framework="pt") as f:
                for name in f.keys():
                    empty += f.get_tensor(name).numel() == 0
                    tensors += 1
        except Exception as e:  # any failure to read is the finding
            problems.append(f"safe_open {os.path.basename(path)}: {e!r}")
    for pt in glob.glob(os.path.join(tag_dir, "*.pt")):
        if not os.path.islink(pt) or os.readlink(pt) != os.path.basename(pt) + ".safetensors":
            problems.append(f"{os.path.basename(pt)} is not a link to our file")
    try:
        with open(os.path.join(tag_dir, "MANIFEST.json")) as f:
            listed = {e["name"] for e in json.load(f)["files"]}
        missing = {os.path.basename(p) for p in files} - listed
        if missing:
            problems.append(f"MANIFEST.json does not list {sorted(missing)}")
    except (OSError, ValueError, KeyError) as e:
        problems.append(f"MANIFEST.json: {e!r}")
    names = ", ".join(os.path.basename(p) for p in files)
    log(f"  files: {names}; {tensors} tensors ({empty} empty) read with safe_open")
    return problems


def manifest_ns(save_dir, tag):
    """When the daemon wrote the tag's MANIFEST.json (ns since the epoch), or None."""
    try:
        with open(os.path.join(save_dir, tag, "MANIFEST.json")) as f:
            return int(json.load(f)["created_ns"])
    except (OSError, ValueError, KeyError):
        return None


def run(stage, kind, batches, reference):
    """One save/continue/reload run; a result row (dict) with its problems."""
    k, n = ARGS.before, ARGS.after
    save_dir = os.path.join(ARGS.dir, f"zero{stage}-{kind}")
    tag = "last" if ARGS.fixed_tag else f"step{k}"
    row = {"stage": stage, "engine": kind, "problems": []}
    engine = build(stage, seed=1234, kind=kind)
    ce = ours(engine, stage, kind, row)
    if ce is not None:
        timed = Timed(ce)
    row["params"] = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel()
                        for p in engine.module.parameters())
    if ARGS.fixed_tag:  # a first version of the tag, one iteration before the second
        head = train(engine, batches[:k - 1])
        engine.save_checkpoint(save_dir, tag=tag)
        head += train(engine, batches[k - 1:k])  # its step queues that version's commit
        if ce is not None:
            row["first_pending"] = bool(ce._queued)
    else:
        head = train(engine, batches[:k])
    sync()
    t0, wall0 = time.perf_counter(), time.time_ns()
    engine.save_checkpoint(save_dir, tag=tag)
    row["save_ms"] = (time.perf_counter() - t0) * 1e3
    tail = train(engine, batches[k:k + n])
    if ce is not None:
        t1 = time.perf_counter()
        committed = ce.wait_committed()
        row["drain_ms"] = (time.perf_counter() - t1) * 1e3
        row["commit_wait_ms"] = timed.seconds * 1e3
        created = manifest_ns(save_dir, tag)
        if created is not None:
            row["committed_ms"] = (created - wall0) / 1e6
        versions = 2 if ARGS.fixed_tag else 1
        if committed != [os.path.abspath(os.path.join(save_dir, tag))] * versions:
            row["problems"].append(f"committed {committed}")
        row["problems"] += check_files(save_dir, tag)
        if os.path.lexists(os.path.join(save_dir, f".{tag}.dsckpt-next")):
            row["problems"].append(f"the staging directory .{tag}.dsckpt-next is left")
    else:
        row["committed_ms"] = row["save_ms"]
    row["bytes"] = sum(os.path.getsize(p) for p in glob.glob(os.path.join(save_dir, tag, "*"))
                       if os.path.isfile(p) and not os.path.islink(p))
    if head + tail != reference:
        row["problems"].append(f"the saving run's losses differ from the reference: "
                               f"{head + tail} vs {reference}")
    if ce is not None:
        ce.close()
    free(engine)

    fresh = build(stage, seed=999, kind=kind)
    ce = ours(fresh, stage, kind, row)
    t0 = time.perf_counter()
    load_path, _ = fresh.load_checkpoint(save_dir, tag=None if kind != "torch" else tag)
    row["load_ms"] = (time.perf_counter() - t0) * 1e3
    if load_path is None:
        row["problems"].append("load_checkpoint returned None")
    if fresh.global_steps != k:
        row["problems"].append(f"global_steps {fresh.global_steps} after the load, not {k}")
    resumed = train(fresh, batches[k:k + n])
    row["resumed"] = resumed
    if resumed != reference[k:]:
        row["problems"].append(f"resumed losses {resumed} != uninterrupted {reference[k:]}")
    if ce is not None:
        ce.close()
    free(fresh)
    return row


def copied_script(stage, kind, tag, ref):
    """Problems of the zero_to_fp32.py DeepSpeed copied beside a dsckpt run's tags (ours, with
    DeepSpeed's command line: SAVE_DIR OUTPUT_DIR -t TAG): it must run and write
    OUTPUT_DIR/pytorch_model.bin equal, bit for bit, to DeepSpeed's zero_to_fp32 of the torch
    run's tag."""
    save_dir = os.path.join(ARGS.dir, f"zero{stage}-{kind}")
    out = os.path.join(ARGS.dir, f"fp32-zero{stage}-{kind}")
    r = subprocess.run([sys.executable, os.path.join(save_dir, "zero_to_fp32.py"), save_dir,
                        out, "-t", tag], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        return [f"{save_dir}/zero_to_fp32.py exited {r.returncode}: {r.stderr.strip()[-300:]}"]
    got = torch.load(os.path.join(out, "pytorch_model.bin"))
    if list(got) != list(ref) or any(a.dtype != got[n].dtype or not torch.equal(a, got[n])
                                     for n, a in ref.items()):
        return [f"{save_dir}/zero_to_fp32.py's output differs from DeepSpeed's zero_to_fp32"]
    return []


def fp32_parity(stage):
    """dsckpt's zero-to-fp32 of each dsckpt run's tag against DeepSpeed's own zero_to_fp32 of
    the torch run's (same seed and batches, saved at the same step): a result row per run."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint as theirs
    from dsckpt.deepspeed.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint as ours
    tag = "last" if ARGS.fixed_tag else f"step{ARGS.before}"
    ref = theirs(os.path.join(ARGS.dir, f"zero{stage}-torch"), tag)
    rows = []
    for kind in [k for k in ARGS.engines if k != "torch"]:
        row = {"stage": stage, "engine": f"{kind}-fp32", "problems": []}
        got = ours(os.path.join(ARGS.dir, f"zero{stage}-{kind}"), tag)
        if list(got) != list(ref):
            row["problems"].append(f"names {list(got)[:5]}... vs DeepSpeed's {list(ref)[:5]}...")
        for name in ref:
            a, b = ref[name], got.get(name)
            if b is None or a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
                row["problems"].append(f"{name} differs from DeepSpeed's zero_to_fp32")
        row["problems"] += copied_script(stage, kind, tag, ref)
        log(f"{'FAIL' if row['problems'] else 'PASS'}: ZeRO stage {stage}, {kind}: "
            f"python -m dsckpt zero-to-fp32 and the zero_to_fp32.py beside the tags give "
            f"DeepSpeed's zero_to_fp32 ({len(ref)} tensors bit for bit)"
            + "".join(f"\n  problem: {p}" for p in row["problems"][:5]))
        rows.append(row)
    return rows


def main():
    """Every stage: the reference, then each engine's run; PASS/FAIL lines and a table."""
    backend = "gloo" if ARGS.cpu else "nccl"
    deepspeed.init_distributed(dist_backend=backend)
    if DEVICE.type == "cuda":
        torch.cuda.set_device(DEVICE)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    log(f"ds_train: deepspeed {deepspeed.__version__}, torch {torch.__version__}, {DEVICE}, "
        f"{backend}, {ARGS.dtype}, d={ARGS.d_model} layers={ARGS.layers} seq={ARGS.seq} "
        f"batch={ARGS.batch}, {ARGS.before} iterations, save, {ARGS.after} compared"
        + (", tag \"last\" saved twice" if ARGS.fixed_tag else ""))
    os.makedirs(ARGS.dir, exist_ok=True)
    batches = make_batches(ARGS.before + ARGS.after)
    rows = []
    for stage in ARGS.stages:
        engine = build(stage, seed=1234)
        reference = train(engine, batches)
        free(engine)
        log(f"zero{stage}: reference losses {[round(x, 5) for x in reference]}")
        for kind in ARGS.engines:
            try:
                row = run(stage, kind, batches, reference)
            except Exception:
                traceback.print_exc()
                row = {"stage": stage, "engine": kind,
                       "problems": [traceback.format_exc().strip().splitlines()[-1]]}
            rows.append(row)
            verdict = "FAIL" if row["problems"] else "PASS"
            log(f"{verdict}: ZeRO stage {stage}, {kind}: resumed losses "
                f"{'match' if not row['problems'] else 'see problems'}"
                + "".join(f"\n  problem: {p}" for p in row["problems"]))
        if "torch" in ARGS.engines and len(ARGS.engines) > 1:
            try:
                rows += fp32_parity(stage)
            except Exception:
                traceback.print_exc()
                rows.append({"stage": stage, "engine": "fp32", "problems": [
                    traceback.format_exc().strip().splitlines()[-1]]})
        shutil.rmtree(ARGS.dir, ignore_errors=True)
        os.makedirs(ARGS.dir, exist_ok=True)

    log("")
    log("save_checkpoint: the call's time (torch.save: the whole write); wait in step: "
        "dsckpt's SNAPSHOT wait in the next engine.step(); committed: save start to "
        "MANIFEST.json; drain: wait_committed() after the N iterations")
    log(f"{'stage':>5} {'engine':<7} {'params':>9} {'ckpt MB':>8} {'save_checkpoint':>16} "
        f"{'wait in step':>13} {'committed':>11} {'drain':>9} {'load':>9}  result"
        + ("  1st pending" if ARGS.fixed_tag else ""))
    for r in rows:
        def ms(key):
            return f"{r[key]:.1f} ms" if key in r else "-"
        log(f"{r['stage']:>5} {r['engine']:<7} {r.get('params', 0):>9} "
            f"{r.get('bytes', 0) / 1e6:>8.1f} {ms('save_ms'):>16} {ms('commit_wait_ms'):>13} "
            f"{ms('committed_ms'):>11} {ms('drain_ms'):>9} {ms('load_ms'):>9}  "
            f"{'FAIL' if r['problems'] else 'PASS'}"
            + (f"  {r.get('first_pending', '-')}" if ARGS.fixed_tag else ""))
    failed = sum(1 for r in rows if r["problems"])
    log(f"ds_train: {len(rows) - failed} passed, {failed} failed")
    torch.distributed.destroy_process_group()
    return 1 if failed or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
