"""dsckpt.dcp — a torch.distributed.checkpoint (DCP) storage backend on dsckptd (PyTorch ≥ 2.4).

::

    resp = dcp.async_save(state_dict, storage_writer=dsckpt.dcp.Writer(dir))
    resp.staging_completion.result()   # SNAPSHOT: the tensors may change now
    resp.upload_completion.result()    # the checkpoint is DURABLE and COMMITTED
    dcp.load(state_dict, storage_reader=dsckpt.dcp.Reader(dir))

Saving. :class:`Writer` is also DCP's AsyncStager: ``async_save`` calls :meth:`Writer.stage`
on the trainer's thread, which hands every tensor of the rank — DTensor and ShardedTensor local
shards included — to the node's daemon by reference as file ``__<rank>_0`` and returns a
future that resolves at SNAPSHOT (``staging_completion``). DCP then plans in its own thread;
:meth:`Writer.write_data` only maps each WriteItem to the tensor already handed over (by
address), saves what was not (pickled objects as blobs, tensors DCP made on the way, and all
of a plain ``dcp.save``) as ``__<rank>_1``, waits until its files are DURABLE and seals the tag
for its rank. The coordinator's :meth:`Writer.finish` saves DCP's Metadata, pickled, as blob
``dcp.metadata`` of ``dcp_metadata.meta``, seals, and commits, so the upload future resolves
when the tag is COMMITTED. A rank whose write fails raises in ``write_data``: DCP gathers it
and the save raises on every rank; nothing is committed.

Replicated tensors (plain tensors, Replicate DTensors) are handed over by every rank that holds
them, as DCP's deduplication picks the rank that keeps each only after staging.

Loading. :class:`Reader` reads the Metadata back (a tag must be committed), so DCP's planner
reshards: any world size, any sharding. For each file it has the daemon fill the stored chunks
that the rank's ReadItems need (from its host cache when it still holds the tag, checksums
checked), straight into the destination where a destination is exactly one stored chunk, else
into a buffer that is then narrowed and copied; without a daemon the file is read here.

The files stay plain safetensors under our manifest: ``dsckptctl verify`` checks them.
Loading unpickles the metadata and the objects DCP pickled: load only checkpoints you trust.
"""
from __future__ import annotations

import copy
import dataclasses
import io
import os
import pickle
import threading
from concurrent.futures import Future as ConcurrentFuture
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex
from torch.distributed.checkpoint.planner import (LoadItemType, LoadPlan, LoadPlanner,
                                                  SavePlan, SavePlanner, WriteItemType)
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from . import _fill
from ._files import DTYPES, read_meta
from .core import Connection, Level
from .errors import DsckptError, Errno, error_for
from .torch import default_connection, dist_rank_world, host_empty

META_FILE = "dcp_metadata"          # <tag>/dcp_metadata.meta holds DCP's Metadata
META_BLOB = "dcp.metadata"
STAGED, WRITTEN = 0, 1              # file __<rank>_<n>: handed over at stage / at write


@dataclasses.dataclass(frozen=True)
class Location:
    """Where one WriteItem lives: ``kind`` "tensor" (tensor ``name`` of ``file.safetensors``),
    "bytes" (blob ``name`` of ``file.meta``: what DCP pickled) or "pickled" (blob holding a
    torch.save'd tensor of a dtype safetensors cannot name)."""

    file: str
    name: str
    kind: str = "tensor"


def _file(rank: int, n: int) -> str:
    """The name of a rank's file n."""
    return f"__{rank}_{n}"


def _key(t: torch.Tensor) -> Optional[tuple]:
    """What identifies a tensor's memory: the same key for the same view of the same bytes."""
    if t.numel() == 0:
        return None
    return (t.device, t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride()))


def _local_shards(value: Any) -> Optional[List[Tuple[torch.Tensor, Tuple[int, ...]]]]:
    """The tensors a rank holds of a state dict value, with their offsets in the whole:
    a DTensor's local tensor, a ShardedTensor's local shards, a plain tensor; None otherwise."""
    if not isinstance(value, torch.Tensor):
        return None
    local = getattr(value, "_local_tensor", None)
    if local is not None:  # DTensor
        try:
            from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
            _, offset = compute_local_shape_and_global_offset(
                value.shape, value.device_mesh, value.placements)
        except Exception:  # a private helper: the name only loses its offset
            offset = (0,) * value.dim()
        return [(local, tuple(offset))]
    if hasattr(value, "local_shards"):  # ShardedTensor
        return [(s.tensor, tuple(s.metadata.shard_offsets)) for s in value.local_shards()]
    return [(value, (0,) * value.dim())]


