#!/usr/bin/env python3
"""bench_restore.py — restoring onto the GPU, dsckpt beside the same run's baselines and bounds.

Over 1,000 lines: one self-contained script run as is on the GPU node (tests/gpu/run-bench-restore,
`make bench-restore`); it starts and restarts the bundle's dsckptd itself (a restart empties the
daemon's cache, which is how "from files" is measured).

Part 1, per checkpoint size (--sizes, GB; default 8 and 20): fp32 CUDA tensors of 33-268 MB
(seeded sizes) saved through dsckpt.torch.save into a root on local disk and committed, then
timed onto the GPU (GB/s, GB = 1e9 bytes; the GPU synchronized before the clock stops; each cell
the median of up to --reps runs, fewer once a cell has taken 12 s; every method's output is
compared with the saved tensors once per column):
  columns  hot    the daemon's cache holds the file it just committed (host_cache_size 48 GiB on
                  a machine with >= 120 GiB of RAM, else what fits in 40% of it);
           warm   the daemon restarted (its cache empty), the files read once into the page
                  cache (dsckpt's restore reads with O_DIRECT where it can: the page cache does
                  not help it, the tmpfs column shows memory-speed files);
           tmpfs  the same files copied to /dev/shm;
           cold   `echo 3 > /proc/sys/vm/drop_caches` before each run (one run; "n/a" with the
                  reason when not permitted).
  rows     dsckpt C API      dsckpt_load_* into preallocated GPU tensors (ctypes), its source
                             ("cache" or "file") checked against the column;
           dsckpt load_into  dsckpt.torch.load_into(state_dict, dir): in place (it must say
                             the daemon served it, not that it read the file itself);
           dsckpt load       dsckpt.torch.load(dir, map_location="cuda") (which reads the
                             file itself, silently, when the daemon declines);
           torch.load        of a torch.save'd copy, map_location="cuda";
           safetensors       load_file(our file, device=DEV);
           DCP load          torch.distributed.checkpoint.load (one process, no process group)
                             of a dcp.save'd copy into preallocated GPU tensors;
           fastsafetensors   0.5 (nogds), from the wheel in tests/gpu/wheels (Apache-2.0),
                             unpacked into the scratch directory (no pip, no network);
           bound: preadv     16 threads, 64 MiB preadv pieces into pinned host memory (8
                             threads read tmpfs at 30 GB/s on the H200's 16-vCPU host and 16
                             at 43: 8 understated the bound until 2026-12-04);
           bound: H2D        pinned host -> GPU copy (torch, one copy_), any column;
           bound: dd direct  dd iflag=direct bs=64M of the file (never the page cache).
  Baseline copies are made one at a time and deleted after their cells (disk room).
Part 2 (--train): the time from starting a new bench-train process (tests/gpu/bench_train.py's
model and batches, --train-preset) to the end of its first training step restored from each
source (hot, warm, cold; dsckpt.torch.load, dsckpt.torch.load_into, and
dsckpt.torch.materialize of a model built on the meta device, whose model_s is then the build
without weights), and whether that run's next losses equal those of an uninterrupted run that
saved the checkpoint (exact, or a relative difference <= 1e-6, as bench-train's restore
check).

A method the library does not have yet, a copy the disk has no room for, an item past --budget
seconds: a cell with the reason, never a crash. Raw numbers go to --results (default
tests/gpu/results) and $OUT when set: bench-restore-<UTC time>.json and .csv. The table is
printed last. Exit status 0, 1 when a correctness check failed, 77 without torch/CUDA.
"""
import time

T_START = time.time()  # first: a resume child's clock starts with the process

import argparse  # noqa: E402
import csv  # noqa: E402
import ctypes  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import zipfile  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
GIB = 1 << 30
PIECE = 64 << 20
COLUMNS = ("hot", "warm", "tmpfs", "cold")
COPIES = ("torch.load", "DCP load")  # the baselines that need copies of their own
CELL_S = 12.0  # a cell stops repeating once it has taken this long
DEV = "cuda"  # "cpu" with --smoke: the paths end to end on a machine without a GPU


def sync():
    """Waits for the GPU's queued work (nothing on the CPU)."""
    import torch
    if DEV == "cuda":
        torch.cuda.synchronize()


def empty_cache():
    import torch
    if DEV == "cuda":
        torch.cuda.empty_cache()


def log(msg):
    """One progress line at once."""
    print(msg, flush=True)


# ---------------------------------------------------------------------------------------
# The daemon


class Daemon:
    """The bundle's dsckptd on a generated configuration, started, restarted and stopped here
    (SIGTERM; it must exit 0)."""

    def __init__(self, bundle, scratch, roots, extra=None):
        self.bundle, self.scratch, self.roots = bundle, scratch, roots
        self.extra = extra or {}  # more configuration keys (--daemon-config)
        self.sock = os.path.join(scratch, "dsckptd.sock")
        self.conf = os.path.join(scratch, "dsckptd.json")
        self.logpath = os.path.join(scratch, "dsckptd.log")
        self.proc, self.cache_gib, self.starts = None, None, []

    def ctl(self, *args):
        """dsckptctl's output (stdout and stderr)."""
        r = subprocess.run([os.path.join(self.bundle, "dsckptctl"), "-s", self.sock, *args],
                           capture_output=True, text=True, timeout=60)
        return r.returncode, r.stdout + r.stderr

    def start(self, cache_gib):
        """Starts it with a cache of cache_gib GiB; waits (180 s at most) until it answers."""
        with open(self.conf, "w") as f:
            json.dump({"socket": self.sock, "allowed_roots": self.roots,
                       "host_cache_size": cache_gib, "chunk_size": 64, "copy_threads": 4,
                       "flush_threads": 4, "keep_last": 0, "log_level": "info",
                       "o_direct": True, **self.extra}, f)
        t0 = time.perf_counter()
        with open(self.logpath, "ab") as lf:
            self.proc = subprocess.Popen([os.path.join(self.bundle, "dsckptd"), "-d", "-c",
                                          self.conf], stdout=lf, stderr=lf)
        while time.perf_counter() - t0 < 180:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dsckptd exited with {self.proc.returncode}:\n"
                                   + self.log_tail())
            if os.path.exists(self.sock) and self.ctl("status")[0] == 0:
                self.cache_gib = cache_gib
                self.starts.append({"cache_gib": cache_gib,
                                    "start_s": time.perf_counter() - t0})
                log(f"  dsckptd up with a {cache_gib} GiB cache in "
                    f"{time.perf_counter() - t0:.1f} s")
                return
            time.sleep(0.2)
        raise RuntimeError("dsckptd did not answer within 180 s:\n" + self.log_tail())

    def stop(self):
        """SIGTERM, then waits (60 s, then SIGKILL); raises unless it exited 0."""
        if self.proc is None:
            return
        p, self.proc = self.proc, None
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            raise RuntimeError("dsckptd still running 60 s after SIGTERM")
        if rc != 0:
            raise RuntimeError(f"dsckptd exited with status {rc} after SIGTERM")

    def restart(self, cache_gib):
        """Stops and starts it again: its cache (and every resident file) is gone."""
        self.stop()
        self.start(cache_gib)

    def log_tail(self, n=20):
        try:
            with open(self.logpath, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""


# ---------------------------------------------------------------------------------------
# The C API through ctypes (the raw restore, its source checked)


class Tensor(ctypes.Structure):
    """dsckpt_tensor_t."""
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_char_p),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("ndim", ctypes.c_int),
                ("ptr", ctypes.c_void_p), ("nbytes", ctypes.c_size_t)]


