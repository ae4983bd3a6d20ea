"""dsckpt.deepspeed — a DeepSpeed checkpoint engine that saves through dsckptd.

It has DeepSpeed's ``CheckpointEngine`` interface (create / save / load / commit / makedirs
/ is_data_parallel_writer / is_decoupled / get_commit_info / cleanup /
preserves_storage_sharing) and subclasses DeepSpeed's class when DeepSpeed is installed; the
module imports without DeepSpeed. Tested with DeepSpeed 0.19.8, ZeRO stages 1 to 3, bf16 and
fp32 (tests/gpu/ds_train.py). Turn it on from the DeepSpeed config: a ``"dsckpt"`` (or
``"datastates_ckpt"``) block, and one line before ``deepspeed.initialize``::

    import dsckpt.deepspeed.auto               # = dsckpt.deepspeed.enable()
    engine, optimizer, _, _ = deepspeed.initialize(model=model, config=ds_config, ...)

Every engine whose config has the block then gets this engine in place of the one DeepSpeed
would pick; other engines are left alone. With no daemon on the socket, initialize raises
:class:`dsckpt.DaemonUnavailable` naming the socket, on every rank (they agree first, so no
rank is left waiting in a collective). Or plug it into an engine after
``deepspeed.initialize`` (on every rank: it makes a gloo group for its commits)::

    engine, optimizer, _, _ = deepspeed.initialize(model=model, config=ds_config, ...)
    dsckpt.deepspeed.install(engine)           # reads ds_config["dsckpt"] or ["datastates_ckpt"]
    # or install(engine, {"socket": ..., "job": ...}) to pass the block itself
    ...
    engine.save_checkpoint(save_dir)           # returns after ~1 ms per file
    ...
    engine.load_checkpoint(save_dir)           # follows `latest`, reads our files

When each thing happens (DeepSpeed's decoupled-engine protocol, which this engine asks for by
answering ``is_decoupled() == True``):

* ``save_checkpoint`` → ``create(info)``, then ``save(state_dict, path)`` for each file: the
  tensors are handed to the daemon by reference and ``save`` returns once ACCEPTED.
* The next ``engine.step()`` at a gradient-accumulation boundary calls ``commit(info)``
  right before the optimizer step: that is where this engine waits for SNAPSHOT (usually
  long reached while forward/backward ran). It then queues the rest to a background thread
  and returns: wait until this rank's files are DURABLE, agree across ranks (all-reduce on
  the engine's own gloo group, so training collectives are never interleaved), and rank 0
  asks its daemon to commit (MANIFEST.json, then ``latest``). ``get_commit_info`` reports
  ``save_latest=False`` to DeepSpeed so that DeepSpeed does not write ``latest`` before the
  daemon has committed: the daemon writes it (:mod:`.committer`: one tag's steps).
* ``cleanup()`` (DeepSpeed's ``destroy``, also run when the engine is garbage-collected)
  commits what is pending and waits for the background commits; ``wait_committed()`` does the
  same on demand and raises the first failure; after ``close()`` neither waits. A failed
  checkpoint is logged, never raised into ``engine.step()``: training goes on, ``latest`` stays.
* A fixed tag (``save_checkpoint(dir, tag="last")`` at every save): the daemon stages each
  new version beside the committed one and exchanges them in one step at the commit, so the
  tag is always one whole version. A save of the tag whose previous version is still queued
  for its commit waits for that commit first (inside ``save_checkpoint``, logged), and a file
  saved twice into one tag before a commit waits for its first save's DURABLE: versions
  commit in order and the daemon never refuses the second save.

Files: DeepSpeed's path ``<dir>/mp_rank_00_model_states.pt`` becomes
``<dir>/mp_rank_00_model_states.pt.safetensors`` (+ ``.meta``), and once the file is
DURABLE a relative symlink at the original path points at it, so DeepSpeed's globbing and
existence checks find it (a new version's links are made beside its files in the staging
directory, and travel with them). Every rank contributes at least one file to a tag directory
(an empty ``dsckpt_rank<N>`` file for a rank DeepSpeed gave nothing), as the daemon's commit
requires. The ``zero_to_fp32.py`` DeepSpeed copies beside the tags is ours (:mod:`.recovery`).

Configuration: a block ``"dsckpt"`` (or, so existing configs keep working,
``"datastates_ckpt"``) of the DeepSpeed config. Keys: ``socket`` (else $DSCKPT_SOCKET),
``job`` (else $DSCKPT_JOB, else ``"deepspeed"``), ``timeout`` (seconds for waits and
commits; default none), ``weights_only`` (default true: :meth:`DsckptCheckpointEngine.load`
unpickles nothing, and a file holding values that load only by unpickling raises
:class:`dsckpt.PickleRefused`; false unpickles them, running whatever code the checkpoint's
author put there: only for checkpoints whose author you trust). ``host_cache_size`` is the
daemon's setting (dsckptd.json) and is only logged here; any other key is logged and ignored.

DeepSpeed's own objects in its optimizers' state dicts (ZeRO stages 1 to 3, bf16, fp16: the
loss scaler, ``ZeroStageEnum``, the ``fragment_address`` dataclasses of
``param_slice_mappings``; :data:`SAFE_TYPES`) are allowed classes of the checkpoint format
(:func:`dsckpt.add_safe_types`): the engine allows them when it is made (:func:`allow_types`),
so its saves hold them by name and state, and its loads make them again without unpickling.
A resume with the default ``weights_only`` works; only objects of other classes (a client
state's own) still need ``"weights_only": false`` or :func:`dsckpt.add_safe_types`.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import queue
import threading
from typing import Any, Dict, List, Optional, Set, Tuple, Union

import torch

from .. import _remote, _tree
from .. import torch as dtorch
from ..core import Connection
from ..errors import DsckptError, Errno, error_for
from .committer import Job, commit_tag, job_dirs
from .recovery import use_our_script

log = logging.getLogger("dsckpt.deepspeed")

try:  # DeepSpeed ≥ 0.16 (CheckpointCommitInfo); older ones pass tags as strings.
    from deepspeed.runtime.checkpoint_engine.checkpoint_engine import \
        CheckpointEngine as _Base
except ImportError:
    _Base = object
try:
    from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointCommitInfo
except ImportError:
    @dataclasses.dataclass
    class CheckpointCommitInfo:  # type: ignore[no-redef]
        """What DeepSpeed tells a checkpoint engine about a tag being saved."""

        tag: str
        save_dir: Optional[str]
        save_latest: bool

KNOWN_KEYS = {"socket", "job", "timeout", "enabled", "weights_only"}
BLOCK_KEYS = ("dsckpt", "datastates_ckpt")
DEFAULT_SOCKET = "/run/dsckptd/dsckptd.sock"
DAEMON_KEYS = {"host_cache_size"}
# DeepSpeed's classes in its optimizers' state dicts: module → class names. The loss scaler
# (ZeRO 1-3 and fp16 save it whole), the ZeRO stage (ZeRO 1-3), the fragment addresses of
# param_slice_mappings (ZeRO 1-2, bf16).
SAFE_TYPES = {"deepspeed.runtime.fp16.loss_scaler": ("LossScaler", "DynamicLossScaler"),
              "deepspeed.runtime.zero.config": ("ZeroStageEnum",),
              "deepspeed.utils.tensor_fragment": ("fragment_address",)}


def allow_types() -> List[type]:
    """Allows the classes of :data:`SAFE_TYPES` this DeepSpeed has (see
    :func:`dsckpt.add_safe_types`) and returns them; none without DeepSpeed. Every
    :class:`DsckptCheckpointEngine` calls it when made."""
    return _tree.allow_installed(SAFE_TYPES)


def config_block(config_params: Any) -> dict:
    """The ``dsckpt`` (else ``datastates_ckpt``) block of a DeepSpeed config: a
    DeepSpeedConfig, a config dict, or the block itself as a dict."""
    if config_params is None:
        return {}
    params = getattr(config_params, "_param_dict", config_params)
    if not isinstance(params, dict):
        return {}
    for key in BLOCK_KEYS:
        if key in params:
            return dict(params[key] or {})
    if set(params) <= KNOWN_KEYS | DAEMON_KEYS or not params:
        return dict(params)
    return {}


def _info_of(info: Any) -> Optional[CheckpointCommitInfo]:
    """A CheckpointCommitInfo from what DeepSpeed passed (an info, a tag string, None)."""
    if info is None or isinstance(info, CheckpointCommitInfo):
        return info
    if isinstance(info, str):
        return CheckpointCommitInfo(tag=info, save_dir=None, save_latest=True)
    return CheckpointCommitInfo(tag=info.tag, save_dir=info.save_dir,
                                save_latest=info.save_latest)


def _detached(error: DsckptError) -> DsckptError:
    """error without its traceback, nor those of the errors it chains to: an error the
    engine keeps for wait_committed() would otherwise hold the frame that caught it, which
    holds the engine (a reference cycle, freed only by the collector, on whichever thread
    runs it). Its type and message stay; wait_committed() raises it with a new traceback."""
    seen: Set[int] = set()
    todo: List[Optional[BaseException]] = [error]
    while todo:
        e = todo.pop()
        if e is not None and id(e) not in seen:
            seen.add(id(e))
            e.__traceback__ = None
            todo += [e.__cause__, e.__context__]
    return error


class DsckptCheckpointEngine(_Base):
    """DeepSpeed checkpoint engine over dsckptd (see the module docstring)."""

    def __init__(self, config_params: Any = None, rank: Optional[int] = None, *,
                 config: Optional[dict] = None, conn: Optional[Connection] = None):
        if _Base is not object:
            super().__init__(config_params)
        self.name = "DsckptCheckpointEngine"
        self.safe_types = allow_types()
        block = dict(config) if config is not None else config_block(config_params)
        self._read_config(block)
        dist = torch.distributed
        self._dist = dist.is_available() and dist.is_initialized()
        # The job's rank: torch.distributed's when initialized, else rank, $RANK or 0.
        self.rank, self.world_size = dtorch.dist_rank_world()
        if not self._dist and rank is not None:
            self.rank = int(rank)
        self.group = dist.new_group(backend="gloo") if self._dist else None
        self.conn = conn or self._connect()
        self._commit_conn: Optional[Connection] = None
        self.commit_info: Optional[CheckpointCommitInfo] = None
        self._saves: List[Tuple[str, dtorch.SaveHandle]] = []  # of the current tag
        self._unsnapped: List[dtorch.SaveHandle] = []           # below SNAPSHOT, maybe
        self.failures: List[DsckptError] = []
        self.committed: List[str] = []
        # Tag directories queued to the committer thread (a count each), under _lock.
        self._queued: Dict[str, int] = {}
        self._lock = threading.Lock()
        # Job: a tag to commit; Event: set it when reached; None: stop.
        self._jobs: "queue.Queue[Union[Job, threading.Event, None]]" = queue.Queue()
        self._thread = threading.Thread(target=self._committer, name="dsckpt-commit",
                                        daemon=True)
        self._thread.start()

    def _connect(self) -> Connection:
        """Connects to the daemon; when any rank cannot, every rank raises (they agree on
        the engine's gloo group first), naming the socket and what to do."""
        conn, error = None, None
        try:
            conn = Connection(self.socket, job=self.job, rank=self.rank,
                              world_size=self.world_size)
        except DsckptError as e:
            error = e
        (ok,) = self._min(int(error is None))
        if ok:
            return conn
        if conn is not None:
            conn.close()
        socket = self.socket or os.environ.get("DSCKPT_SOCKET") or DEFAULT_SOCKET
        if error is None:
            raise error_for(Errno.ECONNREFUSED, "ECONNREFUSED", "dsckpt checkpoint engine: "
                            f"another rank found no dsckptd (this rank's, {socket}, answered); "
                            "see that rank's error")
        raise error_for(error.code, error.name, "dsckpt checkpoint engine: no dsckptd for "
                        f"{socket} ({error.message}). Start the daemon (systemctl start "
                        "dsckptd.socket, or dsckptd -c CONFIG), or name its socket in the "
                        "config block's \"socket\" or $DSCKPT_SOCKET; without the "
                        "\"dsckpt\"/\"datastates_ckpt\" block DeepSpeed saves with "
                        "torch.save") from error

    def _read_config(self, block: dict) -> None:
        """Takes our keys from the config block; logs the daemon's and unknown ones."""
        self.socket: Optional[str] = block.get("socket")
        self.job: str = block.get("job") or os.environ.get("DSCKPT_JOB") or "deepspeed"
        t = block.get("timeout")
        self.timeout: Optional[float] = float(t) if t is not None else None
        self.weights_only: bool = block.get("weights_only", True) is not False
        for key in sorted(set(block) - KNOWN_KEYS):
            if key in DAEMON_KEYS:
                log.info("dsckpt: %s=%r is set in the daemon's dsckptd.json, not here",
                         key, block[key])
            else:
                log.warning("dsckpt: unknown config key %r ignored", key)

    # -- DeepSpeed's interface ----------------------------------------------------------

    def create(self, info: Any) -> None:
        """Starts a tag; a tag still pending from an earlier save is committed first."""
        info = _info_of(info)
        if self.commit_info is not None and info is not None and info != self.commit_info:
            self.commit(self.commit_info)
        self.commit_info = info

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        """Creates a directory (the daemon also creates missing ones at save time)."""
        os.makedirs(path, exist_ok=exist_ok)

    def save(self, state_dict: Any, path: str) -> None:
        """Hands state_dict to the daemon as ``path.safetensors``; returns once ACCEPTED.
        A tag saved again (``tag="last"``) whose previous version is not committed yet
        waits for that commit first, so that versions commit in order, each replacing the
        last in one step (the daemon stages the new one beside the tag)."""
        path = os.path.abspath(path)
        with self._lock:
            queued = self._queued.get(os.path.dirname(path), 0)
        if queued:
            log.info("dsckpt: %s is saved again before its previous version was "
                     "committed: waiting for that commit", os.path.dirname(path))
            self._drain()
        for saved, handle in [(p, h) for p, h in self._saves if p == path]:
            try:  # the same file twice in one tag: the second replaces the first, in order
                handle.wait_durable(self.timeout)
            except DsckptError as e:  # kept for wait_committed(), never raised here
                log.error("dsckpt: save %s failed: %s", handle.path, e)
                self.failures.append(_detached(e))
            self._saves.remove((saved, handle))
        handle = dtorch.save(state_dict, os.path.dirname(path), conn=self.conn,
                             file=os.path.basename(path), track=False)
        self._saves.append((path, handle))
        self._unsnapped.append(handle)

    def load(self, path: str, map_location=None) -> Any:
        """Loads a file this engine saved (or, failing that, a torch.save file); through the
        engine's daemon, from its host cache when it still holds the file. Unpickles
        nothing unless the config block's ``weights_only`` is false."""
        path = self._durable_path(path)
        # A tag only the root's remote tier holds: the daemon pulls it here first.
        _remote.ensure_local(dtorch._daemon(self.conn, os.path.dirname(path)),
                             os.path.dirname(path), os.path.basename(path) + ".safetensors")
        if os.path.exists(path + ".safetensors"):
            return dtorch.load(os.path.dirname(path), os.path.basename(path), map_location,
                               conn=self.conn, weights_only=self.weights_only)
        return torch.load(path, map_location=map_location, weights_only=self.weights_only)

    def load_into(self, state_dict: Any, path: str, strict: bool = True) -> str:
        """Restores existing tensors in place from a file this engine saved, e.g. a
        module's ``{"module": engine.module.state_dict()}`` from DeepSpeed's model states
        file with ``strict=False`` (see :func:`dsckpt.torch.load_into`); no copy of the
        state dict is built. DeepSpeed's own ``load_checkpoint`` goes through :meth:`load`."""
        path = self._durable_path(path)
        return dtorch.load_into(state_dict, os.path.dirname(path), os.path.basename(path),
                                conn=self.conn, strict=strict)

    def _durable_path(self, path: str) -> str:
        """The absolute path, once a save of it by this engine is DURABLE."""
        path = os.path.abspath(path)
        for saved, handle in self._saves:
            if saved == path:
                handle.wait_durable(self.timeout)
        return path

    def commit(self, info: Any) -> bool:
        """Waits for SNAPSHOT of every save so far (DeepSpeed calls this right before the
        optimizer step) and queues the DURABLE wait and the commit to the background."""
        info = _info_of(info)
        self.wait_snapshot()
        if info is None:
            return False
        tag_dir = os.path.abspath(os.path.join(info.save_dir, info.tag)) \
            if info.save_dir is not None else None
        job = Job(info.tag, tag_dir, self._saves)
        with self._lock:
            for d in job_dirs(job):
                self._queued[d] = self._queued.get(d, 0) + 1
        self._jobs.put(job)
        self._saves = []
        if self.commit_info is not None and self.commit_info.tag == info.tag:
            self.commit_info = None
        return True

    def is_data_parallel_writer(self, dp_rank: int) -> bool:
        """Data-parallel rank 0 writes the replicated state (DeepSpeed's default)."""
        return dp_rank == 0

    def is_decoupled(self) -> bool:
        """True: DeepSpeed defers commit() to the next step, which is when we must wait."""
        return True

    def set_commit_info(self, info: Any) -> None:
        """Sets the tag pending commit."""
        self.commit_info = _info_of(info)

    def get_commit_info(self) -> Optional[CheckpointCommitInfo]:
        """The pending tag, with save_latest False: the daemon writes ``latest`` itself, at
        commit, and DeepSpeed must not point it at a tag before that."""
        if self.commit_info is None:
            return None
        return dataclasses.replace(self.commit_info, save_latest=False)

    def cleanup(self) -> None:
        """Commits what is pending and waits for every background commit."""
        if self.commit_info is not None:
            self.commit(self.commit_info)
        self._drain()

    def preserves_storage_sharing(self) -> bool:
        """False: tensors go by reference as views, so DeepSpeed need not clone them."""
        return False

    # -- ours ---------------------------------------------------------------------------

    def wait_snapshot(self) -> None:
        """Waits until every save so far is in the daemon (tensors may change after);
        a failed save is logged and reported by wait_committed()."""
        pending, self._unsnapped = self._unsnapped, []
        for handle in pending:
            try:
                handle.wait_snapshot(self.timeout)
            except DsckptError as e:
                log.error("dsckpt: save %s failed: %s", handle.path, e)

    def wait_committed(self) -> List[str]:
        """Commits what is pending, waits for the background commits, and returns the
        tag directories committed so far; raises the first failure (once)."""
        self.cleanup()
        if self.failures:
            del self.failures[1:]  # raised from no local: a frame holding what it raised
            raise self.failures.pop()  # is a reference cycle (dsckpt.torch._agree_run)
        return list(self.committed)

    def close(self) -> None:
        """cleanup(), then stops the committer thread and closes the connections (once;
        DeepSpeed's destroy() may still call cleanup() afterwards)."""
        if not self._thread.is_alive():
            return
        self.cleanup()
        self._jobs.put(None)
        self._thread.join()
        self.conn.close()
        if self._commit_conn is not None:
            self._commit_conn.close()

    def _drain(self) -> None:
        """Waits until the committer thread has finished every queued tag."""
        if not self._thread.is_alive():
            return
        done = threading.Event()
        self._jobs.put(done)
        done.wait()

    # -- the committer thread -----------------------------------------------------------

    def _committer(self) -> None:
        """Runs queued tags in order (every rank queues the same tags in the same order,
        so the collectives of the engine's gloo group match up)."""
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if isinstance(job, threading.Event):
                job.set()
                continue
            try:
                commit_tag(self, job)
            except DsckptError as e:
                log.error("dsckpt: checkpoint %s not committed: %s", job.tag_dir or job.tag, e)
                self.failures.append(_detached(e))
            except Exception as e:  # never let the thread die: later tags must still agree
                log.exception("dsckpt: checkpoint %s not committed", job.tag_dir or job.tag)
                self.failures.append(error_for(Errno.EIO, "EIO", repr(e)))
            finally:
                with self._lock:
                    for d in job_dirs(job):
                        self._queued[d] -= 1
                        if not self._queued[d]:
                            del self._queued[d]

    def _min(self, *values: int) -> List[int]:
        """Element-wise minimum over the engine's group (identity without one)."""
        if self.group is None:
            return list(values)
        t = torch.tensor(values, dtype=torch.int64)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN, group=self.group)
        return [int(v) for v in t.tolist()]