def _name(fqn: str, offset) -> str:
    """A chunk's tensor name in our files: the FQN, with the chunk's offset when not 0."""
    offset = tuple(offset or ())
    return fqn if not any(offset) else fqn + "@" + "_".join(str(int(o)) for o in offset)


def _restructure(obj: Any, prefix: str, out: List[Tuple[str, Any]]) -> Any:
    """A copy of the state dict's containers for staging: tensors kept (listed in out with their
    key paths), any other value deep-copied, so later changes to it do not reach the save."""
    if isinstance(obj, torch.Tensor):
        out.append((prefix, obj))
        return obj
    if isinstance(obj, dict):
        return {k: _restructure(v, f"{prefix}.{k}" if prefix else str(k), out)
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):
        items = [_restructure(v, f"{prefix}.{i}" if prefix else str(i), out)
                 for i, v in enumerate(obj)]
        return items if isinstance(obj, list) else tuple(items)
    return copy.deepcopy(obj)


def _add_tensors(save, named: List[Tuple[str, torch.Tensor]], keep: List[torch.Tensor]) -> None:
    """Hands contiguous tensors to a save by address; CUDA reads are ordered after the current
    stream of the first one's device. keep gets what must stay alive until SNAPSHOT."""
    specs, gpu = [], None
    for name, t in named:
        nbytes = t.numel() * t.element_size()
        specs.append((name, DTYPES[t.dtype], tuple(t.shape), t.data_ptr() if nbytes else 0,
                      nbytes))
        keep.append(t)
        if t.is_cuda and gpu is None:
            gpu = t.device
    save.add_tensors(specs)
    if gpu is not None:
        save.set_stream(torch.cuda.current_stream(gpu).cuda_stream)


class _Staged:
    """One rank's stage of one checkpoint: its save, which memory it holds under which name,
    and the error to report from write_data when staging failed."""

    def __init__(self, dir: str):
        self.dir = dir
        self.save = None
        self.names: Dict[tuple, str] = {}
        self.keep: List[torch.Tensor] = []
        self.error: Optional[BaseException] = None


