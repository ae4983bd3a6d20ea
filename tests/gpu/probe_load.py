#!/usr/bin/env python3
"""probe_load.py — what the first load of a fresh process pays (issue 34, item 1).

The parent saves bench_train's GPT + AdamW (8.2 GB; --preset smoke: a tiny one on the CPU)
through the daemon it is given, then starts fresh processes that each restore it several
times in a row and time every phase of every call:

  connect      dsckpt's connection to the daemon (the process's first);
  header       reading and checking the file's header against the destinations;
  begin        LOAD_BEGIN (the daemon opens the file or finds it in its cache);
  add          LOAD_ADD of the destinations (their CUDA IPC handles made here);
  end          LOAD_END (the daemon opens the handles, plans, starts copying);
  wait         until the daemon says the bytes are in;

for `load_into` into the model's own tensors (1st and 2nd call of the process), `load_into`
into newly allocated tensors (new IPC handles), and `load` (1st and 2nd call), each hot
(the daemon's cache), warm (the daemon restarted, the file read through the page cache
first) and again (the daemon restarted once more, the page cache left as the warm loads
left it: a first load after the daemon's start slower here too is the daemon's, one as fast
as warm's second is the page cache's second reading of the file). Prints a table last: per
call its phases in ms and its GB/s; with the daemon at log_level debug, its log has a line
per load saying where the load's time went (run-resume prints them: RESUME_LOG_LEVEL=debug).
Diagnostic, not a test: nothing is asserted but that every restored byte equals the saved
state's (a checksum per tensor).
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_resume as br  # noqa: E402  (this directory: presets, the daemon, the model)

PHASES = ("connect", "header", "begin", "add", "end", "wait")


def timed(marks, phase, fn):
    """fn wrapped to add its wall-clock seconds to marks[phase], once: a call inside another
    of the same phase (fill.check calls fill.header) is not counted again."""
    def wrapper(*args, **kwargs):
        if marks.get("in " + phase):
            return fn(*args, **kwargs)
        marks["in " + phase] = True
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            marks[phase] = marks.get(phase, 0.0) + time.perf_counter() - t
            marks["in " + phase] = False
    return wrapper


def instrument(marks):
    """Every phase of a load timed into marks (the dict is emptied per call)."""
    import dsckpt.core as core
    import dsckpt._fill as fill
    import dsckpt.torch as dt
    core.Connection.load = timed(marks, "begin", core.Connection.load)
    core.Load.add_tensors = timed(marks, "add", core.Load.add_tensors)
    core.Load.end = timed(marks, "end", core.Load.end)
    core.Load.wait = timed(marks, "wait", core.Load.wait)
    fill.check = timed(marks, "header", fill.check)
    fill.header = timed(marks, "header", fill.header)
    dt.default_connection = timed(marks, "connect", dt.default_connection)


def sums(torch, tensors):
    """A cheap fingerprint of every tensor (sum of its bytes as int64, on its device)."""
    return [int(t.detach().reshape(-1).contiguous().view(torch.uint8).to(torch.int64).sum().item())
            for t in tensors]


def flat(sd):
    """The tensors of a nested state dict, in a fixed order."""
    out = []
    if isinstance(sd, dict):
        for k in sorted(sd, key=str):
            out += flat(sd[k])
    elif isinstance(sd, (list, tuple)):
        for v in sd:
            out += flat(v)
    elif hasattr(sd, "data_ptr"):
        out.append(sd)
    return out


def child_save(a):
    """Builds the model, runs one step so AdamW has its state, saves and commits it."""
    torch, bt, cfg, dev, _ = br.child_setup(a)
    import dsckpt
    import dsckpt.torch as dt
    trainer = bt.Trainer(cfg, dev)
    trainer.forward_backward(bt.make_batches(cfg, dev)[0])
    trainer.opt.step()
    state = {"model": trainer.model.state_dict(), "optimizer": trainer.opt.state_dict()}
    tag = os.path.join(a.dir, "probe", "step1")
    with dsckpt.Connection(a.socket, job="probe") as conn:
        h = dt.save(state, tag, conn=conn, file="rank0")
        h.wait_snapshot(timeout=600)
        conn.commit(tag, timeout=600)
    print(json.dumps({"bytes": bt.state_bytes(state), "sums": sums(torch, flat(state))}),
          flush=True)


def child_load(a):
    """A fresh process: the same tag loaded five ways, each timed by phase."""
    torch, bt, cfg, dev, _ = br.child_setup(a)
    import dsckpt.torch as dt
    marks = {}
    instrument(marks)
    model, opt = br.build(bt, cfg, dev, meta=False)
    trainer = bt.Trainer.__new__(bt.Trainer)
    trainer.dev, trainer.cfg, trainer.model, trainer.opt = dev, cfg, model, opt
    trainer.forward_backward(bt.make_batches(cfg, dev)[0])
    opt.step()  # AdamW's state exists, as in a trainer that resumes into it
    state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    tag = os.path.join(a.dir, "probe", "step1")
    rows = []

    def call(name, fn):
        marks.clear()
        bt.sync(dev)
        t = time.perf_counter()
        out = fn()
        bt.sync(dev)
        total = time.perf_counter() - t
        rows.append({"call": name, "total": total, **{p: marks.get(p, 0.0) for p in PHASES}})
        return out

    call("load_into #1", lambda: dt.load_into(state, tag, "rank0"))
    call("load_into #2", lambda: dt.load_into(state, tag, "rank0"))
    fresh = {"model": {k: torch.empty_like(v) for k, v in state["model"].items()},
             "optimizer": {"state": {k: {n: torch.empty_like(t) for n, t in s.items()}
                                     for k, s in state["optimizer"]["state"].items()},
                           "param_groups": state["optimizer"]["param_groups"]}}
    call("load_into new", lambda: dt.load_into(fresh, tag, "rank0"))
    del fresh
    got = call("load #1", lambda: dt.load(tag, "rank0", map_location=dev))
    del got
    got = call("load #2", lambda: dt.load(tag, "rank0", map_location=dev))
    print(json.dumps({"rows": rows, "sums": sums(torch, flat(got))}), flush=True)


def run_child(a, mode):
    """This script as a fresh child; its last JSON line."""
    out = subprocess.run([sys.executable, "-u", os.path.abspath(__file__), "--socket",
                          a.socket, "--dir", a.dir, "--preset", a.preset, "--child", mode],
                         capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, DSCKPT_SOCKET=a.socket))
    sys.stderr.write(out.stderr[-3000:])
    if out.returncode != 0:
        raise RuntimeError(f"{mode} child exited with {out.returncode}")
    return br.last_json(out.stdout)


def parent(a):
    """Saves once, then loads hot, warm and again in fresh processes; prints the table."""
    daemon = br.Daemon(a.daemon, a.socket, a.ctl)
    daemon.start()
    try:
        saved = run_child(a, "save")
        gb = saved["bytes"] / 1e9
        results = [("hot", run_child(a, "load"))]
        daemon.restart()
        for _ in range(a.read_through):
            br.read_through([os.path.join(a.dir, "probe", "step1", "rank0.safetensors")])
        results.append(("warm", run_child(a, "load")))
        daemon.restart()
        results.append(("again", run_child(a, "load")))
    finally:
        daemon.stop()
    bad = [s for s, r in results if r["sums"] != saved["sums"]]
    print(f"\nprobe_load: {gb:.2f} GB per call; ms per phase, fresh process")
    print(f"{'state':5} {'call':14} " + " ".join(f"{p:>8}" for p in PHASES)
          + f" {'total':>8} {'GB/s':>7}")
    for state, r in results:
        for row in r["rows"]:
            print(f"{state:5} {row['call']:14} "
                  + " ".join(f"{row[p] * 1e3:8.1f}" for p in PHASES)
                  + f" {row['total'] * 1e3:8.1f} {gb / row['total']:7.1f}")
    if bad:
        print(f"probe_load: FAILED: restored bytes differ ({', '.join(bad)})")
        return 1
    print("probe_load: every restored byte matched the saved state")
    return 0


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--socket", required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--daemon", help="shell command starting dsckptd (parent only)")
    p.add_argument("--ctl", default="dsckptctl")
    p.add_argument("--preset", choices=sorted(br.PRESETS), default="gpt-8gb")
    p.add_argument("--child", choices=("save", "load"))
    p.add_argument("--read-through", type=int, default=1, metavar="N",
                   help="times the parent reads the file before the warm loads (2: is the "
                        "warm 1st load's extra the page cache's second reading?)")
    a = p.parse_args(argv)
    if a.child == "save":
        child_save(a)
        return 0
    if a.child == "load":
        child_load(a)
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return parent(a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
