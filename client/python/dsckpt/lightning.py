"""dsckpt.lightning — a Lightning ``CheckpointIO`` that saves through dsckptd.

One line in the trainer's construction is all a user adds::

    from dsckpt.lightning import DsckptCheckpointIO

    trainer = Trainer(plugins=[DsckptCheckpointIO()],          # socket: $DSCKPT_SOCKET
                      callbacks=[ModelCheckpoint(dirpath="/var/lib/dsckpt/llama", ...)])
    trainer.fit(model)
    trainer.fit(model, ckpt_path="/var/lib/dsckpt/llama/epoch=0-step=100.ckpt")  # resume

When each thing happens:

* ``save_checkpoint(checkpoint, path)`` (Lightning calls it on global rank 0 only, as every
  strategy that hands its checkpoint to a ``CheckpointIO`` does) hands the dict's tensors to
  the daemon by reference with :func:`dsckpt.torch.save` — everything else (loops,
  callbacks, hyper-parameters, epoch and step) travels in the skeleton of the ``.meta``
  file (without pickle; values of other types are pickled beside it, see
  :mod:`dsckpt.torch`). It returns once the daemon has the references (ACCEPTED).
* The next optimizer step waits for SNAPSHOT: the plugin registers a pre-hook common to all
  optimizers (``torch.optim.optimizer.register_optimizer_step_pre_hook``) on its first save.
  When the step is given a closure (Lightning's automatic optimization runs forward and
  backward inside ``optimizer.step(closure)``), the hook wraps it so that the wait comes
  after the closure, right before the parameters change; without one (manual optimization,
  AMP's scaler) it waits at once. The hook costs one list check while nothing is pending.
* A background thread asks the daemon to commit each checkpoint (MANIFEST.json) on a
  connection of its own, off the training loop, as
  soon as it is handed over; the daemon waits for DURABLE and finishes a commit it has
  received even if the trainer dies meanwhile. (The plugin commits rather than seals: only
  global rank 0 saves, so its commit names the whole checkpoint; a path saved again, such as
  ``last.ckpt``, goes to the tag's next version, see Paths below.)
  ``teardown()`` (the end of ``fit``) waits for SNAPSHOT and for those commits, logs any
  failure, and closes the connections; a later save reopens them. A failed checkpoint is
  logged, never raised into the training step; :meth:`DsckptCheckpointIO.wait_committed`
  raises it. A process whose ``teardown()`` ran with a process group up destroys that
  group at exit, on the main thread, if it is still up then (see :func:`_leave_group`:
  Lightning leaves a gloo group to the interpreter's finalization, where its threads may
  abort the process).

Paths: Lightning's checkpoint path itself becomes the checkpoint (tag) directory, so
``<dirpath>/epoch=0-step=100.ckpt/`` holds ``rank0.safetensors``, ``rank0.meta`` and
``MANIFEST.json``. The daemon writes no ``latest`` into ``dirpath`` (the plugin leaves the
hidden ``.dsckpt-no-latest`` there, see :data:`NO_LATEST`): Lightning's ``ckpt_path="last"``
goes by the ``last*.ckpt`` names, and :func:`dsckpt.torch.find_latest` by the manifests.
No name is rewritten (the daemon's character rule applies to file names, and ``rank0`` is
ours), so
ModelCheckpoint's existence checks, versioning, ``save_top_k`` and ``save_last="link"``
work on the names it chose. ``dirpath`` must lie at least one directory below one of the
daemon's ``allowed_roots`` (the daemon wants ``<root>/<job>/<tag>``). Saving to a path that
exists (``last.ckpt`` saved again) replaces it in one step at the new version's commit (the
daemon stages the new version in ``.last.ckpt.dsckpt-next`` beside it): until then the old
one stays whole and loadable, and a crash leaves one of the two; a link or a file at the path
is removed first.

``load_checkpoint(path)`` rebuilds the dict with :func:`dsckpt.torch.load`, through the
daemon (from its host cache when it still holds the file) or, without one, from the file;
a symbolic link (``last.ckpt`` with ``save_last="link"``) is followed, and a plain file
(a checkpoint Lightning's own ``TorchCheckpointIO`` wrote) is read by Lightning's loader.
Tensors land on the CPU unless ``map_location`` says otherwise, as with Lightning's own
plugin. ``weights_only`` works as with Lightning's own plugin over torch >= 2.6: unless it is
False (``trainer.fit(..., weights_only=False)``), nothing is unpickled, so a checkpoint
holding values that load only by unpickling raises :class:`dsckpt.PickleRefused`; False
unpickles them, running whatever code the checkpoint's author put there. A default
Trainer's checkpoint holds plain values only (Lightning 2.6: loops, callbacks' states,
optimizer and scheduler states, hyper-parameters as a dict); hyper-parameters that are an
``argparse.Namespace`` or Lightning's ``AttributeDict`` are allowed classes of the format
(:func:`dsckpt.add_safe_types`; the plugin allows ``AttributeDict`` when it is made), so
they load without unpickling too. Objects of other classes in hyper-parameters or a
callback's state need :func:`dsckpt.add_safe_types` or ``weights_only=False``.

``remove_checkpoint(path)`` (ModelCheckpoint's ``save_top_k``): a symbolic link is
unlinked, never followed; a directory is emptied and removed only when every entry in it is
a plain file of the names dsckpt writes, acting on the descriptor of the directory it
checked (anything else is logged and left alone); a plain file is removed as Lightning's own
plugin removes it.

A path outside the daemon's ``allowed_roots`` (``ddp_spawn`` hands the main process its
weights through a file in a temporary directory) is written by Lightning's own
``TorchCheckpointIO``, with a warning; any other refusal by the daemon is raised.

Without a daemon the constructor raises :class:`dsckpt.DaemonUnavailable` naming the
socket, so a job fails before it trains rather than at its first checkpoint. GPU tensors
are read by the daemon until SNAPSHOT: buffers that the forward pass changes in place
(BatchNorm's running statistics) should be saved from a CPU copy, or wait with
:meth:`DsckptCheckpointIO.wait_snapshot` in ``on_train_batch_start``.
"""
from __future__ import annotations

