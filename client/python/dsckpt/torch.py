"""dsckpt.torch — PyTorch state dicts saved through dsckptd as plain safetensors files.

``save(state_dict, dir)`` walks nested dicts, lists and tuples and hands every tensor to the
daemon by reference: CUDA tensors by their device pointer (the library exports the
allocation and orders the daemon's copy after the current stream's queued work), CPU
tensors by address (memory from :func:`host_empty` without a copy, any other memory staged
by the library before ``save`` returns). Non-contiguous tensors are made contiguous first.
It returns at once (ACCEPTED) with a :class:`SaveHandle`; call
``handle.wait_snapshot()`` right before the optimizer step changes the tensors, and
``commit(dir)`` on every rank once the checkpoint is complete.

What is not a tensor — the structure with tensors replaced by placeholders, dtypes, shapes,
strides, which tensors shared storage or were the same object, and any other Python values
— is pickled into the blob ``dsckpt.torch`` of ``<file>.meta``. ``load`` rebuilds an equal
state dict: same keys and containers, dtypes (bf16 included), shapes, values, and the same
sharing (one object stays one object; views of one storage become views of one storage).
Loading unpickles that blob, so load only checkpoints you trust, as with ``torch.load``.

In the file each tensor is named by its key path: ``model.layers.0.weight``,
``optimizer.state.0.exp_avg`` (list indices as numbers); a view seen twice is stored once.
Tensors whose dtype safetensors cannot name (complex, quantized, sparse, meta) travel
pickled inside the blob instead. Reading the files themselves is :mod:`dsckpt._files`'s.
"""
from __future__ import annotations

import copy
import hashlib
import os
import pickle
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch

from ._files import DTYPES, ST_DTYPES, read_meta, read_safetensors, read_safetensors_to
from .core import Connection, HostBuffer, Level, Save, SaveProgress
from .errors import DsckptError, Errno, error_for
from .resume import find_latest

BLOB = "dsckpt.torch"
FORMAT_VERSION = 1
MAX_NAME = 512  # PROTO_MAX_NAME: longest tensor name the daemon takes

MapLocation = Union[None, str, torch.device, Dict[str, str],
                    Callable[[Any, str], Any]]


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


def default_connection(dir: Optional[str] = None) -> Connection:
    """The process's shared connection, made on first use: socket $DSCKPT_SOCKET (else the
    system one), job $DSCKPT_JOB (else the name of the directory above the first checkpoint
    directory), rank and world size from :func:`dist_rank_world`."""
    global _default_conn
    with _default_lock:
        if _default_conn is None or _default_conn.closed:
            job = os.environ.get("DSCKPT_JOB")
            if not job and dir:
                job = os.path.basename(os.path.dirname(os.path.normpath(dir)))
            rank, world = dist_rank_world()
            _default_conn = Connection(job=job or "default", rank=rank, world_size=world)
        return _default_conn


def set_default_connection(conn: Optional[Connection]) -> None:
    """Replaces the process's shared connection (None: make a new one on next use)."""
    global _default_conn
    with _default_lock:
        _default_conn = conn


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
# Saving


class _TensorRef:
    """Placeholder for a tensor in the pickled skeleton: index into the entry table."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __reduce__(self):
        return (_resolve_ref, (self.index,))


_resolving = threading.local()


def _resolve_ref(index: int):
    """Unpickling a placeholder: the rebuilt tensor while load() runs, else the placeholder."""
    table = getattr(_resolving, "table", None)
    return table[index] if table is not None else _TensorRef(index)


def _extent(shape, stride) -> int:
    """Elements from a view's first to one past its last (0 for an empty view)."""
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, stride))


_DTYPE_NAMES: Dict[torch.dtype, str] = {d: str(d)[6:] for d in DTYPES}
_device_names: Dict[torch.device, str] = {}


def _device_name(device: torch.device) -> str:
    """str(device), remembered (it is asked once per tensor)."""
    name = _device_names.get(device)
    if name is None:
        name = _device_names.setdefault(device, str(device))
    return name