class RawLoad:
    """dsckpt_load_* of libdsckpt (the one the dsckpt package loaded), or why not."""
    FUNCS = ("dsckpt_load_begin", "dsckpt_load_source", "dsckpt_load_add_tensors",
             "dsckpt_load_end", "dsckpt_load_wait", "dsckpt_load_free")

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        missing = [f for f in self.FUNCS if not hasattr(self.lib, f)]
        self.why = f"{os.path.basename(path)} has no {', '.join(missing)}" if missing else None
        if missing:
            return
        vp, cp, i = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
        sig = {"dsckpt_load_begin": (i, [vp, cp, cp, ctypes.POINTER(vp)]),
               "dsckpt_load_source": (cp, [vp]),
               "dsckpt_load_add_tensors": (i, [vp, ctypes.POINTER(Tensor), ctypes.c_size_t,
                                               ctypes.POINTER(ctypes.c_size_t)]),
               "dsckpt_load_end": (i, [vp]), "dsckpt_load_wait": (i, [vp, i]),
               "dsckpt_load_free": (None, [vp]), "dsckpt_last_error": (cp, [vp]),
               "dsckpt_err_name": (cp, [i])}
        for name, (res, args) in sig.items():
            fn = getattr(self.lib, name)
            fn.restype, fn.argtypes = res, args

    def fail(self, conn, call, rc):
        err = self.lib.dsckpt_last_error(conn).decode(errors="replace")
        raise RuntimeError(f"{call}: {self.lib.dsckpt_err_name(rc).decode()}: {err}")

    def load(self, conn, tag, file, dst, want):
        """Fills dst {name: CUDA tensor} from tag/file; returns the source the daemon named,
        which must be want."""
        import torch
        h = ctypes.c_void_p()
        names = list(dst)
        shapes = [(ctypes.c_int64 * max(dst[n].dim(), 1))(*dst[n].shape) for n in names]
        arr = (Tensor * len(names))()
        keep = []
        for i, n in enumerate(names):
            t = dst[n]
            b = n.encode()
            keep.append(b)
            arr[i] = Tensor(b, ST_NAMES[t.dtype], shapes[i], t.dim(), t.data_ptr(),
                            t.numel() * t.element_size())
        rc = self.lib.dsckpt_load_begin(conn, tag.encode(), file.encode(), ctypes.byref(h))
        if rc < 0:
            self.fail(conn, "dsckpt_load_begin", rc)
        try:
            src = self.lib.dsckpt_load_source(h).decode()
            if src != want:
                raise RuntimeError(f"the daemon loads from {src!r}, this column wants {want!r}")
            added = ctypes.c_size_t()
            for call, rc in (("dsckpt_load_add_tensors", self.lib.dsckpt_load_add_tensors(
                    h, arr, len(names), ctypes.byref(added))),
                    ("dsckpt_load_end", self.lib.dsckpt_load_end(h)),
                    ("dsckpt_load_wait", self.lib.dsckpt_load_wait(h, 600 * 1000))):
                if rc < 0:
                    self.fail(conn, call, rc)
        finally:
            self.lib.dsckpt_load_free(h)
        sync()  # LOADED already means complete; the clock treats every method alike
        return src


ST_NAMES = {}


# ---------------------------------------------------------------------------------------
# Helpers


def mem_total_gib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / (1 << 20)
    return 0.0


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fs_type(path):
    """The filesystem type of path's mount (longest matching mount point)."""
    best, kind = "", "?"
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            mnt = parts[1]
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
                best, kind = mnt, parts[2]
    return kind


def drop_caches():
    """Drops the page cache: None, or why it could not."""
    if DEV != "cuda":
        return "--smoke: the page cache is left alone"
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return None
    except OSError as e:
        return f"drop_caches: {e.strerror}"


def warm_files(paths):
    """Reads every file once (into the page cache)."""
    for p in paths:
        for root, _, files in os.walk(p) if os.path.isdir(p) else [(None, None, [p])]:
            for name in files:
                with open(os.path.join(root, name) if root else name, "rb") as f:
                    while f.read(PIECE):
                        pass


def dir_size(p):
    if os.path.isfile(p):
        return os.path.getsize(p)
    return sum(os.path.getsize(os.path.join(r, n)) for r, _, fs in os.walk(p) for n in fs)


def make_state(nbytes, seed):
    """{layer<i>: fp32 CUDA tensor} of 33-268 MB each (seeded), about nbytes in all."""
    import torch
    rng = random.Random(seed)
    state, total, i = {}, 0, 0
    g = torch.Generator(device=DEV).manual_seed(seed)
    while total < nbytes:
        n = min(rng.randint(33_000_000, 268_000_000), max(nbytes - total, 33_000_000)) // 4
        state[f"layer{i}"] = torch.randn(n, device=DEV, generator=g)
        total += n * 4
        i += 1
    return state


