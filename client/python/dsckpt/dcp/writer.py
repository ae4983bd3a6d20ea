"""dsckpt.dcp.writer — the saving half of the DCP backend: Writer, DCP's StorageWriter and the
AsyncStager async_save uses (see dsckpt.dcp for the whole story)."""
from __future__ import annotations

import copy
import dataclasses
import io
import logging
import os
import threading
import traceback
import zlib
from concurrent.futures import Future as ConcurrentFuture
from typing import Any, Dict, FrozenSet, List, Optional, Set, Tuple

import torch
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

from .. import _handover
from .._files import DTYPES
from ..core import Connection, Level
from ..torch import run_connection
from . import meta
from .layout import META_BLOB, META_FILE, STAGED, WRITTEN, Location, chunk_name, file_name

log = logging.getLogger("dsckpt.dcp")


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


def _replicas(value: torch.Tensor) -> Tuple[int, int]:
    """How many ranks hold the same chunk(s) of value as this one, and this rank's place
    among them: a DTensor's replicas are the ranks of its mesh that differ from this one
    only along the dimensions it is not sharded over; a plain tensor is taken to be on every
    rank of the default group (DCP saves it as replicated); a ShardedTensor's shards are
    this rank's own."""
    mesh = getattr(value, "device_mesh", None)
    if getattr(value, "_local_tensor", None) is not None and mesh is not None:
        coord = mesh.get_coordinate()
        count, place = 1, 0
        for dim, p in enumerate(value.placements):
            if not p.is_shard() and coord is not None:
                count, place = count * mesh.size(dim), place * mesh.size(dim) + coord[dim]
        return count, place
    if hasattr(value, "local_shards"):
        return 1, 0
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def _writes(fqn: str, value: torch.Tensor) -> Optional[bool]:
    """None when value's chunks are this rank's alone; else whether this rank is the one of
    their replicas that stages and writes them, picked by the FQN's CRC-32 (the same choice
    on every rank without a word between them, and spread over the replicas)."""
    count, place = _replicas(value)
    if count == 1:
        return None
    return zlib.crc32(fqn.encode()) % count == place


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


def _add_tensors(conn: Connection, save, file: str, named: List[Tuple[str, torch.Tensor]],
                 keep: List[torch.Tensor]) -> None:
    """Hands contiguous tensors to a save of file by address, through the save plan cached
    for file when the tensors are those of its last save (dsckpt._handover); CUDA reads are
    ordered after the current stream of the first one's device. keep gets what must stay
    alive until SNAPSHOT."""
    _handover.add_tensors(conn, save, file, named)
    keep.extend(t for _, t in named)
    gpu = next((t.device for _, t in named if t.is_cuda), None)
    if gpu is not None:
        save.set_stream(torch.cuda.current_stream(gpu).cuda_stream)


class _Staged:
    """One rank's stage of one checkpoint: its save, which memory it holds under which name,
    the replicated chunks it staged and those it left to another replica (by (fqn, offset)),
    and the error to report from write_data when staging failed."""

    def __init__(self, dir: str):
        self.dir = dir
        self.save = None
        self.names: Dict[tuple, str] = {}
        self.keep: List[torch.Tensor] = []
        self.replicas: Set[tuple] = set()
        self.skipped: Set[tuple] = set()
        self.error: Optional[BaseException] = None


@dataclasses.dataclass(frozen=True)
class _Replicated:
    """What a rank's local plan tells the coordinator (SavePlan.storage_data): the indices
    of the replicated chunks it staged and of those it left to another replica."""

    staged: FrozenSet[tuple]
    skipped: FrozenSet[tuple]


def _index(item) -> tuple:
    """A WriteItem's chunk as (fqn, offset), the key _Staged's sets use."""
    return (item.index.fqn, tuple(item.index.offset or ()))


def _strip(e: BaseException) -> BaseException:
    """e with no traceback frames, nor those of the errors it was raised from. A kept error
    must not hold frames that reach async_save's, which holds the process group and the
    futures keeping the error: that cycle kept a failed rank's group alive past
    destroy_process_group, until the garbage collector freed it in whichever thread it ran,
    and torch aborts the process ("terminate called without an active exception") when
    that is not the main thread and the interpreter is exiting."""
    todo, seen = [e], set()
    while todo:
        x = todo.pop()
        if x is not None and id(x) not in seen:
            seen.add(id(x))
            x.__traceback__ = None
            todo += [x.__cause__, x.__context__]
    return e


def _detached(e: BaseException) -> BaseException:
    """e _strip()ped, with where it was raised kept as a note (Python 3.11 and later)."""
    where = "".join(traceback.format_exception(type(e), e, e.__traceback__)).rstrip()
    if hasattr(e, "add_note"):
        e.add_note(f"dsckpt.dcp staging failed here:\n{where}")
    return _strip(e)


def _snapshot_whole(save) -> bool:
    """Whether a failed save had its every byte in the daemon's cache first (it failed
    later, writing: staging itself succeeded)."""
    try:
        p = save.progress()
    except Exception:  # noqa: BLE001 - nothing known: staging failed too
        return False
    return p.bytes_total > 0 and p.bytes_snapshot >= p.bytes_total


