"""dsckpt.torch — PyTorch state dicts saved through dsckptd as plain safetensors files.

``save(state_dict, dir)`` walks nested dicts, lists and tuples and hands every tensor to the
daemon by reference: CUDA tensors by their device pointer (the library exports the
allocation and orders the daemon's copy after the current stream's queued work), CPU
tensors by address (memory from :func:`host_empty` without a copy, any other memory staged
by the library before ``save`` returns). Non-contiguous tensors are made contiguous first.
It returns at once (ACCEPTED) with a :class:`SaveHandle`; call
``handle.wait_snapshot()`` right before the optimizer step changes the tensors, and
``commit(dir)`` on every rank once the checkpoint is complete. The next save of the same
``file`` on the connection, of a state dict with the same structure and tensors (same
containers and keys, pointers, dtypes, shapes, strides: what a training run saves at every
checkpoint), skips the walk: :mod:`dsckpt._handover` proves it unchanged with a few C-level
calls and adds the tensors by a save plan's id; the files are the same.

What is not a tensor — the structure with tensors replaced by slots, dtypes, shapes,
strides, which tensors shared storage or were the same object, and any other Python values
— goes into the blob ``dsckpt.torch`` of ``<file>.meta`` (:mod:`dsckpt._blob`), without
pickle: containers (dict, OrderedDict and its attributes, list, tuple, set), numbers, str,
bytes, None, torch.Size, dtype and device are encoded as a :mod:`dsckpt._tree`. Values of
other types (custom classes, namedtuples, tensors of dtypes the file cannot hold) are
pickled into a section of their own. ``load`` rebuilds an equal state dict: same keys and
containers, dtypes (bf16 included), shapes, values, and the same sharing (one object stays
one object; views of one storage become views of one storage). By default it unpickles
nothing, so loading a checkpoint runs none of its author's code: a checkpoint holding
pickled values (or written before blob version 3, a pickle whole) raises
:class:`dsckpt.PickleRefused` naming the types, unless the caller passes
``weights_only=False`` (as ``torch.load``, whose default is the same since torch 2.6).

In the file each tensor is named by its key path: ``model.layers.0.weight``,
``optimizer.state.0.exp_avg`` (list indices as numbers); a view seen twice is stored once.
Tensors whose dtype safetensors cannot name (complex, quantized, sparse, meta) travel
pickled inside the blob instead. Reading the files themselves is :mod:`dsckpt._files`'s,
naming tensors by key path :mod:`dsckpt._flatten`'s.

``load_into(state_dict, dir)`` restores an existing state dict in place (a model's, an
optimizer's) from the file ``save`` wrote of an equal structure, each tensor found by its key
path. Loads go through the daemon when one answers — it serves a file it still holds in its
host cache without touching the disk, checks every tensor's checksum and writes CUDA
tensors itself — and otherwise read the file here (:mod:`dsckpt._fill`).
"""
from __future__ import annotations

import logging
import os
import threading
import uuid
from collections import defaultdict
from typing import Any, Dict, List, Optional, Tuple

import torch

from . import _blob, _fill, _handover, _remote
from ._files import (DTYPES, ST_DTYPES, read_meta, read_safetensors,
                     read_safetensors_buffer, read_safetensors_to, tensors_of)
from ._fill import StateDictMismatch
from ._flatten import MapLocation, _Flattener, _rebuild_views, _target
from .core import Connection, HostBuffer, Level, Save, SaveProgress
from .errors import DsckptError, Errno, error_for
from .resume import find_latest, tell_nodes

BLOB = _blob.BLOB
FORMAT_VERSION = _blob.VERSION  # the blob written; load reads it, and 1 and 2 when opted in
ALIGN = 64  # bytes between the tensors of one buffer that load allocates

log = logging.getLogger("dsckpt.torch")


# ---------------------------------------------------------------------------------------
# Which connection, rank and job