def same(out, state):
    """Whether out holds every tensor of state, bit for bit, on the GPU."""
    import torch
    if set(out) != set(state):
        return f"keys differ: {sorted(set(out) ^ set(state))[:4]}"
    for k, v in state.items():
        o = out[k]
        if o.device != v.device or o.dtype != v.dtype or o.shape != v.shape:
            return f"{k}: {o.dtype} {tuple(o.shape)} on {o.device}"
        if not torch.equal(o.view(torch.int32), v.view(torch.int32)):
            return f"{k}: bytes differ"
    return None


def pinned_buffer(n):
    """n bytes of pinned host memory as a uint8 tensor: touched pageable memory registered
    with cudaHostRegister (torch's pinned allocator would round 20 GB up to 32 GiB)."""
    import torch
    buf = torch.zeros(n, dtype=torch.uint8)
    if DEV != "cuda":
        return buf
    rc = int(torch.cuda.cudart().cudaHostRegister(buf.data_ptr(), n, 0))
    if rc != 0:  # not cudaSuccess: pinned the usual way
        log(f"  cudaHostRegister of {n / 1e9:.1f} GB failed ({rc}): torch's pinned allocator")
        return torch.empty(n, dtype=torch.uint8, pin_memory=True)
    buf.registered = True
    return buf


def pinned_free(buf):
    """Unregisters what pinned_buffer registered."""
    import torch
    if buf is not None and getattr(buf, "registered", False):
        torch.cuda.cudart().cudaHostUnregister(buf.data_ptr())


def preadv_into(path, buf, threads=16):
    """Reads path (from offset 0, buf's size at most) into buf (pinned uint8) with threads
    threads of PIECE-byte preadv calls."""
    size = min(os.path.getsize(path), buf.numel())
    mem = memoryview(buf.numpy())
    fd = os.open(path, os.O_RDONLY)
    try:
        def one(off):
            view, done = mem[off:off + min(PIECE, size - off)], 0
            while done < len(view):
                n = os.preadv(fd, [view[done:]], off + done)
                if n <= 0:
                    raise OSError(f"{path}: short read at {off + done}")
                done += n
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, range(0, size, PIECE)))
    finally:
        os.close(fd)
    return size


def dd_direct(path):
    """dd iflag=direct of the file to /dev/null; the bytes it read."""
    r = subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=64M", "iflag=direct"],
                       capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr else "dd failed")
    return os.path.getsize(path)


def fastsafetensors_import(scratch):
    """fastsafetensors from the carried wheel, unpacked into scratch; the module or why not."""
    wheels = sorted(w for w in os.listdir(os.path.join(HERE, "wheels"))
                    if w.startswith("fastsafetensors-") and w.endswith(".whl")) \
        if os.path.isdir(os.path.join(HERE, "wheels")) else []
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    fit = [w for w in wheels if f"-{tag}-" in w]
    if not fit:
        return None, (f"no wheel for {tag} in tests/gpu/wheels ({', '.join(wheels) or 'none'})")
    dest = os.path.join(scratch, "pylib")
    with zipfile.ZipFile(os.path.join(HERE, "wheels", fit[0])) as z:
        z.extractall(dest)
    sys.path.insert(0, dest)
    try:
        import fastsafetensors
        return fastsafetensors, None
    except Exception as e:  # a missing dependency, a wrong ABI: say which
        return None, f"import failed: {type(e).__name__}: {e}"


# ---------------------------------------------------------------------------------------
# Part 1: one checkpoint size


class Results:
    """Every cell as a dict (size_gb, method, column, and gbps, secs, runs, ok, bytes or only a
    note saying why there is no number), the failures, and part 2's outcome (train)."""

    def __init__(self):
        self.cells = []
        self.failures = []

    def add(self, size, method, column, **kw):
        self.cells.append(dict(size_gb=size, method=method, column=column, **kw))