class _Staging(ConcurrentFuture):
    """The future stage() returns: the staged state dict at SNAPSHOT. When staging failed,
    result() still gives the state dict, as DCP's upload thread must run the save's
    collectives (write_data then raises the error, and DCP fails the save on every rank,
    none left waiting for this one), while the callbacks on it, staging_completion's, get
    the error. done() stays False until a callback is added, as DCP's async_save reports
    success for a staging future already done when it looks."""

    def __init__(self):
        super().__init__()
        self.error: Optional[BaseException] = None
        self._watched = False

    def finish(self, staged: Dict[str, Any], error: Optional[BaseException]) -> None:
        """Resolves the future: staged (and the error, for the callbacks)."""
        self.error = error
        self.set_result(staged)

    def done(self) -> bool:
        """Whether staging is over (a failure counts once someone waits for it)."""
        return super().done() and (self.error is None or self._watched)

    def add_done_callback(self, fn) -> None:
        """Calls fn when staging is over, with a future of the error when it failed."""
        self._watched = True

        def call(f):
            if self.error is None:
                return fn(f)
            failed: ConcurrentFuture = ConcurrentFuture()
            failed.set_exception(self.error)
            try:
                return fn(failed)
            finally:  # fn raised it (DCP's callback does), taking in async_save's frame
                _strip(self.error)
        super().add_done_callback(call)