def _short_name(name: str) -> str:
    """name, or a hashed abbreviation when it is longer than the daemon takes."""
    if len(name.encode()) <= MAX_NAME:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:16]
    return name.encode()[:MAX_NAME - 20].decode(errors="ignore") + "~" + digest


class _Flattener:
    """Walks a state dict: collects tensors into views (bytes in the file) and entries
    (tensor objects), and builds the skeleton with placeholders."""

    def __init__(self):
        self.views: List[dict] = []       # one per distinct view: goes to the file
        self.payload: List[torch.Tensor] = []  # contiguous data of each view
        self.specs: List[tuple] = []      # each view's (name, dtype, shape, ptr, nbytes)
        self.nbytes = 0                   # bytes of every view
        self.gpu: List[torch.Tensor] = []  # the CUDA ones of payload
        self.entries: List[dict] = []     # one per distinct tensor object
        self.names: set = set()
        self.by_object: Dict[int, int] = {}   # id(tensor) → entry
        self.by_view: Dict[tuple, int] = {}   # (storage, dtype, offset, shape, stride) → view
        self.groups: Dict[tuple, int] = {}    # (storage, dtype) → group
        self.memo: Dict[int, Any] = {}        # id(container) → walked container
        self.hold: List[Any] = []             # keeps walked objects (and their ids) alive

    def name(self, path: str) -> str:
        """A unique tensor name for a key path."""
        base = _short_name(path or "tensor")
        name, n = base, 1
        while name in self.names or name == "__metadata__":
            name, n = f"{base}~{n}", n + 1
        self.names.add(name)
        return name

    def tensor(self, t: torch.Tensor, path: str) -> Any:
        """The placeholder for a tensor (or the tensor itself when it stays in the pickle).
        Runs once per tensor of every save: each attribute is asked for once (a PyTorch
        attribute costs a few hundred nanoseconds)."""
        known = self.by_object.get(id(t))
        if known is not None:
            return _TensorRef(known)
        dtype = t.dtype
        if dtype not in DTYPES or t.layout != torch.strided or t.is_meta:
            return t  # pickled with the skeleton, by torch's own reduction
        ptr, offset, esz, device = t.data_ptr(), t.storage_offset(), t.element_size(), t.device
        skey = (device, ptr - offset * esz) if ptr else None  # the storage's identity
        shape, stride = tuple(t.shape), t.stride()
        vkey = (skey, dtype, offset, shape, stride) if skey else None
        vi = self.by_view.get(vkey) if vkey is not None else None
        if vi is None:
            gkey = (skey, dtype) if skey else ("lone", len(self.views))
            group = self.groups.setdefault(gkey, len(self.groups))
            vi = len(self.views)
            name, dname = self.name(path), _device_name(device)
            self.views.append({"name": name, "dtype": _DTYPE_NAMES[dtype], "shape": shape,
                               "stride": stride, "offset": offset, "group": group,
                               "device": dname})
            data = t if t.is_contiguous() else t.detach().contiguous()
            nbytes = data.numel() * esz
            self.specs.append((name, DTYPES[dtype], shape,
                               (data.data_ptr() if data is not t else ptr) if nbytes else 0,
                               nbytes))
            self.payload.append(data)
            self.nbytes += nbytes
            if dname.startswith("cuda"):
                self.gpu.append(data)
            if vkey is not None:
                self.by_view[vkey] = vi
        param = type(t) is not torch.Tensor and isinstance(t, torch.nn.Parameter)
        self.entries.append({"view": vi, "param": param, "requires_grad": t.requires_grad})
        self.by_object[id(t)] = len(self.entries) - 1
        self.hold.append(t)
        return _TensorRef(len(self.entries) - 1)

    def walk(self, obj: Any, path: str) -> Any:
        """obj with every tensor inside dicts, lists and tuples replaced by a placeholder;
        containers without tensors are returned as they are. path: the dotted key path."""
        if isinstance(obj, torch.Tensor):
            return self.tensor(obj, path)
        if not isinstance(obj, (dict, list, tuple)):
            return obj
        if id(obj) in self.memo:
            return self.memo[id(obj)]
        self.hold.append(obj)
        pre = path + "." if path else ""
        if isinstance(obj, dict):
            items = {k: self.walk(v, pre + str(k)) for k, v in obj.items()}
            if all(items[k] is v for k, v in obj.items()):
                out = obj
            else:
                out = copy.copy(obj)
                for k, v in items.items():
                    out[k] = v
        else:
            items = [self.walk(v, pre + str(i)) for i, v in enumerate(obj)]
            if all(a is b for a, b in zip(items, obj)):
                out = obj
            elif isinstance(obj, list):
                out = copy.copy(obj)
                out[:] = items
            elif hasattr(obj, "_fields"):  # a namedtuple
                out = type(obj)(*items)
            else:
                out = type(obj)(items) if type(obj) is not tuple else tuple(items)
        self.memo[id(obj)] = out
        return out