def dist_rank_world(group=None) -> Tuple[int, int]:
    """This process's rank and the world size: torch.distributed when initialized, else
    $RANK/$WORLD_SIZE, else 0 and 1."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


_default_lock = threading.Lock()
_default_conn: Optional[Connection] = None
_default_ours = False  # _default_conn was made here (not set_default_connection's)
_run: Optional[str] = None  # the run id the ranks agreed on at their first save


def default_connection(dir: Optional[str] = None) -> Connection:
    """The process's shared connection, made on first use: socket $DSCKPT_SOCKET (else the
    system one), job $DSCKPT_JOB (else the name of the directory above the first checkpoint
    directory), rank and world size from :func:`dist_rank_world`."""
    global _default_conn, _default_ours
    with _default_lock:
        if _default_conn is None or _default_conn.closed:
            job = os.environ.get("DSCKPT_JOB")
            if not job and dir:
                job = os.path.basename(os.path.dirname(os.path.normpath(dir)))
            rank, world = dist_rank_world()
            _default_conn = Connection(job=job or "default", rank=rank, world_size=world,
                                       run=_run)
            _default_ours = True
        return _default_conn


def set_default_connection(conn: Optional[Connection]) -> None:
    """Replaces the process's shared connection (None: make a new one on next use)."""
    global _default_conn, _default_ours
    with _default_lock:
        _default_conn, _default_ours = conn, False


def run_connection(dir: str) -> Connection:
    """The shared connection for saving into ``dir``, of one run on every rank. When the
    environment names no run (libdsckpt(3)) and torch.distributed has several ranks, the
    first call agrees on one (rank 0's uuid4, gathered: every rank's first save is then a
    collective, on the main thread) and remakes the connection it made with it; a connection
    given to :func:`set_default_connection` is used as it is. A rank whose connection fails
    takes part in the agreement all the same, then raises its error; the other ranks raise
    one naming that rank (of its class: :class:`dsckpt.DaemonUnavailable` for no daemon)
    instead of waiting for it in the collective."""
    global _default_conn, _run
    dist = torch.distributed
    try:
        conn: Optional[Connection] = default_connection(dir)
        ours, failed = _default_ours, None
    except Exception as e:  # noqa: BLE001 - raised below, once every rank has agreed
        conn, ours, failed = None, True, e
    try:
        if (_run is not None or not ours or _env_run()
                or not (dist.is_available() and dist.is_initialized())
                or dist.get_world_size() < 2
                or threading.current_thread() is not threading.main_thread()):
            if failed is not None:
                raise failed
            return conn
        run = _agree_run(failed)
    finally:
        failed = None  # see _agree_run
    with _default_lock:
        _run = run
        if _default_conn is conn and conn is not None:
            _default_conn = Connection(conn.socket, job=conn.job, rank=conn.rank,
                                       world_size=conn.world_size, run=_run)
        return _default_conn


def _agree_run(failed: Optional[Exception]) -> str:
    """Rank 0's new run id, gathered by every rank (each sends how its connection went);
    raises ``failed`` on the rank it failed on, and on the others the first failed rank's
    error, naming it."""
    dist = torch.distributed
    rank, world = dist.get_rank(), dist.get_world_size()
    if failed is None:
        how = None
    elif isinstance(failed, DsckptError):
        how = (failed.code, failed.name, failed.message)
    else:
        how = (int(Errno.EFAILED), "EFAILED", f"{type(failed).__name__}: {failed}")
    got: List[Any] = [None] * world
    dist.all_gather_object(got, (uuid.uuid4().hex if rank == 0 else None, how))
    if failed is not None:
        try:
            raise failed
        finally:
            # A frame holding the exception it raised is a reference cycle (its traceback
            # holds the frame), freed by the collector on whatever thread runs it next:
            # at interpreter exit, torch aborts the process when that is not the main one.
            failed = None
    for r, (_, other) in enumerate(got):
        if other is not None:
            code, name, message = other
            raise error_for(code, name, f"rank {r} of {world} has no connection to dsckptd, "
                            f"so this save cannot be committed: {message}")
    return got[0][0]


# Where libdsckpt finds a run id in the environment, in its order (conn.c's lib_run_default).
_RUN_VARS = ("DSCKPT_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "PMIX_NAMESPACE",
             "OMPI_MCA_ess_base_jobid")
_RUN_MAX = 128  # bytes of printable ASCII in a run id (PROTO_MAX_RUN)


def _env_run() -> str:
    """The run id libdsckpt takes from the environment ("" for none), read here so that
    every rank decides alike whether to agree on one, whether its connection failed or not:
    the first of _RUN_VARS set, not empty and valid (SLURM's as job.step.restarts,
    TORCHELASTIC_RUN_ID's placeholder "none" skipped)."""
    env = os.environ
    for var in _RUN_VARS:
        v = env.get(var) or ""
        if var == "SLURM_JOB_ID" and v:
            step, count = env.get("SLURM_STEP_ID"), env.get("SLURM_RESTART_COUNT")
            v = f"{v}.{step or 'batch'}.{count or '0'}"
        if var == "TORCHELASTIC_RUN_ID" and v == "none":
            continue
        if v and len(v) <= _RUN_MAX and all(" " <= c <= "~" for c in v):
            return v
    return ""


