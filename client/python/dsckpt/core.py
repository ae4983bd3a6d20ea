"""core.py — the Pythonic face of libdsckpt: Connection, Save, Load, Level, HostBuffer.

A trainer rank connects to its node's daemon, identifies itself, and for each checkpoint
file opens a :class:`Save`, adds tensors by address and blobs by value, ends it (ACCEPTED,
about a millisecond), and later waits for SNAPSHOT (before the optimizer step) and DURABLE.
One rank then commits the directory::

    with dsckpt.Connection(job="llama", rank=0, world_size=1) as conn:
        with conn.save("/var/lib/dsckpt/llama/step100", "rank0") as s:
            s.add_tensor("w", "F32", (1024,), ptr, 4096)
            s.add_blob("skeleton", b"...")
        # leaving the block ended the save; the handle stays usable
        s.wait(dsckpt.Level.SNAPSHOT)
        s.wait(dsckpt.Level.DURABLE)
        conn.commit("/var/lib/dsckpt/llama/step100")

A load runs the other way: the daemon fills tensors the caller names (from its host cache
when it still holds the file, else from the disk, checking every checksum)::

    with conn.load("/var/lib/dsckpt/llama/step100", "rank0") as l:
        l.add_tensors([("w", "F32", (1024,), ptr, 4096)])
    # leaving the block ended the load and waited until every byte was in place

Every failure raises :class:`dsckpt.DsckptError` (see errors.py). Timeouts are in seconds
(``None``: no limit).
"""
from __future__ import annotations

import ctypes
import dataclasses
import enum
import os
from typing import Iterable, Optional, Sequence, Union

from . import _lib
from ._cargs import (NUMPY_DTYPES, PackedTensors, TensorSpec, _encode, _timeout_ms,
                     pack_tensors)
from ._hostbuf import HostBuffer, in_host_buffer
from .errors import DsckptError, Errno, error_for

BytesLike = Union[bytes, bytearray, memoryview]


class Level(enum.IntEnum):
    """Levels of a save, in order (dsckpt_level_t); FAILED is terminal."""

    FAILED = -1
    NONE = 0
    ACCEPTED = 1
    SNAPSHOT = 2
    DURABLE = 3
    COMMITTED = 4
    REMOTE = 5  # the committed tag, its manifest and latest are in the root's remote tier
    REPLICATED = 6  # this node's files of the tag are held by `replicas` peers (after REMOTE)


class LoadLevel(enum.IntEnum):
    """Levels of a load: FAILED is terminal, LOADED means every byte is in place."""

    FAILED = -1
    OPEN = 0
    ACCEPTED = 1
    LOADED = 2


@dataclasses.dataclass(frozen=True)
class LoadProgress:
    """Progress of one load as last reported by the daemon."""

    level: LoadLevel
    bytes_total: int
    bytes_done: int


@dataclasses.dataclass(frozen=True)
class SaveProgress:
    """Progress of one save as last reported by the daemon."""

    level: Level
    bytes_total: int
    bytes_snapshot: int
    bytes_flushed: int


def version() -> str:
    """Version of the loaded libdsckpt, e.g. ``"0.1.0"``."""
    return _lib.lib().dsckpt_version().decode()


def strerror(code: int) -> str:
    """The library's message for an error code."""
    return _lib.lib().dsckpt_strerror(code).decode()


def err_name(code: int) -> str:
    """The name of an error code, e.g. ``"EINVAL"``."""
    return _lib.lib().dsckpt_err_name(code).decode()


def _raise(handle: Optional[int], rc: int, load: bool = False) -> None:
    """Raises the exception for a negative return code, with the library's message
    (LoadFailed for a failed load, when ``load``)."""
    lib = _lib.lib()
    msg = lib.dsckpt_last_error(handle).decode(errors="replace")
    cause = lib.dsckpt_last_cause(handle) if rc == Errno.EFAILED and handle else 0
    raise error_for(rc, lib.dsckpt_err_name(rc).decode(), msg or strerror(rc), cause, load)