class SaveHandle:
    """One save of a state dict: wait for its levels, read its progress.

    Until the save reaches SNAPSHOT the handle keeps every tensor whose memory the daemon
    reads by reference (CUDA tensors and contiguous copies) alive; :meth:`wait_snapshot`
    (or any wait reaching SNAPSHOT) lets go of them.
    """

    def __init__(self, save: Save, keep: List[torch.Tensor], ntensors: int, nbytes: int):
        self.save = save
        self._keep: Optional[List[torch.Tensor]] = keep
        self.ntensors = ntensors
        self.nbytes = nbytes

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
    wait for their saves themselves).
    """
    conn = conn or default_connection(path_dir)
    file = file if file is not None else f"rank{conn.rank}"
    flat = _Flattener()
    skeleton = flat.walk(state_dict, "")
    blob = pickle.dumps({"format": BLOB, "version": FORMAT_VERSION,
                         "torch": torch.__version__, "views": flat.views,
                         "entries": flat.entries,
                         "skeleton": pickle.dumps(skeleton, protocol=4)}, protocol=4)
    s = conn.save(path_dir, file)
    try:
        s.add_tensors(flat.specs)
        s.add_blob(BLOB, blob)
        if stream is None and flat.gpu:
            stream = torch.cuda.current_stream(flat.gpu[0].device)
        if stream is not None:
            s.set_stream(getattr(stream, "cuda_stream", stream))
        s.end()
    except BaseException:
        s.close()
        raise
    handle = SaveHandle(s, flat.gpu, len(flat.views), flat.nbytes)  # gpu: read until SNAPSHOT
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

    Each rank first seals ``dir`` (it saves nothing more there): from then on the daemons
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
        raise error
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
        raise error
    if code < 0:
        name = Errno(code).name if code in Errno._value2member_map_ else str(code)
        raise error_for(code, name, f"commit of {dir} failed on rank 0")


# ---------------------------------------------------------------------------------------
# Loading


def _target(device: str, map_location: MapLocation) -> torch.device:
    """Where a tensor saved on ``device`` goes, as torch.load's map_location says."""
    if map_location is None:
        return torch.device(device)
    if isinstance(map_location, (str, torch.device)):
        return torch.device(map_location)
    if isinstance(map_location, dict):
        return torch.device(map_location.get(device, device))
    moved = map_location(torch.UntypedStorage(0), device)
    return torch.device(moved.device) if moved is not None else torch.device(device)


def _contiguous_strides(shape) -> Tuple[int, ...]:
    """Row-major strides of a shape."""
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def _is_contiguous(shape, stride) -> bool:
    """Whether a view is laid out row-major (dimensions of size 1 do not count)."""
    if any(s == 0 for s in shape):
        return True
    return all(a == b for s, a, b in zip(shape, stride, _contiguous_strides(shape)) if s > 1)