# ---------------------------------------------------------------------------------------
# Host memory the daemon reads without a copy


def host_empty(shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialised CPU tensor in dsckpt host memory: saving it costs no copy in the
    trainer (keep it unchanged until SNAPSHOT). The memory lives as long as the tensor."""
    shape = tuple(shape)
    nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    buf = HostBuffer(max(nbytes, 1))
    raw = torch.frombuffer(buf.ctypes_array(), dtype=torch.uint8)[:nbytes]
    return raw.view(dtype).reshape(shape)


# ---------------------------------------------------------------------------------------
# Saving (_flatten.py names the tensors)


class SaveHandle:
    """One save of a state dict: wait for its levels, read its progress.

    Until the save reaches SNAPSHOT the handle keeps every tensor whose memory the daemon
    reads by reference (CUDA tensors and contiguous copies) alive; :meth:`wait_snapshot`
    (or any wait reaching SNAPSHOT) lets go of them. ``handover`` says how the tensors were
    handed over: ``"warm"`` (a cached save plan, by id), ``"resent"`` (the plan, sent whole
    again because memory it points into was freed or replaced), ``"cold"`` (walked, a new
    plan) or ``"plain"`` (walked; a structure save plans do not cache).
    """

    def __init__(self, save: Save, keep: List[torch.Tensor], ntensors: int, nbytes: int,
                 handover: str = "plain"):
        self.save = save
        self._keep: Optional[List[torch.Tensor]] = keep
        self.ntensors = ntensors
        self.nbytes = nbytes
        self.handover = handover

    @property
    def dir(self) -> str:
        """The checkpoint directory."""
        return self.save.dir

    @property
    def path(self) -> str:
        """The tensor file written."""
        return self.save.path

    @property
    def level(self) -> Level:
        """The last level seen (wait/progress update it)."""
        return self.save.level

    def wait(self, level: Level = Level.DURABLE, timeout: Optional[float] = None) -> Level:
        """Waits for ``level``; raises SaveFailed (reason from the daemon) or DsckptTimeout."""
        try:
            reached = self.save.wait(level, timeout)
        except DsckptError as e:
            if e.code == Errno.EFAILED:
                self._keep = None  # terminal: the daemon reads nothing more
            raise
        if reached >= Level.SNAPSHOT:
            self._keep = None
        return reached

    def wait_snapshot(self, timeout: Optional[float] = None) -> Level:
        """Waits until every byte is in the daemon: call it right before optimizer.step()."""
        return self.wait(Level.SNAPSHOT, timeout)

    def wait_durable(self, timeout: Optional[float] = None) -> Level:
        """Waits until the file is written, fsynced and renamed into place."""
        return self.wait(Level.DURABLE, timeout)

    def wait_remote(self, timeout: Optional[float] = None) -> Level:
        """Waits until the committed tag, its manifest and the job's ``latest`` are in the
        root's remote tier (REMOTE); raises DsckptError (ENOTSUP) at once when the root has
        no remote tier, DsckptTimeout while the remote is down, and CheckpointIncomplete
        (EINCOMPLETE), its message naming the newer version, at once when this version was
        skipped: the tag was committed again while an earlier version's upload was in
        flight and again before this version's upload started (only the newest goes up
        next; a version whose upload is in flight goes on to REMOTE), or when it was
        deleted with its tag before its upload ended."""
        return self.wait(Level.REMOTE, timeout)

    def wait_replicated(self, timeout: Optional[float] = None) -> Level:
        """Waits until this node's files of the committed tag are held by ``replicas`` other
        nodes' daemons, each having checked them (REPLICATED; after REMOTE where the root has a
        remote tier). Raises DsckptError (ENOTSUP) at once when the node's daemon has peer
        copies off, and CheckpointIncomplete (EINCOMPLETE), its message naming how many peers
        hold a copy, once every node of the job was tried and fewer took one."""
        return self.wait(Level.REPLICATED, timeout)

    def progress(self) -> SaveProgress:
        """Level and byte counters now, without waiting."""
        p = self.save.progress()
        if p.level >= Level.SNAPSHOT or p.level == Level.FAILED:
            self._keep = None
        return p

    def __repr__(self) -> str:
        return f"<dsckpt.torch.SaveHandle {self.path} {self.ntensors} tensors {self.level.name}>"


class _Pending:
    """A connection's saves not yet known DURABLE, by checkpoint directory (thread-safe)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by_dir: Dict[str, List[SaveHandle]] = {}

    def add(self, handle: SaveHandle) -> None:
        """Remembers a save; drops those of its directory already known DURABLE."""
        key = os.path.normpath(handle.dir)
        with self.lock:
            kept = [h for h in self.by_dir.get(key, []) if h.level < Level.DURABLE]
            self.by_dir[key] = kept + [handle]

    def take(self, dir: str) -> List[SaveHandle]:
        """Removes and returns the saves into dir."""
        with self.lock:
            return self.by_dir.pop(os.path.normpath(dir), [])