import atexit
import gc
import logging
import os
import queue
import re
import stat
import threading
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from . import _tree
from . import torch as dtorch
from .core import Connection
from .errors import DsckptError, Errno, PermissionDenied, error_for

try:
    from lightning.fabric.plugins import CheckpointIO
except ImportError:  # only pytorch_lightning installed: it ships lightning_fabric
    from lightning_fabric.plugins import CheckpointIO

log = logging.getLogger("dsckpt.lightning")

FILE = "rank0"
# Lightning's classes a checkpoint may hold (hyper-parameters): module → class names.
SAFE_TYPES = {"lightning.fabric.utilities.data": ("AttributeDict",),
              "lightning_fabric.utilities.data": ("AttributeDict",)}


def allow_types() -> List[type]:
    """Allows the classes of :data:`SAFE_TYPES` that are installed (see
    :func:`dsckpt.add_safe_types`) and returns them. Every :class:`DsckptCheckpointIO`
    calls it when made (and when unpickled in a spawned process)."""
    return _tree.allow_installed(SAFE_TYPES)
# What the daemon writes into a tag directory: all that remove_checkpoint deletes.
OURS = re.compile(r"(rank\d+\.(safetensors|meta)|MANIFEST\.json|SEAL\.[A-Za-z0-9._-]+\.json|"
                  r"SEAL\+w\d+\+r[\d,-]+\+t\d+\+\d+:[ -~]*\+[A-Za-z0-9._-]+\.json)(\.partial)?")

# In a job directory, tells the daemon to write no `latest` there (store_latest.c).
NO_LATEST = ".dsckpt-no-latest"


def _no_latest(dirpath: str) -> None:
    """Asks the daemon for no ``latest`` in ``dirpath`` (a hidden NO_LATEST file there:
    Lightning resumes by its own names) and removes one an earlier version left; logs,
    never raises, when it cannot."""
    marker = os.path.join(dirpath, NO_LATEST)
    try:
        if os.path.lexists(marker):
            return
        with open(marker, "a"):
            pass
        latest = os.path.join(dirpath, "latest")
        if os.path.isfile(latest) and not os.path.islink(latest):
            os.unlink(latest)
    except OSError as e:  # a save never fails for it: the daemon then writes latest
        log.warning("dsckpt: cannot leave %s (the daemon writes latest there): %s", marker, e)