class Writer(StorageWriter, AsyncStager):
    """A DCP StorageWriter (and AsyncStager) saving into tag directory ``dir`` through dsckptd.

    ``conn``: the connection (default :func:`dsckpt.torch.run_connection`); ``timeout``:
    seconds to wait for DURABLE and for the commit (None: no limit; staging always waits for
    SNAPSHOT or FAILED, as only then has the daemon finished reading the tensors). Use one Writer per
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

    def __getstate__(self):
        """Refuses to be pickled: async_save's AsyncCheckpointerType.PROCESS would send the
        writer to another process, without its staged save and with its connection's C handle
        meaningless there. Use the default, AsyncCheckpointerType.THREAD."""
        raise TypeError("dsckpt.dcp.Writer cannot leave its process: use async_save with the "
                        "default async_checkpointer_type (THREAD), not PROCESS")

    # -- AsyncStager ------------------------------------------------------------------------

    def stage(self, state_dict: Dict[str, Any]) -> "ConcurrentFuture[Dict[str, Any]]":
        """Hands every tensor of the rank to the daemon (ACCEPTED, about a millisecond) and
        returns a future of the staged state dict that resolves at SNAPSHOT. Of a chunk
        several ranks hold (replicated), only one of them stages it (_writes), and
        prepare_global_plan has that one write it. Never raises: a failure fails the future's
        callbacks (staging_completion) and write_data, so that every rank hears it."""
        tensors: List[Tuple[str, Any]] = []
        staged_dict = _restructure(state_dict, "", tensors)
        st = _Staged(self.dir)
        future = _Staging()
        try:
            named, seen = [], set()
            for fqn, value in tensors:
                writes = _writes(fqn, value) if isinstance(value, torch.Tensor) else None
                for local, offset in _local_shards(value) or []:
                    key = _key(local)
                    if key is None or key in st.names or local.dtype not in DTYPES:
                        continue  # write_data saves these
                    if writes is not None:
                        (st.replicas if writes else st.skipped).add((fqn, offset))
                        if not writes:
                            continue
                    name = chunk_name(fqn, offset)
                    while name in seen:
                        name += "'"
                    seen.add(name)
                    st.names[key] = name
                    named.append((name, local.detach().contiguous()))
            conn = self._conn()
            if named:
                st.save = conn.save(self.dir, file_name(conn.rank, STAGED), early=True)
                _add_tensors(conn, st.save, file_name(conn.rank, STAGED), named, st.keep)
                st.save.end()
        except Exception as e:  # noqa: BLE001 - reported by write_data on every rank
            st.error = _detached(e)
        with self._lock:
            self._staged = st

        def wait_snapshot():  # no time limit: until SNAPSHOT the daemon may read the tensors
            staging_error = st.error
            try:
                if st.save is not None and st.error is None:
                    st.save.wait(Level.SNAPSHOT)
            except Exception as e:  # noqa: BLE001 - FAILED: the daemon reads nothing more
                st.error = _detached(e)
                staging_error = None if _snapshot_whole(st.save) else st.error
            st.keep = []
            future.finish(staged_dict, staging_error)

        threading.Thread(target=wait_snapshot, name="dsckpt-dcp-snapshot", daemon=True).start()
        return future

    def synchronize_staging(self) -> None:
        """Nothing to do: ``staging_completion`` says when staging is over."""

    def close(self) -> None:
        """Nothing to release (the connection is the caller's or the process's)."""

    # -- StorageWriter ----------------------------------------------------------------------

    def _conn(self) -> Connection:
        """The connection saves go through (of the run every rank agreed on)."""
        return self.conn or run_connection(self.dir)

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
        """The plan as the planner made it, telling the coordinator which of its replicated
        chunks this rank staged and which it left to another replica."""
        st = self._staged
        if st is None or not (st.replicas or st.skipped):
            return plan
        mine = {_index(item) for item in plan.items}
        return dataclasses.replace(plan, storage_data=_Replicated(
            frozenset(st.replicas & mine), frozenset(st.skipped & mine)))

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        """The planner's plans, with each replicated chunk written by the rank that staged it:
        DCP's deduplication picks one of the replicas without knowing which one staged it.
        A chunk no rank staged (a plain tensor its chosen replica does not hold) stays where
        the planner put it and is written from its memory as it is then, with a warning."""
        owner: Dict[tuple, int] = {}
        for r, plan in enumerate(plans):
            if isinstance(plan.storage_data, _Replicated):
                for index in plan.storage_data.staged:
                    owner.setdefault(index, r)
        items: List[list] = [[] for _ in plans]
        for r, plan in enumerate(plans):
            skipped = plan.storage_data.skipped \
                if isinstance(plan.storage_data, _Replicated) else frozenset()
            for item in plan.items:
                index = _index(item)
                if index not in skipped:
                    items[r].append(item)
                elif index in owner:
                    items[owner[index]].append(item)
                else:
                    log.warning("dsckpt.dcp: %s@%s was staged by none of its replicas (a "
                                "tensor not on every rank?): rank %d writes it as it is now",
                                index[0], list(index[1]), r)
                    items[r].append(item)
        return [dataclasses.replace(plan, items=its, storage_data=None)
                for plan, its in zip(plans, items)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        """Maps each item to the tensor staged for it, saves the rest and waits until this
        rank's files are DURABLE. Raises on a failure (DCP then fails the save on every rank).
        No rank seals the tag: a tag without DCP's Metadata must never be committed, and the
        coordinator's finish() commits it the moment the Metadata is DURABLE."""
        with self._lock:
            st, self._staged = self._staged, None
        if st is not None and st.error is not None:
            if st.save is not None:
                st.save.close()
            error, st = st.error, None
            try:
                raise error
            finally:
                error = None  # a frame holding what it raised is a reference cycle
        conn = self._conn()
        staged = st.names if st is not None else {}
        results, tensors, blobs = [], [], []
        for item in plan.items:
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                name = chunk_name(item.index.fqn, item.index.offset)
                blobs.append((name, data.getvalue()))
                loc = Location(file_name(conn.rank, WRITTEN), name, "bytes")
                size = len(blobs[-1][1])
            else:
                data = data.detach()
                size = data.numel() * data.element_size()
                name = staged.get(_key(data))
                if name is not None:
                    loc = Location(file_name(conn.rank, STAGED), name)
                elif data.dtype in DTYPES:
                    name = chunk_name(item.index.fqn, item.index.offset)
                    tensors.append((name, data.contiguous()))
                    loc = Location(file_name(conn.rank, WRITTEN), name)
                else:
                    buf = io.BytesIO()
                    torch.save(data.cpu().clone(), buf)
                    name = chunk_name(item.index.fqn, item.index.offset)
                    blobs.append((name, buf.getvalue()))
                    loc = Location(file_name(conn.rank, WRITTEN), name, "pickled")
            results.append(WriteResult(index=item.index, size_in_bytes=size, storage_data=loc))
        saves = [st.save] if st is not None and st.save is not None else []
        try:
            if tensors or blobs or not saves:  # every rank leaves a file: the commit wants one
                saves.append(self._save(conn, file_name(conn.rank, WRITTEN), tensors, blobs))
            for s in saves:
                s.wait(Level.DURABLE, self.timeout)
        finally:
            for s in saves:
                s.close()
        fut: Future = Future()
        fut.set_result(results)
        return fut

    def _save(self, conn: Connection, file: str, tensors, blobs):
        """Saves tensors and blobs as file; returns the ended Save."""
        # With tensors the start goes first (the daemon makes the file while they are
        # added); a file of blobs alone goes in one request at the end.
        s = conn.save(self.dir, file, defer=not tensors, early=bool(tensors))
        try:
            keep: List[torch.Tensor] = []
            if tensors:
                _add_tensors(conn, s, file, tensors, keep)
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
        """Coordinator: saves DCP's Metadata (with every item's Location; without pickle, see
        dsckpt.dcp.meta), waits until it is
        DURABLE and commits the tag for the whole job (every rank's write_data has waited for
        its own files), so that the save's future resolves at COMMITTED."""
        metadata.storage_data = {r.index: r.storage_data for rs in results for r in rs}
        conn = self._conn()
        s = self._save(conn, META_FILE, [], [(META_BLOB, meta.dump(metadata))])
        try:
            s.wait(Level.DURABLE, self.timeout)
        finally:
            s.close()
        conn.commit(self.dir, self.timeout)

    @property
    def checkpoint_id(self) -> str:
        """The tag directory (DCP logs it)."""
        return self.dir

    def storage_meta(self) -> StorageMeta:
        """Where DCP may record that the checkpoint lives."""
        return StorageMeta(checkpoint_id=self.dir)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        """Any directory path."""
        return isinstance(checkpoint_id, (str, os.PathLike))