class Bench:
    """What part 1 and part 2 share: options, the daemon, results, the clock."""

    def __init__(self, a, daemon, raw, res):
        self.a, self.d, self.raw, self.res = a, daemon, raw, res
        self.t0 = time.monotonic()
        self.fst, self.fst_why = None, None

    def left(self):
        return self.a.budget - (time.monotonic() - self.t0)

    def cell(self, size, method, column, fn, nbytes, check=None, reps=None, before=None):
        """Times fn() (GPU synchronized) up to reps times (fewer past CELL_S seconds), checks
        the first output with check(out) (None: good, else why), records the cell."""
        import torch
        if self.a.copies_only and method not in COPIES:
            fn = "skipped (--copies-only)"
        if isinstance(fn, str):  # a reason it cannot run
            self.res.add(size, method, column, note=fn)
            log(f"    {method:18s} {column:5s}  -  ({fn})")
            return
        if self.left() < 20:
            self.res.add(size, method, column, note="out of time (--budget)")
            return
        reps = reps or self.a.reps
        times, spent, ok, note = [], 0.0, None, None
        try:
            for r in range(reps):
                if before:
                    why = before()
                    if why:
                        self.res.add(size, method, column, note=why)
                        log(f"    {method:18s} {column:5s}  -  ({why})")
                        return
                sync()
                t = time.perf_counter()
                out = fn()
                sync()
                times.append(time.perf_counter() - t)
                spent += times[-1]
                if r == 0 and check is not None:
                    why = check(out)
                    ok = why is None
                    if not ok:
                        note = f"WRONG: {why}"
                        self.res.failures.append(f"{size} GB {method} {column}: {why}")
                del out
                if spent > CELL_S:
                    break
        except Exception as e:
            note = f"FAILED: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
            self.res.failures.append(f"{size} GB {method} {column}: {note}")
        secs = statistics.median(times) if times else None
        gbps = nbytes / secs / 1e9 if secs else None
        self.res.add(size, method, column, gbps=gbps, secs=secs, runs=times, ok=ok, note=note,
                     bytes=nbytes)
        log(f"    {method:18s} {column:5s} {gbps or 0:7.2f} GB/s  runs "
            f"{', '.join(f'{x:.2f}' for x in times)} s" + (f"  {note}" if note else ""))
        empty_cache()

    def size(self, gb, pinned):
        """Part 1 for one size (see the top)."""
        import torch
        import dsckpt
        import dsckpt.torch as dt
        a = self.a
        size = gb
        nbytes_want = int(gb * 1e9)
        job = f"restore{gb:g}GB"
        tag = os.path.join(a.disk_root, job, "t1")
        log(f"== {gb:g} GB: saving through dsckpt into {tag}")
        state = make_state(nbytes_want, a.seed)
        nbytes = sum(t.numel() * 4 for t in state.values())
        if self.d.proc is None or self.d.cache_gib != a.hot_cache_gib:
            self.d.restart(a.hot_cache_gib)
        hot_ok = nbytes * 1.1 + min(2 * GIB, self.d.cache_gib * GIB / 4) <= \
            self.d.cache_gib * GIB
        conn = dsckpt.Connection(self.d.sock, job=job, rank=0, world_size=1)
        dt.set_default_connection(conn)
        t = time.perf_counter()
        dt.save(state, tag, conn=conn)
        dt.commit(tag, conn=conn, timeout=900)
        save_s = time.perf_counter() - t
        self.res.add(size, "dsckpt save+commit", "disk", gbps=nbytes / save_s / 1e9, secs=save_s,
                     bytes=nbytes, note=f"{len(state)} tensors")
        log(f"  {len(state)} tensors, {nbytes / 1e9:.2f} GB, saved and committed in "
            f"{save_s:.1f} s ({nbytes / save_s / 1e9:.2f} GB/s)")
        path = os.path.join(tag, "rank0.safetensors")
        dst = {k: torch.empty_like(v) for k, v in state.items()}
        has_into = hasattr(dt, "load_into")

        def raw(want):
            if self.raw.why:
                return self.raw.why
            return lambda: self.raw.load(conn._handle(), d_tag[0], "rank0", dst, want)

        def into():
            if not has_into:
                return "dsckpt.torch has no load_into"
            return lambda: dt.load_into(dst, d_tag[0], conn=conn)

        def zero_dst():
            for v in dst.values():
                v.zero_()
            return None

        d_tag = [tag]
        check_dst = (lambda out: same(dst, state))
        check_out = (lambda out: same(out, state))
        # load_into says how it loaded: the file read here when the daemon declined, which is
        # not what this row measures.
        check_into = (lambda out: same(dst, state) or (
            None if out == "daemon" else f"load_into read the file itself ({out!r}), the "
            "daemon did not serve it"))
        dsk = [("dsckpt C API", raw, check_dst), ("dsckpt load_into", lambda w: into(),
                                                  check_into),
               ("dsckpt load", lambda w: (lambda: dt.load(d_tag[0], map_location=DEV)),
                check_out)]

        # hot: the daemon still holds what it just committed
        for name, mk, chk in dsk:
            self.cell(size, name, "hot", mk("cache") if hot_ok else
                      f"{nbytes / 1e9:.1f} GB does not fit the {self.d.cache_gib} GiB cache",
                      nbytes, chk, before=zero_dst)

        # files: a restarted daemon; first warm (page cache), then tmpfs, then cold
        conn.close()
        self.d.restart(a.file_cache_gib)
        conn = dsckpt.Connection(self.d.sock, job=job, rank=0, world_size=1)
        dt.set_default_connection(conn)
        warm_files([path])
        if DEV == "cuda":
            gpu_buf, host = torch.empty(nbytes, dtype=torch.uint8, device=DEV), pinned[:nbytes]
            self.cell(size, "bound: H2D", "any", lambda: gpu_buf.copy_(host, non_blocking=True),
                      nbytes)
            del gpu_buf, host
        for name, mk, chk in dsk:
            self.cell(size, name, "warm", mk("file"), nbytes, chk, before=zero_dst)
        if not a.quick:
            self.cell(size, "safetensors", "warm", st_fn(path), nbytes, check_out)
            self.cell(size, "fastsafetensors", "warm", self.fst_fn(path) or self.fst_why,
                      nbytes, check_out)
        self.cell(size, "bound: preadv", "warm", lambda: preadv_into(path, pinned), nbytes)
        if not a.quick:
            self.cell(size, "bound: dd direct", "warm", lambda: dd_direct(path), nbytes, reps=1)

        # tmpfs: the tag copied to /dev/shm
        shm_tag = os.path.join(a.shm_root, job, "t1")
        if free_bytes(a.shm_root) < dir_size(tag) + 2 * GIB or \
                nbytes + a.file_cache_gib * GIB + pinned.numel() + 16 * GIB > mem_total_gib() * GIB:
            why = f"no room for {nbytes / 1e9:.1f} GB in {a.shm_root} beside the rest"
            for name in [n for n, _, _ in dsk] + ["safetensors", "fastsafetensors",
                                                  "bound: preadv"]:
                self.cell(size, name, "tmpfs", why, nbytes)
        else:
            shutil.copytree(tag, shm_tag)
            shm_path = os.path.join(shm_tag, "rank0.safetensors")
            d_tag[0] = shm_tag
            for name, mk, chk in dsk:
                self.cell(size, name, "tmpfs", mk("file"), nbytes, chk, before=zero_dst)
            d_tag[0] = tag
            if not a.quick:
                self.cell(size, "safetensors", "tmpfs", st_fn(shm_path), nbytes, check_out)
                self.cell(size, "fastsafetensors", "tmpfs",
                          self.fst_fn(shm_path) or self.fst_why, nbytes, check_out)
            self.cell(size, "bound: preadv", "tmpfs", lambda: preadv_into(shm_path, pinned),
                      nbytes)
            shutil.rmtree(os.path.join(a.shm_root, job), ignore_errors=True)

        # cold: the page cache dropped before each run
        def cold():
            zero_dst()
            return drop_caches()
        for name, mk, chk in dsk:
            self.cell(size, name, "cold", mk("file"), nbytes, chk, reps=1, before=cold)
        if a.quick:
            self.cell(size, "bound: preadv", "cold", lambda: preadv_into(path, pinned), nbytes,
                      reps=1, before=drop_caches)
            conn.close()
            dt.set_default_connection(None)
            shutil.rmtree(os.path.join(a.disk_root, job), ignore_errors=True)
            del state, dst
            empty_cache()
            return
        self.cell(size, "safetensors", "cold", st_fn(path), nbytes, check_out, reps=1,
                  before=drop_caches)
        self.cell(size, "fastsafetensors", "cold", self.fst_fn(path) or self.fst_why, nbytes,
                  check_out, reps=1, before=drop_caches)
        self.cell(size, "bound: preadv", "cold", lambda: preadv_into(path, pinned), nbytes,
                  reps=1, before=drop_caches)
        self.cell(size, "bound: dd direct", "cold", lambda: dd_direct(path), nbytes, reps=1,
                  before=drop_caches)

        # baselines from copies of their own, one at a time
        self.copy_baseline(size, "torch.load", state, nbytes, os.path.join(a.disk_root, "pt"),
                           lambda p: torch.save(state, p),
                           lambda p: (lambda: torch.load(p, map_location=DEV,
                                                         weights_only=True)),
                           check_out, file=f"{job}.pt")
        dcp_dst = {k: torch.empty_like(v) for k, v in state.items()}
        try:
            import torch.distributed.checkpoint as dcp
            self.copy_baseline(size, "DCP load", state, nbytes,
                               os.path.join(a.disk_root, "dcp", job),
                               lambda p: dcp.save(state, checkpoint_id=p),
                               lambda p: (lambda: dcp.load(dcp_dst, checkpoint_id=p)),
                               lambda out: same(dcp_dst, state),
                               before=lambda: [v.zero_() for v in dcp_dst.values()] and None)
        except ImportError as e:
            for c in ("warm", "cold"):
                self.cell(size, "DCP load", c, f"no torch.distributed.checkpoint: {e}", nbytes)
        del dcp_dst
        conn.close()
        dt.set_default_connection(None)
        shutil.rmtree(os.path.join(a.disk_root, job), ignore_errors=True)
        del state, dst
        empty_cache()

    def copy_baseline(self, size, method, state, nbytes, where, save, mk, check, file=None,
                      before=None):
        """Saves a copy with save(path) (path: where/file, or the directory where) if the disk
        has room, times mk(path)() warm and cold (before(): before each run), removes where."""
        os.makedirs(where, exist_ok=True)
        path = os.path.join(where, file) if file else where
        if free_bytes(self.a.disk_root) < nbytes * 1.05 + 2 * GIB:
            why = f"no room on {self.a.disk_root} for a {nbytes / 1e9:.1f} GB copy"
            for c in ("warm", "cold"):
                self.cell(size, method, c, why, nbytes)
            return
        if self.a.no_copies or self.left() < 60:
            why = "skipped (--no-copies)" if self.a.no_copies else "out of time (--budget)"
            for c in ("warm", "cold"):
                self.cell(size, method, c, why, nbytes)
            return
        t = time.perf_counter()
        try:
            save(path)
            os.sync()
        except Exception as e:
            for c in ("warm", "cold"):
                self.cell(size, method, c, f"saving the copy failed: {e}", nbytes)
            shutil.rmtree(where, ignore_errors=True)
            return
        log(f"  {method}: copy saved in {time.perf_counter() - t:.1f} s")
        warm_files([path])
        self.cell(size, method, "warm", mk(path), nbytes, check, before=before)
        self.cell(size, method, "cold", mk(path), nbytes, check, reps=1,
                  before=lambda: (before and before()) or drop_caches())
        shutil.rmtree(where, ignore_errors=True)

    def fst_fn(self, path):
        """fastsafetensors' load of path onto cuda:0, or None when it is not available."""
        if self.fst is None:
            return None
        fst = self.fst

        def run():
            with fst.fastsafe_open(filenames=[path], nogds=True, device=f"{DEV}:0"
                                   if DEV == "cuda" else DEV) as f:
                return {k: f.get_tensor(k) for k in f.keys()}
        return run