class DsckptCheckpointIO(CheckpointIO):
    """Lightning checkpoints through dsckptd (see the module docstring).

    ``socket``: the daemon's socket (default ``$DSCKPT_SOCKET``, then the system one).
    ``job``: the job name the connection identifies with (default ``$DSCKPT_JOB``, else the
    name of the directory holding the first checkpoint). ``timeout``: seconds for waits and
    commits (default: none).
    """

    def __init__(self, socket: Optional[str] = None, *, job: Optional[str] = None,
                 timeout: Optional[float] = None):
        super().__init__()
        self.socket = socket or os.environ.get("DSCKPT_SOCKET") or None
        self.job = job
        self.timeout = timeout
        self.committed: List[str] = []
        self.failures: List[DsckptError] = []
        self._probe()
        self._init_runtime()

    def _init_runtime(self) -> None:
        """The parts that live in one process only (remade after unpickling)."""
        allow_types()  # the allowlist too: a spawned process starts without it
        self._lock = threading.Lock()  # guards _unsnapped and _pending
        self._conn: Optional[Connection] = None
        self._job = "lightning"  # the job _conn identified as
        self._commit_conn: Optional[Connection] = None  # the committer thread's alone
        self._unsnapped: List[dtorch.SaveHandle] = []
        self._pending: Dict[str, threading.Event] = {}  # dir -> set once its commit ended
        self._hook = None
        self._jobs: "queue.Queue[Optional[Tuple[str, threading.Event]]]" = queue.Queue()
        self._thread: Optional[threading.Thread] = None

    def _probe(self) -> None:
        """Raises DaemonUnavailable, naming the socket, when no daemon answers."""
        try:
            Connection(self.socket).close()
        except DsckptError as e:
            where = self.socket or "$DSCKPT_SOCKET or /run/dsckptd/dsckptd.sock"
            raise error_for(e.code, e.name, f"DsckptCheckpointIO: no dsckptd answers on "
                            f"{where}: {e.message}") from None

    def __getstate__(self) -> dict:
        """Pickles the settings only (strategies that spawn processes pickle plugins)."""
        return {"socket": self.socket, "job": self.job, "timeout": self.timeout,
                "committed": [], "failures": []}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    # -- Lightning's interface ----------------------------------------------------------

    def save_checkpoint(self, checkpoint: Dict[str, Any], path: Any,
                        storage_options: Optional[Any] = None) -> None:
        """Hands checkpoint to the daemon as the directory ``path`` and queues its commit;
        returns once ACCEPTED. The next optimizer step waits for SNAPSHOT."""
        if storage_options is not None:
            raise TypeError("DsckptCheckpointIO does not take storage_options; got "
                            f"{storage_options!r}")
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
            raise RuntimeError("DsckptCheckpointIO saves on global rank 0 only (a strategy "
                               "that hands every rank's shard to a CheckpointIO is not "
                               "supported)")
        dir = os.path.abspath(os.fspath(path))
        if os.path.isdir(dir) and not os.path.islink(dir):
            # Saved again (last.ckpt): the daemon stages the new version beside the old one
            # and exchanges them at its commit; the commit of the old one goes first.
            if not all(OURS.fullmatch(n) for n in os.listdir(dir)):
                raise FileExistsError(f"{dir} exists and is not a dsckpt checkpoint")
            self._wait_pending(dir)
        elif os.path.lexists(dir):  # a link (save_last="link") or a file: it goes first
            self.remove_checkpoint(dir)
            if os.path.lexists(dir):
                raise FileExistsError(f"{dir} exists and is not a dsckpt checkpoint")
        conn = self._connection(dir)
        try:
            handle = dtorch.save(checkpoint, dir, conn=conn, file=FILE, track=False)
        except PermissionDenied as e:
            if "allowed root" not in e.message:
                raise
            # Lightning's own files (ddp_spawn's weights for the main process, in a
            # temporary directory) are no checkpoints of the job: Lightning writes them.
            log.warning("dsckpt: %s is not below an allowed root of the daemon; written by "
                        "Lightning's TorchCheckpointIO", dir)
            _torch_io().save_checkpoint(checkpoint, dir)
            return
        _no_latest(os.path.dirname(dir))
        done = threading.Event()
        self._install_hook()
        self._start_committer()
        with self._lock:
            self._unsnapped.append(handle)
            self._pending[dir] = done
        self._jobs.put((dir, done))

    def load_checkpoint(self, path: Any, map_location: Optional[Any] = None,
                        weights_only: Optional[bool] = None) -> Dict[str, Any]:
        """The checkpoint dict saved at ``path`` (a symbolic link is followed; a plain file
        is read by Lightning's own loader); tensors on the CPU unless map_location says.
        Unpickles nothing unless ``weights_only`` is False (see the module docstring)."""
        path = os.path.abspath(os.fspath(path))
        dir = os.path.realpath(path)
        self._wait_pending(path)
        self._wait_pending(dir)
        if map_location is None:
            map_location = "cpu"
        if not os.path.isdir(dir):
            return _torch_io().load_checkpoint(dir, map_location, weights_only)
        try:
            conn: Optional[Connection] = self._connection(dir)
        except DsckptError as e:  # dsckpt.torch.load then reads the file here
            log.info("dsckpt: loading %s without the daemon: %s", dir, e)
            conn = None
        return dtorch.load(dir, FILE, map_location, conn=conn,
                           weights_only=weights_only is not False)

    def remove_checkpoint(self, path: Any) -> None:
        """Deletes the checkpoint at ``path`` if it is ours (see the module docstring); a
        checkpoint still being committed is waited for first."""
        path = os.path.abspath(os.fspath(path))
        self._wait_pending(path)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            os.unlink(path)  # the link, never what it points at
        elif stat.S_ISDIR(st.st_mode):
            _remove_dir(path)
        else:  # a plain file, such as one Lightning's own plugin wrote (see above)
            _torch_io().remove_checkpoint(path)

    def teardown(self) -> None:
        """Waits for SNAPSHOT and for every commit, logs failures, closes the connections
        and removes the optimizer hook (a later save sets them up again)."""
        self.wait_snapshot()
        self._drain()
        for e in self.failures:
            log.error("dsckpt: a checkpoint was not committed: %s", e)
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        for c in (self._conn, self._commit_conn):
            if c is not None:
                c.close()
        self._conn = self._commit_conn = None
        _leave_group_at_exit()

    # -- ours ---------------------------------------------------------------------------

    def wait_snapshot(self) -> None:
        """Waits until every save so far is in the daemon (its tensors may change after);
        a failed save is logged and kept for wait_committed()."""
        with self._lock:
            pending, self._unsnapped = self._unsnapped, []
        for handle in pending:
            try:
                handle.wait_snapshot(self.timeout)
            except DsckptError as e:
                log.error("dsckpt: save %s failed: %s", handle.path, e)
                self.failures.append(e)

    def wait_committed(self) -> List[str]:
        """Waits for every queued commit; returns the checkpoint directories committed so
        far, or raises the first failure (once)."""
        self.wait_snapshot()
        self._drain()
        if self.failures:
            del self.failures[1:]  # raised from no local: a frame holding what it raised
            raise self.failures.pop()  # is a reference cycle (dsckpt.torch._agree_run)
        return list(self.committed)

    def _connection(self, dir: str) -> Connection:
        """The saving connection, made on first use: rank 0 of a one-rank job, since only
        global rank 0 saves."""
        if self._conn is None or self._conn.closed:
            job = self.job or os.environ.get("DSCKPT_JOB") or \
                os.path.basename(os.path.dirname(dir)) or "lightning"
            self._conn = Connection(self.socket, job=job, rank=0, world_size=1)
            self._job = job
        return self._conn

    def _install_hook(self) -> None:
        """Registers the optimizer step pre-hook once (it stays until teardown: a hook
        may not unregister itself while torch iterates over the hooks)."""
        if self._hook is None:
            self._hook = register_optimizer_step_pre_hook(self._before_step)

    def _before_step(self, optimizer: Any, args: tuple, kwargs: dict) -> Any:
        """Any optimizer's step pre-hook: waits for SNAPSHOT right before the parameters
        change — after the step's closure (forward and backward) when it has one."""
        if not self._unsnapped:
            return None
        if "closure" in kwargs:
            closure = kwargs["closure"]
        elif args:
            closure = args[0]
        else:
            closure = None
        if closure is None:
            self.wait_snapshot()
            return None

        def closure_then_wait():
            result = closure()
            self.wait_snapshot()
            return result

        if "closure" in kwargs:
            return args, dict(kwargs, closure=closure_then_wait)
        return (closure_then_wait,) + tuple(args[1:]), kwargs

    def _wait_pending(self, dir: str) -> None:
        """Waits until a queued commit of dir has ended."""
        with self._lock:
            done = self._pending.get(dir)
        if done is not None:
            done.wait()

    def _drain(self) -> None:
        """Waits until the committer thread has ended every queued commit."""
        with self._lock:
            events = list(self._pending.values())
        for done in events:
            done.wait()

    def _start_committer(self) -> None:
        """Starts the committer thread unless it runs."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._committer, name="dsckpt-commit",
                                            daemon=True)
            self._thread.start()

    def _committer(self) -> None:
        """Commits queued directories in order on a connection of its own, so the training
        loop's calls never queue behind a commit."""
        while True:
            item = self._jobs.get()
            if item is None:
                return
            dir, done = item
            try:
                if self._commit_conn is None or self._commit_conn.closed:
                    self._commit_conn = Connection(self.socket, job=self._job, rank=0,
                                                   world_size=1)
                self._commit_conn.commit(dir, self.timeout)
                self.committed.append(dir)
                log.info("dsckpt: committed %s", dir)
            except DsckptError as e:
                log.error("dsckpt: checkpoint %s not committed: %s", dir, e)
                self.failures.append(e)
            except Exception as e:  # never let the thread die with commits queued
                log.exception("dsckpt: checkpoint %s not committed", dir)
                self.failures.append(error_for(Errno.EIO, "EIO", f"{dir}: {e!r}"))
            finally:
                with self._lock:
                    if self._pending.get(dir) is done:
                        del self._pending[dir]
                done.set()


