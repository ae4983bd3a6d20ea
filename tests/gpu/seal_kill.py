#!/usr/bin/env python3
"""seal_kill.py SOCKET ROOT — a GPU trainer SIGKILLed right after it seals a checkpoint: the
daemon commits it alone, and a new process resumes from it with the same losses.

Three processes on the GPU, each building the same small model with AdamW and the same
seeded batches:
1. the reference trains STEPS steps and prints every loss;
2. the victim trains KILL_AT steps, saves the model and the optimizer (CUDA tensors, and the
   optimizer's CPU step counters) through dsckpt.torch.save, seals the tag and SIGKILLs
   itself at once: nothing waits for SNAPSHOT, DURABLE or a commit;
3. once the daemon has committed the tag by itself (MANIFEST.json, then latest), the resumer
   loads it onto the GPU, trains the remaining steps, and its losses must equal the
   reference's bit for bit.

Run by tests/gpu/run-gpu-checks with DSCKPT_LIB and PYTHONPATH set to the bundle's library
and client/python. Exit status: 0 passed, 1 failed, 77 skipped (no torch, no GPU).
"""
import json
import os
import signal
import subprocess
import sys
import time

SKIP = 77
STEPS, KILL_AT = 8, 4
TIMEOUT = 120


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(SKIP)


def fail(why):
    print(f"FAIL: {why}", file=sys.stderr)
    sys.exit(1)


try:
    import torch
except ImportError as e:
    skip(f"no torch ({e})")
DEVICE = os.environ.get("SEAL_KILL_DEVICE", "cuda")  # "cpu": a dry run of the flow
WIDTH = int(os.environ.get("SEAL_KILL_WIDTH", "4096"))
if DEVICE == "cuda" and not torch.cuda.is_available():
    skip("no CUDA device")


def build():
    """The model and its optimizer, the same in every process."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, WIDTH), torch.nn.GELU(),
                                torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU(),
                                torch.nn.Linear(WIDTH, 1024)).to(DEVICE)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train(model, opt, steps):
    """Trains the given steps on seeded batches; the losses."""
    losses = []
    for step in steps:
        g = torch.Generator(device=DEVICE).manual_seed(1000 + step)
        x = torch.randn(256, 1024, device=DEVICE, generator=g)
        y = torch.randn(256, 1024, device=DEVICE, generator=g)
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def role(name, sock, tag):
    """One process's part (see the top of the file); prints its losses as JSON."""
    import dsckpt
    import dsckpt.torch as dt
    torch.use_deterministic_algorithms(True)
    model, opt = build()
    if name == "reference":
        print(json.dumps(train(model, opt, range(STEPS))))
    elif name == "victim":
        train(model, opt, range(KILL_AT))
        conn = dsckpt.Connection(sock, job="sealkill", rank=0, world_size=1)
        dt.save({"model": model.state_dict(), "opt": opt.state_dict()}, tag, conn=conn)
        conn.seal(tag)
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        state = dt.load(tag, map_location=DEVICE)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        print(json.dumps(train(model, opt, range(KILL_AT, STEPS))))


def run(name, sock, tag):
    """Runs a role in a new process; its exit status and output."""
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8", PYTHONUNBUFFERED="1")
    p = subprocess.run([sys.executable, __file__, sock, tag, name], env=env,
                       capture_output=True, text=True, timeout=TIMEOUT)
    return p.returncode, p.stdout, p.stderr


def main():
    if len(sys.argv) > 3:  # a child: SOCKET TAG ROLE
        return role(sys.argv[3], sys.argv[1], sys.argv[2])
    sock, root = sys.argv[1], sys.argv[2]
    tag = os.path.join(root, "sealkill", f"step{KILL_AT}")
    rc, out, err = run("reference", sock, tag)
    if rc != 0:
        fail(f"reference run: {err}")
    ref = json.loads(out)
    t0 = time.monotonic()
    rc, _, err = run("victim", sock, tag)
    if rc != -signal.SIGKILL:
        fail(f"the victim was not killed after its seal (status {rc}): {err}")
    latest = os.path.join(root, "sealkill", "latest")
    while not (os.path.exists(latest) and open(latest).read() == os.path.basename(tag)):
        if time.monotonic() - t0 > TIMEOUT:
            fail(f"the daemon did not commit {tag} (latest) after the trainer died")
        time.sleep(0.05)
    committed = time.monotonic() - t0
    if not os.path.exists(os.path.join(tag, "MANIFEST.json")):
        fail("latest names a tag without a manifest")
    rc, out, err = run("resume", sock, tag)
    if rc != 0:
        fail(f"resumed run: {err}")
    resumed = json.loads(out)
    if resumed != ref[KILL_AT:]:
        fail(f"losses differ after the resume: {resumed} vs {ref[KILL_AT:]}")
    print(f"trainer SIGKILLed right after seal at step {KILL_AT}; the daemon committed the "
          f"tag {committed:.1f} s after the victim started; resumed steps {KILL_AT}-"
          f"{STEPS - 1}: losses equal the uninterrupted run's bit for bit "
          f"({', '.join(f'{v:.6f}' for v in resumed)})")


if __name__ == "__main__":
    main()
