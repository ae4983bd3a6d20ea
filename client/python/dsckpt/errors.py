"""errors.py — the library's negative DSCKPT_E* codes as Python exceptions.

Every failed call raises :class:`DsckptError` (or a subclass picked by the code) carrying
``code`` (the negative number), ``name`` (``"EINVAL"``) and ``message`` (the daemon's or the
library's words, from ``dsckpt_last_error``). Subclasses also derive from the matching
built-in exception where one fits, so ``except TimeoutError`` or ``except ValueError`` work.
"""
from __future__ import annotations

import enum
import pickle
from typing import Dict, Optional, Type


class Errno(enum.IntEnum):
    """The codes of client/dsckpt.h (DSCKPT_ERRNO_MAP); never renumbered."""

    EPERM = -1
    ENOENT = -2
    EIO = -5
    EBADF = -9
    ENOMEM = -12
    EACCES = -13
    EBUSY = -16
    EEXIST = -17
    EINVAL = -22
    ENOSPC = -28
    EPIPE = -32
    ERANGE = -34
    ENAMETOOLONG = -36
    EPROTO = -71
    EMSGSIZE = -90
    ENOTSUP = -95
    ETIMEDOUT = -110
    ECONNREFUSED = -111
    EFAILED = -1000
    EVERSION = -1001
    ESTATE = -1002
    ENOCUDA = -1003
    ECHECKSUM = -1004
    EINCOMPLETE = -1005
    ESHUTDOWN = -1006
    ELIMIT = -1007


class DsckptError(Exception):
    """A libdsckpt call failed: ``code`` (negative int), ``name`` and ``message``."""

    def __init__(self, code: int, name: str, message: str):
        Exception.__init__(self, code, name, message)
        self.code = code
        self.name = name
        self.message = message
        self.cause: Optional[Errno] = None

    @property
    def errno_enum(self) -> Errno:
        """The code as an :class:`Errno` member."""
        return Errno(self.code)

    def __str__(self) -> str:
        return f"{self.name}: {self.message}"

    def __reduce__(self):
        return (error_for, (self.code, self.name, self.message,
                            int(self.cause) if self.cause is not None else 0,
                            isinstance(self, LoadFailed)))


class DaemonUnavailable(DsckptError, ConnectionError):
    """The daemon cannot be reached, went away, shuts down or speaks another protocol."""


class SaveFailed(DsckptError):
    """A save reached FAILED; ``message`` is the daemon's reason (the file and what went
    wrong) and ``cause`` the code behind it, e.g. ``Errno.ENOSPC`` for a full disk."""


class LoadFailed(DsckptError):
    """A load reached FAILED; ``message`` names the tensor and the file, ``cause`` is the
    code behind it, e.g. ``Errno.ECHECKSUM`` for bytes that differ from their checksum."""


class CheckpointIncomplete(DsckptError):
    """A commit found a rank without files, or files still being written; or a wait for
    REPLICATED found fewer peers holding copies than `replicas`."""


class DsckptTimeout(DsckptError, TimeoutError):
    """A wait or commit ran out of time before the level was reached."""


class InvalidArgument(DsckptError, ValueError):
    """A name, path, dtype, shape or size was refused."""


class PermissionDenied(DsckptError, PermissionError):
    """A path outside the allowed roots, or owned by someone else."""


class LimitReached(DsckptError):
    """A per-user limit of the daemon (open saves, regions, bytes, tensors) was reached."""


class NotSupported(DsckptError):
    """Memory or an operation the library cannot hand over (managed memory, no CUDA)."""


class PickleRefused(pickle.UnpicklingError):
    """A load would unpickle part of a checkpoint, which runs whatever code its author put
    there: refused unless the caller passes ``weights_only=False`` (as torch.load's own
    default refuses since torch 2.6). The message names the types that need it."""

    HOW = ("Loading unpickles nothing unless asked: pass weights_only=False only for a "
           "checkpoint whose author you trust.")


class UncheckedLoad(UserWarning):
    """A file read without the daemon has no dsckpt checksums (another tool wrote it): its
    tensors were loaded as they are, unchecked."""


_CLASSES: Dict[int, Type[DsckptError]] = {
    Errno.ECONNREFUSED: DaemonUnavailable,
    Errno.EPIPE: DaemonUnavailable,
    Errno.ESHUTDOWN: DaemonUnavailable,
    Errno.EVERSION: DaemonUnavailable,
    Errno.EFAILED: SaveFailed,
    Errno.EINCOMPLETE: CheckpointIncomplete,
    Errno.ETIMEDOUT: DsckptTimeout,
    Errno.EINVAL: InvalidArgument,
    Errno.ENAMETOOLONG: InvalidArgument,
    Errno.ERANGE: InvalidArgument,
    Errno.EPERM: PermissionDenied,
    Errno.EACCES: PermissionDenied,
    Errno.ENOTSUP: NotSupported,
    Errno.ENOCUDA: NotSupported,
    Errno.ELIMIT: LimitReached,
}


def error_for(code: int, name: str, message: str, cause: int = 0,
              load: bool = False) -> DsckptError:
    """The exception object for a code: the most specific subclass, else DsckptError;
    ``cause`` (a negative code, 0 for none) is why a save (a load, when ``load``) failed."""
    cls = LoadFailed if load and code == Errno.EFAILED else _CLASSES.get(code, DsckptError)
    e = cls(code, name, message)
    if cause in Errno._value2member_map_:
        e.cause = Errno(cause)
    return e