ST_WHY = []  # why safetensors cannot be used, if it cannot


def st_fn(path):
    """safetensors' load_file of path onto the device, or why it cannot run."""
    if ST_WHY:
        return ST_WHY[0]

    def run():
        from safetensors.torch import load_file
        return load_file(path, device=DEV)
    return run


# ---------------------------------------------------------------------------------------
# Part 2: a restarted bench-train process to its first restored step


def child_cfg(a, iters):
    """bench_train's configuration for the preset, as its command line would make it."""
    import bench_train
    return bench_train.parse_args(["--socket", a.socket, "--dir", a.dir, "--preset",
                                   a.train_preset, "--iters", str(iters)])


def child_setup():
    """What bench_train.main sets before training (determinism)."""
    import torch
    torch.use_deterministic_algorithms(True, warn_only=True)
    det = getattr(torch.utils, "deterministic", None)
    if det is not None and hasattr(det, "fill_uninitialized_memory"):
        det.fill_uninitialized_memory = False
    if DEV != "cuda":
        return torch.device(DEV)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    return dev


def child_train(a):
    """Child: the uninterrupted run; saves and commits after step --start; every loss."""
    import bench_train  # sets CUBLAS_WORKSPACE_CONFIG before torch comes in
    import dsckpt
    import dsckpt.torch as dt
    dev = child_setup()
    cfg = child_cfg(a, a.start + bench_train.RESUME_ITERS)
    tr = bench_train.Trainer(cfg, dev)
    batches = bench_train.make_batches(cfg, dev)
    conn = dsckpt.Connection(a.socket, job=os.path.basename(os.path.dirname(a.tag)), rank=0,
                             world_size=1)
    losses, save_s = {}, None
    for it in range(1, cfg.iters + 1):
        loss = tr.forward_backward(batches[it - 1])
        tr.opt.step()
        losses[it] = loss.item()
        if it == a.start:
            t = time.perf_counter()
            h = dt.save(tr.state(), a.tag, conn=conn, file="rank0")
            h.wait_snapshot(timeout=600)
            dt.commit(a.tag, conn=conn, timeout=900)
            save_s = time.perf_counter() - t
    conn.close()
    json.dump({"losses": losses, "save_s": save_s, "state_bytes":
               bench_train.state_bytes(tr.state())}, sys.stdout)