def _pending(conn: Connection) -> _Pending:
    """The pending-save registry kept on a connection (made on first use)."""
    with _default_lock:
        if not hasattr(conn, "_torch_pending"):
            conn._torch_pending = _Pending()
        return conn._torch_pending


def save(state_dict: Any, path_dir: str, *, conn: Optional[Connection] = None,
         file: Optional[str] = None, stream=None, track: bool = True) -> SaveHandle:
    """Hands ``state_dict`` to the daemon as ``path_dir/<file>.safetensors`` (+ ``.meta``)
    and returns once it is ACCEPTED.

    ``file`` defaults to ``rank{rank}``; ``conn`` to :func:`default_connection`. ``stream``
    is the CUDA stream whose queued work produces the tensors (default: the current stream
    of the first CUDA tensor's device); the daemon's copies are ordered after it.
    ``track=False`` leaves the save out of what :func:`commit` waits for (for callers that
    wait for their saves themselves). A save of the same ``file`` and structure as the
    connection's last one is handed over by a cached save plan (``handle.handover``).
    """
    conn = conn or run_connection(path_dir)
    file = file if file is not None else f"rank{conn.rank}"
    handed = _handover.hand_over(conn, state_dict, path_dir, file)
    s = handed.save
    try:
        if stream is None and handed.device is not None:
            stream = torch.cuda.current_stream(handed.device)
        if stream is not None:
            s.set_stream(getattr(stream, "cuda_stream", stream))
        s.end()
    except BaseException:
        s.close()
        raise
    handle = SaveHandle(s, handed.keep, handed.ntensors, handed.nbytes, handed.how)
    if track:
        _pending(conn).add(handle)
    return handle


def release_gpu(conn: Optional[Connection] = None) -> None:
    """Lets the daemon let go of the GPU memory saves handed it (see Connection.release_gpu);
    call it before torch.cuda.empty_cache(). Without ``conn``: the process's shared
    connection, if it was made."""
    conn = conn or _default_conn
    if conn is not None and not conn.closed:
        conn.release_gpu()


# ---------------------------------------------------------------------------------------
# Committing across ranks