class Writer(StorageWriter, AsyncStager):
    """A DCP StorageWriter (and AsyncStager) saving into tag directory ``dir`` through dsckptd.

    ``conn``: the connection (default :func:`dsckpt.torch.default_connection`); ``timeout``:
    seconds to wait for DURABLE and for the commit (None: no limit). Use one Writer per
    checkpoint directory, or pass ``checkpoint_id`` to ``dcp.save`` (not to ``async_save``:
    staging happens before DCP tells the writer the directory).
    """

    _synchronize_after_execute = False  # stage() returns a future; nothing to synchronize

    def __init__(self, dir, *, conn: Optional[Connection] = None,
                 timeout: Optional[float] = None):
        super().__init__()
        self.dir = os.fspath(dir)
        self.conn = conn
        self.timeout = timeout
        self.is_coordinator = False
        self._staged: Optional[_Staged] = None
        self._lock = threading.Lock()

    # -- AsyncStager ------------------------------------------------------------------------

    def stage(self, state_dict: Dict[str, Any]) -> "ConcurrentFuture[Dict[str, Any]]":
        """Hands every tensor of the rank to the daemon (ACCEPTED, about a millisecond) and
        returns a future of the staged state dict that resolves at SNAPSHOT. Never raises: a
        failure resolves the future too and fails write_data, so that every rank hears it."""
        tensors: List[Tuple[str, Any]] = []
        staged_dict = _restructure(state_dict, "", tensors)
        st = _Staged(self.dir)
        future: ConcurrentFuture = ConcurrentFuture()
        try:
            named, seen = [], set()
            for fqn, value in tensors:
                for local, offset in _local_shards(value) or []:
                    key = _key(local)
                    if key is None or key in st.names or local.dtype not in DTYPES:
                        continue  # write_data saves these
                    name = _name(fqn, offset)
                    while name in seen:
                        name += "'"
                    seen.add(name)
                    st.names[key] = name
                    named.append((name, local.detach().contiguous()))
            conn = self._conn()
            st.save = conn.save(self.dir, _file(conn.rank, STAGED))
            _add_tensors(st.save, named, st.keep)
            st.save.end()
        except Exception as e:  # noqa: BLE001 - reported by write_data on every rank
            st.error = e
        with self._lock:
            self._staged = st

        def wait_snapshot():
            try:
                if st.save is not None and st.error is None:
                    st.save.wait(Level.SNAPSHOT, self.timeout)
            except Exception as e:  # noqa: BLE001 - FAILED: the daemon reads nothing more
                st.error = e
            st.keep = []
            future.set_result(staged_dict)

        threading.Thread(target=wait_snapshot, name="dsckpt-dcp-snapshot", daemon=True).start()
        return future

    def synchronize_staging(self) -> None:
        """Nothing to do: ``staging_completion`` says when staging is over."""

    def close(self) -> None:
        """Nothing to release (the connection is the caller's or the process's)."""

    # -- StorageWriter ----------------------------------------------------------------------

    def _conn(self) -> Connection:
        """The connection saves go through."""
        return self.conn or default_connection(self.dir)

    def reset(self, checkpoint_id=None) -> None:
        """Starts a new checkpoint, into ``checkpoint_id`` when given."""
        if checkpoint_id is not None:
            new = os.fspath(checkpoint_id)
            st = self._staged
            if st is not None and os.path.normpath(st.dir) != os.path.normpath(new):
                raise ValueError(f"dsckpt.dcp.Writer staged into {st.dir}, not {new}: give "
                                 "the directory to Writer(), not to async_save")
            self.dir = new

    def set_up_storage_writer(self, is_coordinator: bool, *args, **kwargs) -> None:
        """Notes whether this rank is DCP's coordinator (it commits)."""
        self.is_coordinator = is_coordinator

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """The plan as the planner made it."""
        return plan

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        """The plans as the planner made them."""
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        """Maps each item to the tensor staged for it, saves the rest, waits until this rank's
        files are DURABLE and seals the tag for the rank. Raises on a failure (DCP then fails
        the save on every rank)."""
        with self._lock:
            st, self._staged = self._staged, None
        if st is not None and st.error is not None:
            raise st.error
        conn = self._conn()
        staged = st.names if st is not None else {}
        results, tensors, blobs = [], [], []
        for item in plan.items:
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                name = _name(item.index.fqn, item.index.offset)
                blobs.append((name, data.getvalue()))
                loc, size = Location(_file(conn.rank, WRITTEN), name, "bytes"), len(blobs[-1][1])
            else:
                data = data.detach()
                size = data.numel() * data.element_size()
                name = staged.get(_key(data))
                if name is not None:
                    loc = Location(_file(conn.rank, STAGED), name)
                elif data.dtype in DTYPES:
                    name = _name(item.index.fqn, item.index.offset)
                    tensors.append((name, data.contiguous()))
                    loc = Location(_file(conn.rank, WRITTEN), name)
                else:
                    buf = io.BytesIO()
                    torch.save(data.cpu().clone(), buf)
                    name = _name(item.index.fqn, item.index.offset)
                    blobs.append((name, buf.getvalue()))
                    loc = Location(_file(conn.rank, WRITTEN), name, "pickled")
            results.append(WriteResult(index=item.index, size_in_bytes=size, storage_data=loc))
        saves = [st.save] if st is not None and st.save is not None else []
        if tensors or blobs or not saves:  # every rank leaves a file: the commit wants one
            saves.append(self._save(conn, _file(conn.rank, WRITTEN), tensors, blobs))
        for s in saves:
            s.wait(Level.DURABLE, self.timeout)
        if not self.is_coordinator:
            conn.seal(self.dir)
        fut: Future = Future()
        fut.set_result(results)
        return fut

    def _save(self, conn: Connection, file: str, tensors, blobs):
        """Saves tensors and blobs as file; returns the ended Save."""
        s = conn.save(self.dir, file)
        try:
            keep: List[torch.Tensor] = []
            _add_tensors(s, tensors, keep)
            for name, data in blobs:
                s.add_blob(name, data)
            s.end()
            if keep and any(t.is_cuda for t in keep):
                s.wait(Level.SNAPSHOT, self.timeout)  # the daemon reads them by reference
        except BaseException:
            s.close()
            raise
        return s

    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        """Coordinator: saves DCP's Metadata (with every item's Location), waits until it is
        DURABLE, seals and commits the tag for the whole job."""
        metadata.storage_data = {r.index: r.storage_data for rs in results for r in rs}
        conn = self._conn()
        s = self._save(conn, META_FILE, [], [(META_BLOB, pickle.dumps(metadata, protocol=4))])
        s.wait(Level.DURABLE, self.timeout)
        conn.seal(self.dir)
        conn.commit(self.dir, self.timeout)

    def storage_meta(self):
        """Where DCP may record that the checkpoint lives."""
        from torch.distributed.checkpoint.metadata import StorageMeta
        return StorageMeta(checkpoint_id=self.dir)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        """Any directory path."""
        return isinstance(checkpoint_id, (str, os.PathLike))


