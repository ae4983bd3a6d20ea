"""dsckpt — Python binding of libdsckpt, the client of the per-node checkpoint daemon dsckptd.

Layers, each usable alone:

* ``dsckpt`` (this module): a ctypes binding of ``client/dsckpt.h`` — :class:`Connection`,
  :class:`Save`, :class:`Load`, :class:`Level`, :class:`HostBuffer` and
  :class:`DsckptError`. No compile step; the shared library is found next to the package,
  in the repository's ``build/``, or through ``$DSCKPT_LIB`` (see ``dsckpt._lib``).
* ``dsckpt.torch``: ``save(state_dict, dir)`` / ``load(dir)`` of nested PyTorch state dicts
  as plain safetensors files, ``load_into(state_dict, dir)`` restoring existing tensors in
  place, ``materialize(model, optimizer, dir)`` filling a model built on the meta device
  (``dsckpt.materialize``), and ``commit(dir, group)`` across torch.distributed ranks.
* ``dsckpt.deepspeed``: a DeepSpeed checkpoint engine (imports without DeepSpeed).
* ``dsckpt.dcp``: a torch.distributed.checkpoint storage backend, ``Writer`` (also the
  AsyncStager ``async_save`` uses) and ``Reader`` (PyTorch >= 2.4).
* ``dsckpt.lightning``: a Lightning ``CheckpointIO`` plugin (needs Lightning 2.x).

Importing ``dsckpt`` does not load the shared library; the first call does.

Loads unpickle nothing by default. Objects of classes a checkpoint holds besides plain values
(a DeepSpeed loss scaler, an Enum, a dataclass of hyper-parameters) are saved by class name
and state and load without unpickling when their class is allowed: :func:`add_safe_types`
allows a class (as ``torch.serialization.add_safe_globals``), :func:`safe_types` lists those
allowed (``argparse.Namespace`` and ``types.SimpleNamespace`` by default; the DeepSpeed and
Lightning integrations add the classes their checkpoints hold when used).
"""
from typing import Iterable, List, Optional

from .core import (Connection, HostBuffer, Level, Load, LoadLevel, LoadProgress, Plan, Save,
                   SaveProgress, err_name, strerror, version)
from .errors import (CheckpointIncomplete, DaemonUnavailable, DsckptError, DsckptTimeout,
                     Errno, InvalidArgument, LimitReached, LoadFailed, NotSupported,
                     PermissionDenied, PickleRefused, SaveFailed, UncheckedLoad)

from ._version import __version__
from . import manifest


def add_safe_types(classes: Iterable[type]) -> None:
    """Allows objects of these classes (dataclasses, Enums, namedtuples, classes with
    ``__dict__`` or ``__slots__``, dict subclasses) in checkpoints: a save writes such an
    object as its class's name and its state, and a load (``weights_only`` true) makes it
    again by ``cls.__new__(cls)`` and setting its attributes (an Enum by ``cls(value)``, a
    namedtuple by ``cls._make``), never by unpickling, importing or calling ``__init__``,
    ``__reduce__`` or ``__setstate__``. Allow only classes whose own code you trust to run
    so. Saves made before a class was allowed hold its objects pickled (they still need
    ``weights_only=False``)."""
    from . import _tree
    _tree.add_safe_types(classes)


def safe_types() -> List[type]:
    """The classes :func:`add_safe_types` allowed, the defaults included."""
    from . import _tree
    return _tree.safe_types()

def prefetch(dir: str, tag: Optional[str] = None, wait: bool = False, *,
             socket: Optional[str] = None) -> dict:
    """Asks the node's daemon to read a checkpoint into its cache before the trainer loads
    it (``dsckptctl pull``): ``dir`` a tag directory, or a job directory whose tag is ``tag``
    (None: its latest, on this node or else in the root's remote tier, pulled into the local
    tier first). See :meth:`Connection.prefetch`; ``socket`` as :class:`Connection`'s."""
    with Connection(socket, job="prefetch") as conn:
        return conn.prefetch(dir, tag, wait)


__all__ = [
    "Connection", "Save", "Load", "Plan", "Level", "LoadLevel", "SaveProgress", "LoadProgress",
    "HostBuffer", "version", "strerror", "err_name", "DsckptError", "Errno",
    "DaemonUnavailable", "SaveFailed", "LoadFailed",
    "CheckpointIncomplete", "DsckptTimeout", "InvalidArgument", "PermissionDenied",
    "NotSupported", "LimitReached", "PickleRefused", "UncheckedLoad", "add_safe_types",
    "safe_types", "prefetch", "manifest",
]
