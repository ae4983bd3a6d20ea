"""save_progress.py — the progress of dsckpt's saves over time, for bench_train.py's dsckpt mode
and the picture tests/gpu/plot.py draws of it (train-progress.png)."""
import json
import os
import subprocess
import threading
import time

import dsckpt


class SaveSampler:
    """The progress of dsckpt's saves over time, sampled off the training thread: a thread
    runs `dsckptctl --json pending` (a process and a connection of its own: the trainer's
    connection, which wait_snapshot holds, is never touched) and adds up, per tracked
    checkpoint directory, the bytes snapshotted, flushed and in total of its files, from the
    save call until they are all DURABLE (or FAILED, or 300 s have passed). Every period_s
    while a tracked save is short of SNAPSHOT (a fraction of a second on the GPU), every
    FLUSH_PERIOD_S while they only flush (seconds): fewer processes beside the timed loop."""

    LIMIT_S = 300.0
    FLUSH_PERIOD_S = 0.25

    def __init__(self, ctl, socket, period_s):
        self.cmd = [ctl, "-s", socket, "--json", "pending"]
        self.period = period_s
        self.lock = threading.Lock()
        self.entries = []  # one per tracked directory, in the order tracked
        self.active = {}   # normalized dir -> its entry, until DURABLE
        self.errors = []
        self.stopping = threading.Event()
        self.wake = threading.Event()  # set by track() and stop(): the thread samples at once
        self.thread = threading.Thread(target=self._run, name="dsckpt-progress", daemon=True)
        self.thread.start()

    def track(self, tag_dir, t0):
        """Samples tag_dir's saves from now on; times count from t0 (perf_counter)."""
        e = {"tag": os.path.basename(tag_dir), "t0": t0, "samples": [], "snapped": False}
        with self.lock:
            self.entries.append(e)
            self.active[os.path.normpath(tag_dir)] = e
        self.wake.set()

    def _sample(self):
        """One `dsckptctl pending`: a sample [s since the save call, snapshotted, flushed,
        total] for each tracked directory the daemon lists; finished ones leave active."""
        a = time.perf_counter()
        r = subprocess.run(self.cmd, capture_output=True, text=True, timeout=10)
        t = (a + time.perf_counter()) / 2
        if r.returncode != 0:
            self.errors.append(f"dsckptctl pending: exit {r.returncode}: {r.stderr.strip()}")
            return
        saves = json.loads(r.stdout).get("saves", [])
        with self.lock:
            for d, e in list(self.active.items()):
                rows = [x for x in saves if os.path.normpath(x["dir"]) == d]
                if rows:
                    e["samples"].append([t - e["t0"], sum(x["bytes_snapshot"] for x in rows),
                                         sum(x["bytes_flushed"] for x in rows),
                                         sum(x["bytes_total"] for x in rows)])
                e["snapped"] = bool(rows) and all(
                    x["level"] >= dsckpt.Level.SNAPSHOT or x["level"] < 0 for x in rows)
                over = all(x["level"] >= dsckpt.Level.DURABLE or x["level"] < 0 for x in rows)
                if (rows and over) or t - e["t0"] > self.LIMIT_S:
                    del self.active[d]

    def _run(self):
        """Samples while a directory is tracked, until stopped."""
        while not self.stopping.is_set():
            t = time.perf_counter()
            if self.active:
                try:
                    self._sample()
                except Exception as e:  # reported in the results, never raised
                    self.errors.append(f"{type(e).__name__}: {e}")
            with self.lock:
                if not self.active:
                    period = None  # until track()
                elif any(not e["snapped"] for e in self.active.values()):
                    period = self.period
                else:
                    period = max(self.period, self.FLUSH_PERIOD_S)
            self.wake.wait(None if period is None else
                           max(0.0, period - (time.perf_counter() - t)))
            self.wake.clear()

    def halt(self):
        """Tells the thread to end now (it exits after the sample it may be taking)."""
        self.stopping.set()
        self.wake.set()

    def stop(self, timeout=30.0):
        """Lets the tracked saves finish (timeout s at most), stops; the entries
        ({"tag", "samples"}), in the order the saves were tracked."""
        end = time.monotonic() + timeout
        while self.active and time.monotonic() < end:
            time.sleep(self.period)
        self.halt()
        self.thread.join(timeout=15)
        with self.lock:
            return [{"tag": e["tag"], "samples": e["samples"]} for e in self.entries]