def install(engine: Any, config: Optional[dict] = None) -> DsckptCheckpointEngine:
    """Replaces a DeepSpeed engine's checkpoint engine with ours (call on every rank).
    The config block comes from ``config`` or the engine's DeepSpeed config."""
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    ours = DsckptCheckpointEngine(getattr(engine, "_config", None), rank=rank, config=config)
    old = getattr(engine, "checkpoint_engine", None)
    if old is not None and hasattr(old, "cleanup") and old.is_decoupled():
        old.cleanup()
    engine.checkpoint_engine = ours
    use_our_script(type(engine))
    return ours


def wanted(config_params: Any) -> bool:
    """Whether a DeepSpeed config (a DeepSpeedConfig or a dict) turns dsckpt on: it has a
    ``dsckpt`` or ``datastates_ckpt`` block whose ``enabled`` is not false."""
    params = getattr(config_params, "_param_dict", config_params)
    if not isinstance(params, dict):
        return False
    key = next((k for k in BLOCK_KEYS if k in params), None)
    return key is not None and (params[key] or {}).get("enabled", True) is not False


def _engine_for(config_params: Any) -> DsckptCheckpointEngine:
    """Our engine for a DeepSpeed config that wanted() it, on this rank."""
    log.info("dsckpt: the DeepSpeed config's block selects DsckptCheckpointEngine")
    return DsckptCheckpointEngine(config_params, rank=torch.distributed.get_rank()
                                  if torch.distributed.is_initialized() else 0)