def child_resume(a):
    """Child: a restarted trainer; T_START (the first line) to its first restored step."""
    import bench_train
    import torch
    t_import = time.time()
    import dsckpt
    import dsckpt.torch as dt
    dev = child_setup()
    cfg = child_cfg(a, a.start + bench_train.RESUME_ITERS)
    if a.how == "materialize":  # built on the meta device: no weight allocated nor initialised
        tr = bench_train.Trainer.__new__(bench_train.Trainer)
        tr.dev, tr.cfg = dev, cfg
        tr.model = bench_train.GPT(cfg.vocab, cfg.seq, cfg.d_model, cfg.layers, cfg.heads,
                                   torch.device("meta"))
        tr.model.mask = torch.ones(cfg.seq, cfg.seq, dtype=torch.bool, device=dev).triu(1)
        tr.opt = torch.optim.AdamW(tr.model.parameters(), lr=cfg.lr, weight_decay=0.1)
    else:
        tr = bench_train.Trainer(cfg, dev)
    batches = bench_train.make_batches(cfg, dev)
    sync()
    t_model = time.time()
    conn = dsckpt.Connection(a.socket, job=os.path.basename(os.path.dirname(a.tag)), rank=0,
                             world_size=1)
    dt.set_default_connection(conn)
    how = a.how
    if a.how == "load":
        # One device for every tensor, so that the daemon fills them (the optimizer's CPU
        # step counters become CUDA scalars, which AdamW takes as they are).
        state = dt.load(a.tag, "rank0", map_location=DEV)
        tr.model.load_state_dict(state["model"])
        tr.opt.load_state_dict(state["optim"])
        del state
    elif a.how == "materialize":
        if not hasattr(dt, "materialize"):
            print("SKIP: dsckpt.torch has no materialize", file=sys.stderr)
            sys.exit(77)
        got = dt.materialize(tr.model, tr.opt, a.tag, "rank0", device=dev, conn=conn,
                             optimizer_key="optim")
        how = f"materialize ({got.how})"
    else:
        if not hasattr(dt, "load_into"):
            print("SKIP: dsckpt.torch has no load_into", file=sys.stderr)
            sys.exit(77)
        # In place: the optimizer's state must exist first (one step on zero gradients; every
        # byte it changes is overwritten by the load).
        for p in tr.model.parameters():
            p.grad = torch.zeros_like(p)
        tr.opt.step()
        tr.opt.zero_grad(set_to_none=True)
        how = f"load_into ({dt.load_into(tr.state(), a.tag, 'rank0', conn=conn)})"
    sync()
    t_restored = time.time()
    losses = {}
    for i, it in enumerate(range(a.start + 1, a.start + bench_train.RESUME_ITERS + 1)):
        loss = tr.forward_backward(batches[it - 1])
        tr.opt.step()
        losses[it] = loss.item()
        if i == 0:
            t_step = time.time()
    conn.close()
    json.dump({"t_start": T_START, "t_import": t_import, "t_model": t_model,
               "t_restored": t_restored, "t_step": t_step, "losses": losses, "how": how},
              sys.stdout)


class Skip(Exception):
    """A child that cannot run here (exit status 77), and why."""


def run_child(args, timeout):
    """Runs this script as a child; its JSON (stdout's last line) and the spawn time."""
    t = time.time()
    r = subprocess.run([sys.executable, os.path.abspath(__file__), *args], capture_output=True,
                       text=True, timeout=timeout)
    if r.returncode == 77:
        raise Skip((r.stderr.strip().splitlines() or ["?"])[-1].replace("SKIP: ", ""))
    if r.returncode != 0:
        raise RuntimeError(f"child {args[0]} exited {r.returncode}: "
                           + (r.stderr.strip().splitlines() or ["?"])[-1][:300])
    return json.loads(r.stdout.strip().splitlines()[-1]), t


def part_train(b):
    """Part 2 (see the top)."""
    a, d, res = b.a, b.d, b.res
    tag = os.path.join(a.disk_root, "resume", f"step{a.start}")
    common = ["--socket", d.sock, "--dir", a.disk_root, "--tag", tag, "--train-preset",
              a.train_preset, "--start", str(a.start)] + (["--smoke"] if a.smoke else [])
    out = {"preset": a.train_preset, "start": a.start, "runs": []}
    res.train = out
    if b.left() < 120:
        out["skipped"] = "out of time (--budget)"
        return
    log(f"== restarted trainer: preset {a.train_preset}, checkpoint after step {a.start}")
    d.restart(a.hot_cache_gib)
    ref, _ = run_child(["train-child", *common], timeout=max(60, b.left()))
    ref_losses = {int(k): v for k, v in ref["losses"].items()}
    out.update(state_bytes=ref["state_bytes"], save_s=ref["save_s"], reference=ref_losses)
    log(f"  uninterrupted run: {ref['state_bytes'] / 1e9:.2f} GB of state saved after step "
        f"{a.start}; losses {ref_losses}")
    plan = [("hot", "load", None), ("hot", "load_into", None), ("hot", "materialize", None),
            ("warm", "load", "restart"), ("warm", "load_into", None),
            ("warm", "materialize", None), ("cold", "load", "cold"),
            ("cold", "load_into", "cold"), ("cold", "materialize", "cold")]
    for source, how, prep in plan:
        if b.left() < 60:
            out["runs"].append({"source": source, "how": how, "skipped": "out of time"})
            continue
        note = None
        if prep == "restart":
            d.restart(a.file_cache_gib)
            warm_files([tag])
        elif prep == "cold":
            d.restart(a.file_cache_gib)
            note = drop_caches()
            if note:
                out["runs"].append({"source": source, "how": how, "skipped": note})
                continue
        try:
            got, spawned = run_child(["resume-child", *common, "--how", how],
                                     timeout=max(60, b.left()))
        except Skip as e:
            out["runs"].append({"source": source, "how": how, "skipped": str(e)})
            log(f"  {source:5s} {how:9s} skipped: {e}")
            continue
        except Exception as e:
            out["runs"].append({"source": source, "how": how, "error": str(e)})
            res.failures.append(f"resume {source} {how}: {e}")
            log(f"  {source:5s} {how:9s} FAILED: {e}")
            continue
        losses = {int(k): v for k, v in got["losses"].items()}
        diffs = {it: abs(v - ref_losses[it]) / max(abs(ref_losses[it]), 1e-30)
                 for it, v in losses.items()}
        ok = all(v == ref_losses[it] or diffs[it] <= 1e-6 for it, v in losses.items())
        if not ok:
            res.failures.append(f"resume {source} {how}: losses {losses} != {ref_losses}")
        row = {"source": source, "how": how, "loaded_by": got.get("how"),
               "to_first_step_s": got["t_step"] - spawned,
               "exec_to_python_s": got["t_start"] - spawned,
               "imports_s": got["t_import"] - got["t_start"],
               "model_s": got["t_model"] - got["t_import"],
               "restore_s": got["t_restored"] - got["t_model"],
               "first_step_s": got["t_step"] - got["t_restored"],
               "restore_gbps": ref["state_bytes"] / (got["t_restored"] - got["t_model"]) / 1e9,
               "losses": losses, "rel_diff": diffs, "losses_equal": ok}
        out["runs"].append(row)
        log(f"  {source:5s} {how:9s} first restored step {row['to_first_step_s']:.2f} s after "
            f"the start (restore {row['restore_s']:.2f} s, {row['restore_gbps']:.1f} GB/s); "
            f"losses {'equal' if ok else 'DIFFER'}")
    shutil.rmtree(os.path.dirname(tag), ignore_errors=True)


