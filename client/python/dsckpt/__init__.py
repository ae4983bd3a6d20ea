"""dsckpt — Python binding of libdsckpt, the client of the per-node checkpoint daemon dsckptd.

Layers, each usable alone:

* ``dsckpt`` (this module): a ctypes binding of ``client/dsckpt.h`` — :class:`Connection`,
  :class:`Save`, :class:`Load`, :class:`Level`, :class:`HostBuffer` and
  :class:`DsckptError`. No compile step; the shared library is found next to the package,
  in the repository's ``build/``, or through ``$DSCKPT_LIB`` (see ``dsckpt._lib``).
* ``dsckpt.torch``: ``save(state_dict, dir)`` / ``load(dir)`` of nested PyTorch state dicts
  as plain safetensors files, ``load_into(state_dict, dir)`` restoring existing tensors in
  place, and ``commit(dir, group)`` across torch.distributed ranks.
* ``dsckpt.deepspeed``: a DeepSpeed checkpoint engine (imports without DeepSpeed).
* ``dsckpt.dcp``: a torch.distributed.checkpoint storage backend, ``Writer`` (also the
  AsyncStager ``async_save`` uses) and ``Reader`` (PyTorch >= 2.4).
* ``dsckpt.lightning``: a Lightning ``CheckpointIO`` plugin (needs Lightning 2.x).

Importing ``dsckpt`` does not load the shared library; the first call does.
"""
from .core import (Connection, HostBuffer, Level, Load, LoadLevel, LoadProgress, Plan, Save,
                   SaveProgress, err_name, strerror, version)
from .errors import (CheckpointIncomplete, DaemonUnavailable, DsckptError, DsckptTimeout,
                     Errno, InvalidArgument, LimitReached, LoadFailed, NotSupported,
                     PermissionDenied, PickleRefused, SaveFailed, UncheckedLoad)

from ._version import __version__

__all__ = [
    "Connection", "Save", "Load", "Plan", "Level", "LoadLevel", "SaveProgress", "LoadProgress",
    "HostBuffer", "version", "strerror", "err_name", "DsckptError", "Errno",
    "DaemonUnavailable", "SaveFailed", "LoadFailed",
    "CheckpointIncomplete", "DsckptTimeout", "InvalidArgument", "PermissionDenied",
    "NotSupported", "LimitReached", "PickleRefused", "UncheckedLoad",
]