def enable() -> None:
    """Makes every DeepSpeed engine created from now on whose config has a ``dsckpt`` (or
    ``datastates_ckpt``) block use :class:`DsckptCheckpointEngine` (see :func:`wanted`);
    other engines keep DeepSpeed's choice. Call it before ``deepspeed.initialize`` (or
    ``import dsckpt.deepspeed.auto``); calling it again does nothing.

    DeepSpeed ≥ 0.17 picks its engine in ``create_checkpoint_engine``, which
    ``deepspeed.runtime.engine`` imports by name: that name is wrapped. Older ones build it
    in ``DeepSpeedEngine._configure_checkpointing``: the engine is replaced right after."""
    try:
        import deepspeed.runtime.engine as ds_engine
    except ImportError as e:
        raise ImportError(f"dsckpt.deepspeed.enable: DeepSpeed cannot be imported ({e})") from e
    use_our_script(ds_engine.DeepSpeedEngine)
    create = getattr(ds_engine, "create_checkpoint_engine", None)
    if create is not None:
        if getattr(create, "_dsckpt", False):
            return

        def create_checkpoint_engine(*args, **kwargs):
            """Ours for a config with the block, else what DeepSpeed would create."""
            config_params = kwargs.get("config_params", args[0] if args else None)
            if wanted(config_params):
                return _engine_for(config_params)
            return create(*args, **kwargs)

        create_checkpoint_engine._dsckpt = True  # type: ignore[attr-defined]
        ds_engine.create_checkpoint_engine = create_checkpoint_engine
        return
    cls = ds_engine.DeepSpeedEngine
    configure = cls._configure_checkpointing
    if getattr(configure, "_dsckpt", False):
        return

    def _configure_checkpointing(self, *args, **kwargs):
        """DeepSpeed's set-up, then ours in place of its engine for a config with the block."""
        configure(self, *args, **kwargs)
        if wanted(self._config):
            self.checkpoint_engine = _engine_for(self._config)

    _configure_checkpointing._dsckpt = True  # type: ignore[attr-defined]
    cls._configure_checkpointing = _configure_checkpointing


__all__ = ["DsckptCheckpointEngine", "CheckpointCommitInfo", "install", "config_block",
           "enable", "wanted", "allow_types", "SAFE_TYPES"]