def _collective_min(value: int, group) -> int:
    """The minimum of value over the group (value itself without torch.distributed)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return value
    device = "cpu"
    if dist.get_backend(group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    return int(t.item())


def commit(dir: str, group=None, *, conn: Optional[Connection] = None,
           timeout: Optional[float] = None) -> None:
    """Commits checkpoint directory ``dir`` for the whole job; call it on every rank.

    Each rank first seals ``dir`` (this version is whole): from then on the daemons
    commit the tag by themselves once every rank's files are DURABLE, even if the trainers
    die. Then each rank waits until its own saves into ``dir`` are DURABLE; the ranks agree
    through ``group`` (an all-reduce of a success flag, so a failure anywhere fails everywhere);
    then rank 0 of the group asks its daemon to write MANIFEST.json and point ``latest`` at
    the tag, and every rank learns the outcome. Every rank of the job must have saved at
    least one file into ``dir`` (``save({}, dir)`` for a rank with nothing to save).
    Raises SaveFailed, CheckpointIncomplete or another DsckptError on every rank.
    """
    conn = conn or default_connection(dir)
    error: Optional[DsckptError] = None
    handles = _pending(conn).take(dir)
    try:
        if handles:  # a rank that saved nothing there has nothing to seal (nor a record)
            conn.seal(dir)
    except DsckptError as e:
        error = e
    for handle in handles:
        try:
            handle.wait_durable(timeout)
        except DsckptError as e:
            error = error or e
    ok = _collective_min(0 if error is not None else 1, group)
    if error is not None:
        try:
            raise error
        finally:
            error = None  # see _agree_run
    if not ok:
        raise error_for(Errno.EFAILED, "EFAILED",
                        f"a save into {dir} failed on another rank; not committed")
    rank, _ = dist_rank_world(group)
    code = 0
    if rank == 0:
        try:
            conn.commit(dir, timeout)
        except DsckptError as e:
            error, code = e, e.code
    code = _collective_min(code, group)
    if error is not None:
        try:
            raise error
        finally:
            error = None  # see _agree_run
    if code < 0:
        name = Errno(code).name if code in Errno._value2member_map_ else str(code)
        raise error_for(code, name, f"commit of {dir} failed on rank 0")


# ---------------------------------------------------------------------------------------
# Loading


def _daemon(conn: Optional[Connection], path_dir: str) -> Optional[Connection]:
    """conn, else the process's shared connection when a daemon answers; None when none
    does (the file is read here then)."""
    if conn is not None:
        return conn
    try:
        return default_connection(path_dir)
    except DsckptError as e:
        log.info("dsckpt: no daemon for loading %s (the file is read here): %s", path_dir, e)
        return None


def load_into(state_dict: Any, path_dir: str, file: Optional[str] = None, *,
              conn: Optional[Connection] = None, strict: bool = True) -> str:
    """Restores the tensors of ``state_dict`` in place from ``path_dir/<file>`` (default
    ``rank{rank}``), a file :func:`save` wrote of a state dict of the same structure: each
    tensor is found by its key path (nested dicts, lists and tuples, as ``save`` names them).

    Through the daemon when one answers (``conn``, else :func:`default_connection`): from its
    host cache when it still holds the file, checksums checked, CUDA tensors written by the
    daemon after the work queued on their device's current stream. Otherwise, or when the
    daemon cannot serve the file (outside its roots, say), the file is read here.
    Non-contiguous tensors are filled through a contiguous copy; broadcast views are refused.

    ``strict``: every tensor of ``state_dict`` must be in the file and every tensor of the
    file in ``state_dict``; a dtype or shape other than the file's always fails. Either
    raises :class:`StateDictMismatch` (a KeyError) naming them before anything is written.
    Returns how it loaded: ``"daemon"`` or ``"file"``.
    """
    if file is None:
        file = f"rank{dist_rank_world()[0]}"
    flat = _Flattener()
    flat.walk(state_dict, "")
    if flat.pickled and strict:  # tensors save keeps in the blob, not the file
        raise StateDictMismatch(os.path.join(path_dir, file + ".safetensors"),
                                flat.pickled, [], [])
    dests: Dict[str, torch.Tensor] = {}
    for view, data, orig in zip(flat.views, flat.payload, flat.originals):
        if data is not orig and any(st == 0 and n > 1 for n, st in zip(orig.shape,
                                                                       orig.stride())):
            raise error_for(Errno.EINVAL, "EINVAL", f"{view['name']} is a broadcast view: "
                            "several of its elements share memory")
        dests[view["name"]] = data
    daemon = _daemon(conn, path_dir)
    _remote.ensure_local(daemon, path_dir, file + ".safetensors")
    how = _fill.fill(path_dir, file, dests, daemon, strict)
    with torch.no_grad():
        for data, orig in zip(flat.payload, flat.originals):
            if data is not orig:
                orig.copy_(data)
    return how


def _through_daemon(conn: Connection, path_dir: str, file: str,
                    place: Dict[str, torch.device]) -> Optional[Dict[str, torch.Tensor]]:
    """Every tensor of the file on its device (``place``, by name), filled by the daemon in
    one load: views of one buffer per device (dsckpt host memory on the CPU, which the daemon
    writes without a copy); None when the daemon cannot serve the file."""
    have = _fill.header(os.path.join(path_dir, file + ".safetensors"))
    sizes = {dt: torch.empty((), dtype=dt).element_size() for dt, _ in have.values()}
    spans, size = [], {}
    for name, (dtype, shape) in have.items():
        nbytes = torch.Size(shape).numel() * sizes[dtype]
        at = size.get(place[name], 0)
        spans.append((at, nbytes))
        size[place[name]] = at + (nbytes + ALIGN - 1) // ALIGN * ALIGN
    bufs = {dev: host_empty((max(n, 1),), torch.uint8) if dev.type == "cpu"
            else torch.empty(max(n, 1), dtype=torch.uint8, device=dev)
            for dev, n in size.items()}
    data = {name: bufs[place[name]][at:at + nbytes].view(dtype).reshape(shape)
            for (name, (dtype, shape)), (at, nbytes) in zip(have.items(), spans)}
    return data if _fill.through_daemon(conn, path_dir, file, data) else None


def _read_here(path: str, place: Dict[str, torch.device]) -> Dict[str, torch.Tensor]:
    """Every tensor of the file on its device (``place``, by name), read here: the data
    region read by several threads into one buffer (pinned when a tensor goes to a GPU),
    checksums checked; one copy to a single GPU, else a copy per tensor not on the CPU."""
    devices = set(place.values())
    if len(devices) == 1 and next(iter(devices)).type == "cuda":
        return read_safetensors_to(path, next(iter(devices)))
    buf, entries = read_safetensors_buffer(path, pin=any(d.type == "cuda" for d in devices))
    return {name: t if place[name].type == "cpu" else t.to(place[name], non_blocking=True)
            for name, t in tensors_of(buf, entries).items()}


def load(path_dir: str, file: Optional[str] = None, map_location: MapLocation = None, *,
         conn: Optional[Connection] = None, weights_only: bool = True) -> Any:
    """Rebuilds the state dict saved as ``path_dir/<file>`` (default ``rank{rank}``).

    ``map_location`` works as torch.load's: None puts tensors back on the device they were
    saved from; a device or string puts all of them there; a dict maps device strings; a
    callable gets ``(storage, location)``. A file without our ``.meta`` blob (written by
    another tool) loads as a flat ``{name: tensor}`` dict. Each tensor is read straight onto
    the device it goes to: when a daemon answers (``conn``, else :func:`default_connection`)
    it fills them all in one load (see :func:`load_into`), one buffer per device, the GPU's
    written by the daemon (tensors on several GPUs: the file is read here); else the file is
    read here by several threads at once (through pinned memory to a GPU). Logger
    ``dsckpt.torch`` says at INFO when a load did not go through a daemon, and why.

    ``weights_only`` (default True) loads without unpickling anything: a checkpoint whose
    blob holds a pickle raises :class:`dsckpt.PickleRefused` (a pickle.UnpicklingError)
    before anything is read. ``weights_only=False`` unpickles it, which runs whatever code
    the checkpoint's author put there: only for checkpoints whose author you trust.
    """
    if file is None:
        file = f"rank{dist_rank_world()[0]}"
    base = os.path.join(path_dir, file)
    daemon = _daemon(conn, path_dir)
    _remote.ensure_local(daemon, path_dir, file + ".safetensors")
    blob = read_meta(base + ".meta").get(BLOB) if os.path.exists(base + ".meta") else None
    info = _blob.read(blob, base + ".meta", weights_only) if blob is not None else None
    views, entries = _blob.tables(info) if info else ([], [])
    # Each tensor of the file read straight onto the device it goes to, in one load however
    # many devices that is (a model's on a GPU, AdamW's step counters on the CPU).
    # A tensor no view names (a file without our blob) goes where the CPU's would.
    where = {d: _target(d, map_location) for d in {v["device"] for v in views} | {"cpu"}}
    place: Dict[str, torch.device] = defaultdict(lambda: where["cpu"])
    place.update((v["name"], where[v["device"]]) for v in views)
    data = _through_daemon(daemon, path_dir, file, place) if daemon else None
    if data is None:
        data = _read_here(base + ".safetensors", place)
    if info is None:
        return data
    missing = [v["name"] for v in views if v["name"] not in data]
    if missing:
        raise ValueError(f"{base}.meta names tensors {base}.safetensors lacks: "
                         f"{', '.join(missing[:5])}")
    rebuilt = _rebuild_views(views, data, map_location)
    used: set = set()
    table = []
    for e in entries:
        t = rebuilt[e["view"]]
        if e["view"] in used:  # another object over the same view: alias it
            t = t.as_strided(t.shape, t.stride(), t.storage_offset())
        used.add(e["view"])
        if e["param"]:
            t = torch.nn.Parameter(t, requires_grad=e["requires_grad"])
        elif e["requires_grad"] and t.is_floating_point():
            t.requires_grad_(True)
        table.append(t)
    return _blob.skeleton(info, table)


# A model built on the meta device, filled from a checkpoint (after _daemon: it imports it).
from .materialize import Materialized, empty_weights, materialize  # noqa: E402

__all__ = ["save", "load", "load_into", "commit", "find_latest", "release_gpu", "SaveHandle",
           "tell_nodes", "materialize", "empty_weights", "Materialized",
           "StateDictMismatch", "host_empty", "default_connection", "run_connection",
           "set_default_connection", "dist_rank_world", "read_safetensors", "read_meta", "DTYPES", "ST_DTYPES"]