# ---------------------------------------------------------------------------------------
# Output


def table(res, sizes, drop_note):
    lines = []
    for gb in sizes:
        cells = [c for c in res.cells if c["size_gb"] == gb]
        if not cells:
            continue
        lines.append(f"\n== restore onto the GPU, {gb:g} GB checkpoint (GB/s; GB = 1e9 B)"
                     + (f"; cold: {drop_note}" if drop_note else ""))
        lines.append(f"{'':20s}" + "".join(f"{c:>10s}" for c in COLUMNS + ("any",)))
        methods = []
        for c in cells:
            if c["method"] not in methods and c["column"] != "disk":
                methods.append(c["method"])
        notes = []
        for m in methods:
            row = f"{m:20s}"
            for col in COLUMNS + ("any",):
                c = next((x for x in cells if x["method"] == m and x["column"] == col), None)
                if c is None:
                    row += f"{'':>10s}"
                elif c.get("gbps") is not None and not (c.get("note") or "").startswith(
                        ("WRONG", "FAILED")):
                    row += f"{c['gbps']:10.2f}"
                else:
                    notes.append(f"  [{len(notes) + 1}] {m}, {col}: {c.get('note')}")
                    row += f"{'[' + str(len(notes)) + ']':>10s}"
            lines.append(row)
        save = next((c for c in cells if c["column"] == "disk"), None)
        if save:
            lines.append(f"(saved through dsckpt and committed at {save['gbps']:.2f} GB/s, "
                         f"{save['note']})")
        lines += notes
    t = getattr(res, "train", None)
    if t:
        lines.append(f"\n== restarted bench-train process (preset {t['preset']}, "
                     f"{(t.get('state_bytes') or 0) / 1e9:.1f} GB of state): start to the end of "
                     "its first restored step")
        if t.get("skipped"):
            lines.append(f"  skipped: {t['skipped']}")
        lines.append(f"{'source':8s}{'restore':24s}{'to step s':>10s}{'model s':>9s}"
                     f"{'restore s':>10s}{'GB/s':>7s}  next losses")
        for r in t["runs"]:
            if "to_first_step_s" in r:
                lines.append(f"{r['source']:8s}{(r.get('loaded_by') or r['how'])[:23]:24s}"
                             f"{r['to_first_step_s']:10.2f}{r['model_s']:9.2f}"
                             f"{r['restore_s']:10.2f}{r['restore_gbps']:7.1f}  "
                             + ("equal to the uninterrupted run's" if r["losses_equal"]
                                else "DIFFER: " + str(r["losses"])))
            else:
                lines.append(f"{r['source']:8s}{r['how']:24s}  "
                             + (r.get("skipped") or "FAILED: " + r.get("error", "?"))[:100])
    return "\n".join(lines)


def write_results(a, res, info):
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dirs = [a.results] + ([os.environ["OUT"]] if os.path.isdir(os.environ.get("OUT", "")) else [])
    for d in dirs:
        os.makedirs(d, exist_ok=True)
        base = os.path.join(d, f"bench-restore-{stamp}")
        with open(base + ".json", "w") as f:
            json.dump(dict(info, cells=res.cells, train=getattr(res, "train", None),
                           failures=res.failures), f, indent=1, default=str)
        with open(base + ".csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["size_gb", "method", "column", "gbps", "median_s", "runs_s", "ok",
                        "note"])
            for c in res.cells:
                w.writerow([c["size_gb"], c["method"], c["column"],
                            f"{c['gbps']:.3f}" if c.get("gbps") else "",
                            f"{c['secs']:.4f}" if c.get("secs") else "",
                            " ".join(f"{x:.4f}" for x in c.get("runs") or []),
                            c.get("ok"), c.get("note") or ""])
        log(f"results: {base}.json, {base}.csv")


# ---------------------------------------------------------------------------------------


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", nargs="?", default="bench",
                   choices=["bench", "train-child", "resume-child"])
    p.add_argument("--bundle", default=os.path.join(HERE, "..", "..", "build", "gpu"))
    p.add_argument("--disk", help="a directory on local disk for the checkpoints (default: "
                   "the first of /var/tmp, /tmp, the repository that is not tmpfs)")
    p.add_argument("--shm", default="/dev/shm")
    p.add_argument("--sizes", default="8,20", help="checkpoint sizes in GB, comma-separated")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--daemon-config", default="{}",
                   help="more dsckptd configuration keys, a JSON object (e.g. restore_threads)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--budget", type=float, default=540.0, help="seconds for everything")
    p.add_argument("--hot-cache-gib", type=float)
    p.add_argument("--file-cache-gib", type=float, default=8.0)
    p.add_argument("--train", dest="train", action="store_true", default=True)
    p.add_argument("--no-train", dest="train", action="store_false")
    p.add_argument("--quick", action="store_true",
                   help="dsckpt's rows and the bounds only (no safetensors, fastsafetensors, "
                        "torch.load or DCP baselines)")
    p.add_argument("--no-copies", action="store_true",
                   help="no torch.load or DCP baselines (they need copies of their own: a 20 GB "
                        "run with every baseline does not fit one 10-minute device call)")
    p.add_argument("--copies-only", action="store_true",
                   help="only the torch.load and DCP baselines (the other half of a run split "
                        "by --no-copies)")
    p.add_argument("--train-preset", default="checkpoint-every-16")
    p.add_argument("--start", type=int, default=2, help="the step the checkpoint follows")
    p.add_argument("--results", default=os.path.join(HERE, "results"))
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes on the CPU (host memory, bench-train's smoke preset): the "
                   "paths end to end without a GPU; no number means anything")
    # the children's
    p.add_argument("--socket")
    p.add_argument("--dir")
    p.add_argument("--tag")
    p.add_argument("--how", choices=["load", "load_into", "materialize"], default="load")
    a = p.parse_args(argv)
    if a.no_copies and a.copies_only:
        p.error("--no-copies and --copies-only exclude each other")
    return a