_LEAVING = []  # holds True once _leave_group is registered in this process


def _leave_group_at_exit() -> None:
    """Registers _leave_group (once per process) when a process group is up: teardown()
    runs on every rank at the end of fit."""
    dist = torch.distributed
    if not _LEAVING and dist.is_available() and dist.is_initialized():
        _LEAVING.append(True)
        atexit.register(_leave_group)


def _leave_group() -> None:
    """At exit, before the interpreter finalizes: destroys the default process group if it
    is still up, then collects the cycles that may still hold it, on the main thread.
    Lightning destroys an NCCL group at exit but leaves a gloo one (ddp_spawn on the CPU)
    to the interpreter's finalization, while a gloo worker thread may still be dropping
    the last reference to a Python tensor (a barrier's work holding an earlier
    all_reduce's): taking the GIL for it there is pthread_exit, whose forced unwind
    through pybind11's noexcept gil_scoped_acquire aborts the rank ("terminate called
    without an active exception"). Destroyed here, the group's destructor joins those
    threads while they still may take the GIL."""
    dist = torch.distributed
    if dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()


def _torch_io() -> CheckpointIO:
    """Lightning's own plugin, for plain files (torch.save's)."""
    try:
        from lightning.fabric.plugins import TorchCheckpointIO
    except ImportError:
        from lightning_fabric.plugins import TorchCheckpointIO
    return TorchCheckpointIO()


def _remove_dir(path: str) -> None:
    """Deletes directory path when every entry is a plain file named as dsckpt names its
    files (an empty one too), through the descriptor of the directory checked (never following a link);
    logs and leaves it otherwise."""
    parent = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = os.open(os.path.basename(path), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                     dir_fd=parent)
        try:
            names = os.listdir(fd)
            strange = [n for n in names if not OURS.fullmatch(n) or not stat.S_ISREG(
                os.stat(n, dir_fd=fd, follow_symlinks=False).st_mode)]
            if strange:
                log.warning("dsckpt: %s is not a dsckpt checkpoint (%s); left alone", path,
                            ", ".join(sorted(strange)))
                return
            for n in names:
                os.unlink(n, dir_fd=fd)
        finally:
            os.close(fd)
        try:
            os.rmdir(os.path.basename(path), dir_fd=parent)
        except OSError as e:  # something new appeared in it meanwhile
            log.warning("dsckpt: %s not removed: %s", path, e)
    finally:
        os.close(parent)


__all__ = ["DsckptCheckpointIO"]