class _Handle:
    """A C handle freed once: by close() (idempotent), by leaving a ``with`` block or when
    garbage-collected. A subclass names the library's function that frees it (_FREE)."""

    _h: Optional[int] = None
    _FREE = ""

    @property
    def closed(self) -> bool:
        """Whether close() was called."""
        return self._h is None

    def close(self) -> None:
        """Frees the handle (idempotent)."""
        if self._h is not None:
            getattr(_lib.lib(), self._FREE)(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_h", None) is not None and _lib is not None:
            self.close()


class Connection(_Handle):
    """A connection to dsckptd, shareable by threads (calls are serialised by the library).

    ``socket`` defaults to ``$DSCKPT_SOCKET``, then ``/run/dsckptd/dsckptd.sock``. Pass
    ``job`` (with ``rank``, ``world_size`` and ``run``) to identify at once; a trainer must be
    identified before saving. ``run`` names the run of the job (the same on every rank of a
    run; a commit combines only one run's files): None takes it from the environment
    (``$DSCKPT_RUN_ID``, ``$TORCHELASTIC_RUN_ID``, SLURM's job, step and restart count, ...;
    see libdsckpt(3)), ``""`` is the unknown run. Closing leaves saves already ACCEPTED to the
    daemon; open saves keep the connection alive until they are freed.
    """

    _FREE = "dsckpt_close"

    def __init__(self, socket: Optional[str] = None, *, job: Optional[str] = None,
                 rank: int = 0, world_size: int = 1, run: Optional[str] = None):
        lib = _lib.lib()
        handle = ctypes.c_void_p()
        rc = lib.dsckpt_connect(_encode(socket, "socket") if socket else None,
                                ctypes.byref(handle))
        if rc < 0:
            _raise(None, rc)
        self._h: Optional[int] = handle.value
        self.socket = socket or os.environ.get("DSCKPT_SOCKET") or "/run/dsckptd/dsckptd.sock"
        self.job: Optional[str] = None
        self.rank = rank
        self.world_size = world_size
        self.run: Optional[str] = None
        if job is not None:
            try:
                self.identify(job, rank, world_size, run)
            except BaseException:
                self.close()
                raise

    def _handle(self) -> int:
        """The C handle; raises EPIPE once closed."""
        if self._h is None:
            raise error_for(Errno.EPIPE, "EPIPE", "connection to dsckptd was closed")
        return self._h

    def _check(self, rc: int) -> int:
        """Returns rc, or raises for a negative one with this connection's message."""
        if rc < 0:
            _raise(self._h, rc)
        return rc

    def identify(self, job: str, rank: int, world_size: int,
                 run: Optional[str] = None) -> None:
        """Identifies this process as ``rank`` of a ``world_size``-rank job, of ``run``
        (None: the environment's; ``""``: the unknown run). ``self.run`` is the run sent."""
        lib = _lib.lib()
        self._check(lib.dsckpt_identify_run(self._handle(), _encode(job, "job"), int(rank),
                                            int(world_size),
                                            None if run is None else _encode(run, "run")))
        self.job, self.rank, self.world_size = job, int(rank), int(world_size)
        self.run = lib.dsckpt_run(self._handle()).decode()

    def save(self, dir: str, file: str, defer: bool = False, early: bool = False) -> "Save":
        """Opens a save of ``dir/file.safetensors`` (+ ``.meta`` when blobs are added).
        ``defer``: the daemon hears of the save with its first request, at best one at
        :meth:`Save.end` for the whole save; what it refuses at the start (the directory,
        limits, a file being saved) is then raised by that call instead of this one.
        ``early``: the start goes to the daemon now but its answer is read by
        :meth:`Save.end` (one round trip then), so the daemon makes the directory and the
        file while the caller prepares the save; a refusal is raised there too."""
        out = ctypes.c_void_p()
        self._check(_lib.lib().dsckpt_save_begin_flags(
            self._handle(), _encode(dir, "dir"), _encode(file, "file"),
            (1 if defer else 0) | (2 if early else 0), ctypes.byref(out)))
        return Save(self, out.value, str(dir), str(file))

    def plan(self, tensors: Union[Iterable[TensorSpec], PackedTensors]) -> Plan:
        """Describes ``(name, dtype, shape, ptr, nbytes)`` tensors to the daemon once, as a
        :class:`Plan` that later saves add by its id (:meth:`Save.add_plan`). GPU memory and
        dsckpt host memory only: any other pointer raises NotSupported, nothing created."""
        packed = tensors if isinstance(tensors, PackedTensors) else pack_tensors(tensors)
        if packed is None:
            raise error_for(Errno.EINVAL, "EINVAL", "a save plan needs at least one tensor")
        out = ctypes.c_void_p()
        self._check(_lib.lib().dsckpt_plan_create(self._handle(), packed.records,
                                                  packed.count, ctypes.byref(out)))
        return Plan(self, out.value, packed.count)

    def load(self, dir: str, file: str) -> "Load":
        """Opens a load of ``dir/file.safetensors`` (a file of this user; the connection
        must be identified)."""
        out = ctypes.c_void_p()
        self._check(_lib.lib().dsckpt_load_begin(self._handle(), _encode(dir, "dir"),
                                                 _encode(file, "file"), ctypes.byref(out)))
        return Load(self, out.value, str(dir), str(file))

    def prefetch(self, dir: str, tag: Optional[str] = None, wait: bool = False) -> dict:
        """Has the daemon read a checkpoint ahead of its load (PREFETCH): ``dir`` is a tag
        directory, or a job directory whose tag is ``tag`` (None: the job's latest, on this
        node, else in its root's remote tier). A tag only the remote tier holds is pulled into
        the local tier first (only this user's; every object checked against its manifest);
        then its files are read into the daemon's cache as far as room allows. Returns once
        the daemon knows the tag, or with ``wait`` once it is done: a dict of ``dir``,
        ``tag``, ``bytes_pulled``, ``bytes_cached`` and ``seconds`` (0 without ``wait``).
        Needs an identified connection. Raises DsckptError ``ENOENT`` when no such tag is
        committed here or remotely, PermissionDenied for another user's, ``ECHECKSUM`` for a
        corrupt remote object."""
        info = _lib.PrefetchInfo()
        self._check(_lib.lib().dsckpt_prefetch(
            self._handle(), _encode(dir, "dir"), None if tag is None else _encode(tag, "tag"),
            1 if wait else 0, ctypes.byref(info)))
        return {"dir": info.dir.decode(), "tag": info.tag.decode(),
                "bytes_pulled": int(info.bytes_pulled), "bytes_cached": int(info.bytes_cached),
                "seconds": float(info.seconds)}

    def job_nodes(self, dir: str, nodes: Sequence[str], ranks: Sequence[int]) -> None:
        """Tells the daemon (NODES) that the job of job directory ``dir`` runs on the daemons
        named ``nodes`` (their ``host``) and that ``ranks`` are this node's: a replacement
        node of a new name and address restores those ranks from the peers, which serve it
        once their own trainers told them the same (``dsckpt.torch.tell_nodes`` does it on
        every rank). Raises NotSupported when peer copies are off on this node,
        PermissionDenied when ``dir`` (or the directory it would be made in) is another
        user's, and LimitReached past the user's ``max_held_mib_per_user`` (the earlier
        telling of the job stays)."""
        hosts = (ctypes.c_char_p * max(len(nodes), 1))(*[_encode(h, "host") for h in nodes])
        mine = (ctypes.c_uint * max(len(ranks), 1))(*ranks)
        self._check(_lib.lib().dsckpt_job_nodes(self._handle(), _encode(dir, "dir"), hosts,
                                                len(nodes), mine, len(ranks)))

    def commit(self, dir: str, timeout: Optional[float] = None) -> None:
        """Commits ``dir`` (MANIFEST.json, then ``latest``) once every save into it that
        this daemon holds is DURABLE and ranks 0..world_size-1 all have files there.
        Across nodes: call it on one rank after every rank's DURABLE wait."""
        self._check(_lib.lib().dsckpt_commit(self._handle(), _encode(dir, "dir"),
                                             _timeout_ms(timeout)))

    def seal(self, dir: str) -> bool:
        """Declares that this rank saves nothing more into this version of ``dir`` (a later save
        of ``dir`` begins its next version, staged in ``.<tag>.dsckpt-next``). Once every rank
        of the job has sealed it and every sealed file is DURABLE, the daemons commit ``dir``
        themselves (MANIFEST.json, then ``latest``), even if every trainer has died by then.
        Returns at once: True when ``dir`` is committed already."""
        return self._check(_lib.lib().dsckpt_seal(self._handle(), _encode(dir, "dir"))) == 1

    @property
    def max_tensors(self) -> int:
        """The most tensors one save or plan may hold on this daemon (its
        ``max_tensors_per_save``); more is refused with :class:`LimitReached` before anything
        is sent."""
        return int(_lib.lib().dsckpt_max_tensors(self._handle()))

    def release_gpu(self) -> None:
        """Lets the daemon let go of every GPU allocation this connection handed it (closed
        as soon as no save in flight reads it; a later save sends the handles again). Call
        it before freeing GPU memory that saves used, e.g. before torch.cuda.empty_cache():
        CUDA calls freeing memory another process still has open undefined behaviour."""
        self._check(_lib.lib().dsckpt_release_gpu(self._handle()))

    @property
    def last_error(self) -> str:
        """The message of the last failed call on this connection."""
        return _lib.lib().dsckpt_last_error(self._h).decode(errors="replace")

    def __repr__(self) -> str:
        state = "closed" if self._h is None else f"job={self.job!r} rank={self.rank}"
        return f"<dsckpt.Connection {self.socket} {state}>"


class Plan(_Handle):
    """Tensors described to the daemon once (a save plan, :meth:`Connection.plan`), added to
    any later save of the same connection by :meth:`Save.add_plan` for the cost of an id.

    The library checks before each use that every allocation the plan points into is still
    the one it was made from, and sends the plan whole again when one is not (so a stale plan
    never saves a wrong byte); the tensors must keep their pointers, dtypes and shapes (a
    tensor that moved needs a new plan). Plans take GPU memory and dsckpt host memory only
    (:class:`HostBuffer`). Close it when it is replaced (the daemon forgets it; ended saves
    are unaffected); it dies with its connection.
    """

    _FREE = "dsckpt_plan_free"

    def __init__(self, conn: "Connection", handle: int, count: int):
        self.conn = conn
        self._h: Optional[int] = handle
        self.count = count

    def _handle(self) -> int:
        """The C handle; raises ESTATE once closed."""
        if self._h is None:
            raise error_for(Errno.ESTATE, "ESTATE", "save plan was closed")
        return self._h

    def __repr__(self) -> str:
        return f"<dsckpt.Plan {self.count} tensors{' closed' if self._h is None else ''}>"


class Save(_Handle):
    """One file being saved. Add tensors and blobs, then :meth:`end` it (or leave a
    ``with`` block: a clean exit ends the save, an exception abandons it). After the end the
    handle stays valid for :meth:`wait` and :meth:`progress` until :meth:`close`, which
    frees the client's handle: a save never ended is abandoned, an ended one goes on in the
    daemon."""

    _FREE = "dsckpt_save_free"

    def __init__(self, conn: Connection, handle: int, dir: str, file: str):
        self.conn = conn
        self.dir = dir
        self.file = file
        self._h: Optional[int] = handle
        self.ended = False
        self.level = Level.NONE

    @property
    def path(self) -> str:
        """The tensor file this save writes."""
        return os.path.join(self.dir, self.file + ".safetensors")

    def _handle(self) -> int:
        """The C handle; raises ESTATE once closed."""
        if self._h is None:
            raise error_for(Errno.ESTATE, "ESTATE", f"save {self.file} was closed")
        return self._h

    def add_tensor(self, name: str, dtype: str, shape: Sequence[int], ptr: int,
                   nbytes: int) -> None:
        """Adds ``nbytes`` at address ``ptr`` (host, dsckpt host memory or CUDA) as tensor
        ``name`` of safetensors ``dtype`` and ``shape``. CUDA and dsckpt host memory are
        handed over by reference and must stay unchanged until SNAPSHOT; other host memory
        is copied before this returns."""
        dims = (ctypes.c_int64 * max(len(shape), 1))(*[int(d) for d in shape])
        self.conn._check(_lib.lib().dsckpt_add_tensor(
            self._handle(), _encode(name, "tensor name"), _encode(dtype, "dtype"), dims,
            len(shape), ptr or None, int(nbytes)))

    def add_tensors(self, tensors: Union[Iterable[TensorSpec], PackedTensors]) -> None:
        """Adds many ``(name, dtype, shape, ptr, nbytes)`` tensors (or tensors packed once by
        :func:`pack_tensors`), as :meth:`add_tensor` each, in one library call (a ctypes call
        costs microseconds; a model has thousands of tensors). On a failure the tensors
        before the failing one stay added."""
        packed = tensors if isinstance(tensors, PackedTensors) else pack_tensors(tensors)
        if packed is None:
            return
        added = ctypes.c_size_t()
        self.conn._check(_lib.lib().dsckpt_add_tensors(self._handle(), packed.records,
                                                       packed.count, ctypes.byref(added)))

    def add_plan(self, plan: Plan) -> bool:
        """Adds a plan's tensors (in the plan's order) by its id alone; True when the library
        had to send the plan whole (an allocation it points into was freed or replaced).
        The plan must be of this save's connection; its names must not clash with the
        save's other tensors."""
        rc = self.conn._check(_lib.lib().dsckpt_add_plan(self._handle(), plan._handle()))
        return rc == 1

    def prepare_plan(self, plan: Plan) -> None:
        """Starts the check of ``add_plan(plan)`` on this save (its driver queries, as of now)
        on a thread of the library; add_plan then waits for it and uses its answers. No
        allocation under the plan may be freed in between. Nothing is started for host
        memory or without the CUDA driver."""
        self.conn._check(_lib.lib().dsckpt_plan_prepare(self._handle(), plan._handle()))

    def add_array(self, name: str, array) -> None:
        """Adds a C-contiguous numpy array (copied unless it lies in a HostBuffer)."""
        if not array.flags["C_CONTIGUOUS"]:
            raise error_for(Errno.EINVAL, "EINVAL", f"array {name} is not C-contiguous")
        dtype = NUMPY_DTYPES.get(array.dtype.str.lstrip("<|="))
        if dtype is None:
            raise error_for(Errno.EINVAL, "EINVAL",
                            f"array {name}: numpy dtype {array.dtype} has no safetensors name")
        self.add_tensor(name, dtype, array.shape, array.ctypes.data, array.nbytes)

    def add_blob(self, name: str, data: BytesLike) -> None:
        """Attaches an opaque named blob (copied now), stored in ``file.meta``; blobs of up
        to 1 MiB in all go with :meth:`end`'s request."""
        data = bytes(data)
        self.conn._check(_lib.lib().dsckpt_add_blob(self._handle(), _encode(name, "blob name"),
                                                    data, len(data)))

    def set_stream(self, stream: int) -> None:
        """Names the CUDA stream (``torch.cuda.Stream.cuda_stream``) whose queued work
        writes this save's GPU tensors; the daemon's copies wait for it."""
        self.conn._check(_lib.lib().dsckpt_save_set_stream(self._handle(), stream or None))

    def end(self) -> Level:
        """Hands the save to the daemon; returns ACCEPTED (about a millisecond)."""
        self.conn._check(_lib.lib().dsckpt_save_end(self._handle()))
        self.ended = True
        self.level = Level.ACCEPTED
        return self.level

    def wait(self, level: Level = Level.DURABLE, timeout: Optional[float] = None) -> Level:
        """Waits until the save reaches ``level``; returns the level reached. Raises
        :class:`~dsckpt.errors.SaveFailed` with the daemon's reason, or
        :class:`~dsckpt.errors.DsckptTimeout`."""
        rc = _lib.lib().dsckpt_wait(self._handle(), int(level), _timeout_ms(timeout))
        if rc == Errno.EFAILED:
            self.level = Level.FAILED
        self.conn._check(rc)
        self.level = Level(rc)
        return self.level

    def progress(self) -> SaveProgress:
        """The save's level and byte counters now, without waiting (FAILED does not raise:
        the reason is in ``conn.last_error``)."""
        p = _lib.Progress()
        self.conn._check(_lib.lib().dsckpt_save_progress(self._handle(), ctypes.byref(p)))
        self.level = Level(p.level)
        return SaveProgress(Level(p.level), p.bytes_total, p.bytes_snapshot, p.bytes_flushed)

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.close()
        elif not self.ended:
            self.end()

    def __repr__(self) -> str:
        return f"<dsckpt.Save {self.path} {self.level.name}>"


class Load(_Handle):
    """One file being loaded into the caller's memory. Name the destinations, then
    :meth:`end` and :meth:`wait` (or leave a ``with`` block: a clean exit ends the load and
    waits until LOADED, an exception abandons it). Destinations must stay allocated, and
    unused by anyone else, until :meth:`wait` has returned. :meth:`close` frees the client's
    handle: a load never ended is abandoned, a running one goes on in the daemon until the
    connection closes."""

    _FREE = "dsckpt_load_free"

    def __init__(self, conn: Connection, handle: int, dir: str, file: str):
        self.conn = conn
        self.dir = dir
        self.file = file
        self._h: Optional[int] = handle
        self.level = LoadLevel.OPEN

    @property
    def path(self) -> str:
        """The tensor file this load reads."""
        return os.path.join(self.dir, self.file + ".safetensors")

    @property
    def source(self) -> str:
        """Where the daemon takes the bytes from: ``"cache"`` (its host cache holds the whole
        file), ``"file"``, ``"remote"`` (the tag was pulled from the root's remote tier
        into the local tier first) or ``"peer"`` (from other nodes' peer copies first)."""
        return _lib.lib().dsckpt_load_source(self._handle()).decode()

    def _handle(self) -> int:
        """The C handle; raises ESTATE once closed."""
        if self._h is None:
            raise error_for(Errno.ESTATE, "ESTATE", f"load of {self.file} was closed")
        return self._h

    def _check(self, rc: int) -> int:
        """Returns rc, or raises for a negative one (LoadFailed for a failed load)."""
        if rc < 0:
            _raise(self.conn._h, rc, load=True)
        return rc

    def add_tensors(self, tensors: Iterable[TensorSpec]) -> None:
        """Names where ``(name, dtype, shape, ptr, nbytes)`` tensors of the file go (host,
        dsckpt host memory or CUDA). A name the file lacks, or a dtype or shape other than
        the file's, is reported by :meth:`end` with every other mismatch."""
        packed = pack_tensors(tensors)
        if packed is None:
            return
        added = ctypes.c_size_t()
        self._check(_lib.lib().dsckpt_load_add_tensors(self._handle(), packed.records,
                                                      packed.count, ctypes.byref(added)))

    def add_array(self, name: str, array) -> None:
        """Names a writable C-contiguous numpy array as the destination of tensor ``name``."""
        if not array.flags["C_CONTIGUOUS"] or not array.flags["WRITEABLE"]:
            raise error_for(Errno.EINVAL, "EINVAL",
                            f"array {name} is not a writable C-contiguous array")
        dtype = NUMPY_DTYPES.get(array.dtype.str.lstrip("<|="))
        if dtype is None:
            raise error_for(Errno.EINVAL, "EINVAL",
                            f"array {name}: numpy dtype {array.dtype} has no safetensors name")
        self.add_tensors([(name, dtype, array.shape, array.ctypes.data, array.nbytes)])

    def set_stream(self, stream: int) -> None:
        """Names the CUDA stream (``torch.cuda.Stream.cuda_stream``) whose queued work still
        uses the GPU destinations; the daemon's writes wait for it."""
        self._check(_lib.lib().dsckpt_load_set_stream(self._handle(), stream or None))

    def end(self) -> LoadLevel:
        """Starts the load; raises InvalidArgument naming every destination that does not
        match the file (nothing was written then)."""
        self._check(_lib.lib().dsckpt_load_end(self._handle()))
        self.level = LoadLevel.ACCEPTED
        return self.level

    def wait(self, timeout: Optional[float] = None) -> LoadLevel:
        """Waits until every byte is in place and checked; returns LOADED. Raises
        :class:`~dsckpt.errors.LoadFailed` (``cause`` e.g. ECHECKSUM) or DsckptTimeout."""
        rc = _lib.lib().dsckpt_load_wait(self._handle(), _timeout_ms(timeout))
        if rc == Errno.EFAILED:
            self.level = LoadLevel.FAILED
        self._check(rc)
        self.level = LoadLevel(rc)
        return self.level

    def progress(self) -> LoadProgress:
        """The load's level and byte counters now, without waiting (FAILED does not raise:
        the reason is in ``conn.last_error``)."""
        lib = _lib.lib()
        if self.level == LoadLevel.ACCEPTED:
            rc = lib.dsckpt_load_wait(self._handle(), 0)
            if rc == Errno.EFAILED:
                self.level = LoadLevel.FAILED
            elif rc != Errno.ETIMEDOUT:
                self.level = LoadLevel(self._check(rc))
        total, done = ctypes.c_uint64(), ctypes.c_uint64()
        lib.dsckpt_load_progress(self._handle(), ctypes.byref(total), ctypes.byref(done))
        return LoadProgress(self.level, total.value, done.value)

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.close()
            return
        if self.level == LoadLevel.OPEN:
            self.end()
        if self.level == LoadLevel.ACCEPTED:
            self.wait()

    def __repr__(self) -> str:
        return f"<dsckpt.Load {self.path} {self.level.name}>"


__all__ = ["Connection", "Save", "Load", "Plan", "PackedTensors", "pack_tensors", "Level",
           "LoadLevel", "SaveProgress", "LoadProgress", "HostBuffer", "DsckptError", "version",
           "strerror", "err_name", "in_host_buffer"]