def pick_disk():
    repo = os.path.abspath(os.path.join(HERE, "..", ".."))
    for d in ("/var/tmp", "/tmp", repo):
        if os.path.isdir(d) and os.access(d, os.W_OK) and fs_type(d) not in ("tmpfs", "ramfs"):
            return d
    return "/var/tmp"


def main(argv):
    global DEV
    a = parse(argv)
    if a.smoke:
        DEV = "cpu"
    if a.mode == "train-child":
        return child_train(a)
    if a.mode == "resume-child":
        return child_resume(a)
    try:
        import torch
    except ImportError as e:
        log(f"SKIP: {e}")
        return 77
    try:
        import safetensors.torch  # noqa: F401
    except ImportError as e:
        ST_WHY.append(f"no safetensors: {e}")
    if a.smoke:
        a.sizes = a.sizes if a.sizes != "8,20" else "0.2"
        a.hot_cache_gib = a.hot_cache_gib or 1
        a.file_cache_gib, a.reps = 0.5, 1
        a.train_preset = "smoke" if a.train_preset == "checkpoint-every-16" else a.train_preset
    elif not torch.cuda.is_available():
        log("SKIP: no CUDA device")
        return 77
    import dsckpt
    from dsckpt._files import DTYPES
    dsckpt._lib.lib()  # loads it: its path is known from here on
    ST_NAMES.update({k: v.encode() for k, v in DTYPES.items()})
    a.bundle = os.path.abspath(a.bundle)
    ram = mem_total_gib()
    if a.hot_cache_gib is None:
        a.hot_cache_gib = 48 if ram >= 120 else max(1, int(ram * 0.4))
    sizes = [float(s) for s in a.sizes.split(",") if s.strip()]
    scratch_base = a.disk or pick_disk()
    scratch = os.path.join(scratch_base, f"dsckpt-restore.{os.getpid()}")
    a.disk_root = os.path.join(scratch, "ckpt")
    a.shm_root = os.path.join(a.shm, f"dsckpt-restore.{os.getpid()}")
    os.makedirs(a.disk_root)
    os.makedirs(a.shm_root)
    # SIGTERM (run-bench-restore's timeout) unwinds too: the daemon is stopped, the scratch
    # directories removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return bench(a, sizes, scratch, ram)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(a.shm_root, ignore_errors=True)


def bench(a, sizes, scratch, ram):
    """Parts 1 and 2 in the scratch directories main made; the exit status."""
    import torch
    import dsckpt
    info = {"torch": torch.__version__,
            "device": torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu (--smoke)",
            "ram_gib": ram, "hot_cache_gib": a.hot_cache_gib,
            "file_cache_gib": a.file_cache_gib, "disk": scratch, "disk_fs": fs_type(scratch),
            "disk_free_gb": free_bytes(scratch) / 1e9, "shm": a.shm_root,
            "dsckpt_lib": dsckpt._lib.path, "args": vars(a), "utc": time.strftime(
                "%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    log(f"bench-restore: torch {torch.__version__} on {info['device']}; {ram:.0f} GiB RAM; "
        f"checkpoints in {scratch} ({info['disk_fs']}, {info['disk_free_gb']:.0f} GB free); "
        f"hot cache {a.hot_cache_gib} GiB, file phases {a.file_cache_gib} GiB")
    if info["disk_fs"] in ("tmpfs", "ramfs"):
        log(f"  note: {scratch} is {info['disk_fs']}: warm and cold are not disk numbers")
    d = Daemon(a.bundle, scratch, [a.disk_root, a.shm_root], json.loads(a.daemon_config))
    res = Results()
    b = Bench(a, d, RawLoad(dsckpt._lib.path), res)
    b.fst, b.fst_why = fastsafetensors_import(scratch)
    if b.fst_why:
        log(f"  fastsafetensors: {b.fst_why}")
    drop_note = drop_caches()
    if drop_note:
        log(f"  cold runs impossible: {drop_note}")
    pinned = None
    try:
        d.start(a.hot_cache_gib)
        if sizes:
            pinned = pinned_buffer(int(max(sizes) * 1e9) + 300_000_000)
        for gb in sizes:
            if b.left() < 60:
                res.add(gb, "everything", "hot", note="out of time (--budget)")
                continue
            try:
                b.size(gb, pinned)
            except Exception as e:
                import traceback
                traceback.print_exc()
                res.failures.append(f"{gb:g} GB: {type(e).__name__}: {e}")
        pinned_free(pinned)
        pinned = None
        empty_cache()
        if a.train:
            try:
                part_train(b)
            except Exception as e:
                import traceback
                traceback.print_exc()
                res.failures.append(f"restarted trainer: {type(e).__name__}: {e}")
                res.train = getattr(res, "train", None) or {"preset": a.train_preset,
                                                             "runs": []}
                res.train["skipped"] = f"{type(e).__name__}: {e}"
    finally:
        try:
            d.stop()
        except Exception as e:
            res.failures.append(str(e))
        info["daemon_starts"] = d.starts
        info["wall_s"] = time.monotonic() - b.t0
        write_results(a, res, info)
        if res.failures:
            log("\n".join(["", "failures:"] + [f"  {f}" for f in res.failures]))
            log("dsckptd log (end):\n" + d.log_tail(30))
    log(table(res, sizes, drop_note))
    return 1 if res.failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]) or 0)