class Reader(StorageReader):
    """A DCP StorageReader for a tag :class:`Writer` committed, through the daemon when one
    answers (``conn``, else :func:`dsckpt.torch.default_connection`), else from the files."""

    def __init__(self, dir, *, conn: Optional[Connection] = None):
        super().__init__()
        self.dir = os.fspath(dir)
        self.conn = conn
        self.storage_data: Dict[MetadataIndex, Location] = {}
        self.sources: Dict[str, str] = {}  # file → how its tensors came: "daemon" or "file"

    def reset(self, checkpoint_id=None) -> None:
        """Reads ``checkpoint_id`` from now on, when given."""
        if checkpoint_id is not None:
            self.dir = os.fspath(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        """Any directory path."""
        return isinstance(checkpoint_id, (str, os.PathLike))

    def read_metadata(self, *args, **kwargs) -> Metadata:
        """DCP's Metadata of the tag; raises CheckpointIncomplete unless it is committed."""
        if not os.path.exists(os.path.join(self.dir, "MANIFEST.json")):
            raise error_for(Errno.EINCOMPLETE, "EINCOMPLETE",
                            f"{self.dir} is not a committed checkpoint (no MANIFEST.json)")
        blobs = read_meta(os.path.join(self.dir, META_FILE + ".meta"))
        if META_BLOB not in blobs:
            raise ValueError(f"{self.dir}: {META_FILE}.meta has no {META_BLOB} blob")
        return pickle.loads(blobs[META_BLOB])

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args,
                              **kwargs) -> None:
        """Keeps where each item lives."""
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """The plan as the planner made it."""
        return plan

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        """The plans as the planner made them."""
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        """Serves every ReadItem of the plan, one file at a time."""
        by_file: Dict[str, list] = {}
        for item in plan.items:
            by_file.setdefault(self.storage_data[item.storage_index].file, []).append(item)
        conn = self._daemon()
        for file, items in sorted(by_file.items()):
            self._read_file(file, items, planner, conn)
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def _daemon(self) -> Optional[Connection]:
        """The connection loads go through, or None when no daemon answers."""
        if self.conn is not None:
            return self.conn
        try:
            return default_connection(self.dir)
        except DsckptError:
            return None

    def _read_file(self, file: str, items: list, planner: LoadPlanner,
                   conn: Optional[Connection]) -> None:
        """Serves the items stored in one file: blobs from its .meta; tensors filled by the
        daemon (or read here), straight into a destination that is one whole stored chunk."""
        blobs = None
        uses: Dict[str, list] = {}
        for item in items:
            loc = self.storage_data[item.storage_index]
            if loc.kind == "tensor":
                uses.setdefault(loc.name, []).append(item)
                continue
            if blobs is None:
                blobs = read_meta(os.path.join(self.dir, file + ".meta"))
            data = io.BytesIO(blobs[loc.name])
            if item.type == LoadItemType.BYTE_IO:
                planner.load_bytes(item, data)
            else:
                src = torch.load(data, weights_only=True)
                _copy_into(planner, item, _narrow(src, item.storage_offsets, item.lengths))
        if not uses:
            return
        shapes = _fill.header(os.path.join(self.dir, file + ".safetensors"))
        dests, direct = {}, []
        for name, its in uses.items():
            dtype, shape = shapes[name]
            target = planner.resolve_tensor(its[0]) if len(its) == 1 else None
            if (target is not None and target.is_contiguous() and target.dtype == dtype
                    and tuple(target.shape) == tuple(shape)
                    and not any(its[0].storage_offsets)):
                dests[name] = target  # the daemon writes the destination itself
                direct.append((its[0], target))
            else:
                device = planner.resolve_tensor(its[0]).device
                dests[name] = (host_empty(shape, dtype) if device.type == "cpu"
                               else torch.empty(shape, dtype=dtype, device=device))
        self.sources[file] = _fill.fill(self.dir, file, dests, conn, strict=False)
        for item, target in direct:
            planner.commit_tensor(item, target)
        for name, its in uses.items():
            if any(item is d for d, _ in direct for item in its):
                continue
            for item in its:
                _copy_into(planner, item, _narrow(dests[name], item.storage_offsets,
                                                  item.lengths))


def _narrow(t: torch.Tensor, offsets, lengths) -> torch.Tensor:
    """The sub-range of a stored chunk a ReadItem wants."""
    for dim, (off, n) in enumerate(zip(offsets, lengths)):
        t = t.narrow(dim, int(off), int(n))
    return t


def _copy_into(planner: LoadPlanner, item, src: torch.Tensor) -> None:
    """Copies src into the item's destination and tells the planner."""
    target = planner.resolve_tensor(item).detach()
    if target.shape != src.shape:
        raise ValueError(f"{item.dest_index.fqn}: stored chunk {list(src.shape)}, "
                         f"destination {list(target.shape)}")
    target.copy_(src)
    planner.commit_tensor(item, target)


__all__ = ["Writer", "Reader", "Location", "META_FILE", "META_BLOB"]