def _rebuild_views(views: List[dict], data: Dict[str, torch.Tensor],
                   map_location: MapLocation) -> List[torch.Tensor]:
    """Every saved view, with views of one storage rebuilt as views of one new storage."""
    groups: Dict[int, List[int]] = {}
    for i, v in enumerate(views):
        groups.setdefault(v["group"], []).append(i)
    out: List[Optional[torch.Tensor]] = [None] * len(views)
    for members in groups.values():
        first = views[members[0]]
        device = _target(first["device"], map_location)
        if len(members) == 1 and _is_contiguous(first["shape"], first["stride"]):
            out[members[0]] = data[first["name"]].to(device)
            continue
        low = min(views[i]["offset"] for i in members)
        high = max(views[i]["offset"] + _extent(views[i]["shape"], views[i]["stride"])
                   for i in members)
        base = torch.zeros(max(high - low, 0), dtype=getattr(torch, first["dtype"]),
                           device=data[first["name"]].device)
        for i in members:
            v = views[i]
            # Broadcast (stride 0) dimensions hold one element: write only that one.
            shape = [1 if st == 0 else s for s, st in zip(v["shape"], v["stride"])]
            src = data[v["name"]][tuple(slice(0, n) for n in shape)]
            base.as_strided(shape, v["stride"], v["offset"] - low).copy_(src)
        base = base.to(device)
        for i in members:
            v = views[i]
            out[i] = base.as_strided(v["shape"], v["stride"], v["offset"] - low)
    return out  # type: ignore[return-value]


def load(path_dir: str, file: Optional[str] = None, map_location: MapLocation = None) -> Any:
    """Rebuilds the state dict saved as ``path_dir/<file>`` (default ``rank{rank}``).

    ``map_location`` works as torch.load's: None puts tensors back on the device they were
    saved from; a device or string puts all of them there; a dict maps device strings; a
    callable gets ``(storage, location)``. A file without our ``.meta`` blob (written by
    another tool) loads as a flat ``{name: tensor}`` dict.
    """
    if file is None:
        file = f"rank{dist_rank_world()[0]}"
    base = os.path.join(path_dir, file)
    blob = read_meta(base + ".meta").get(BLOB) if os.path.exists(base + ".meta") else None
    info = pickle.loads(blob) if blob is not None else None
    saved_on = {v["device"] for v in info["views"]} if info else {"cpu"}
    targets = {_target(d, map_location) for d in saved_on}
    if len(targets) == 1 and next(iter(targets)).type == "cuda":
        # One GPU for everything: one parallel read into pinned memory, one copy over.
        data = read_safetensors_to(base + ".safetensors", next(iter(targets)))
    else:
        data = read_safetensors(base + ".safetensors")
    if info is None:
        return {k: t.to(_target("cpu", map_location)) for k, t in data.items()}
    if info.get("format") != BLOB or info.get("version") != FORMAT_VERSION:
        raise ValueError(f"{base}.meta: not a {BLOB} v{FORMAT_VERSION} blob")
    views = _rebuild_views(info["views"], data, map_location)
    used: set = set()
    table = []
    for e in info["entries"]:
        t = views[e["view"]]
        if e["view"] in used:  # another object over the same view: alias it
            t = t.as_strided(t.shape, t.stride(), t.storage_offset())
        used.add(e["view"])
        if e["param"]:
            t = torch.nn.Parameter(t, requires_grad=e["requires_grad"])
        elif e["requires_grad"] and t.is_floating_point():
            t.requires_grad_(True)
        table.append(t)
    _resolving.table = table
    try:
        return pickle.loads(info["skeleton"])
    finally:
        _resolving.table = None


__all__ = ["save", "load", "commit", "find_latest", "release_gpu", "SaveHandle", "host_empty",
           "default_connection", "set_default_connection", "dist_rank_world",
           "read_safetensors", "read_meta", "DTYPES", "ST_DTYPES"]
