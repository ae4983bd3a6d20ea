"""dsckpt._flatten — a state dict as named tensor views, and back.

:class:`_Flattener` walks nested dicts, lists and tuples (what ``dsckpt.torch.save`` writes
and ``load_into`` fills): each distinct view of a storage becomes one named tensor of the
file (its key path: ``model.layers.0.weight``), every tensor object an entry pointing at its
view. :func:`_rebuild_views` turns them back into tensors (``dsckpt.torch.load``); the
skeleton around them is _blob's.
"""
from __future__ import annotations

import hashlib
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch

from ._files import DTYPES
from .errors import Errno, error_for

MAX_NAME = 512  # PROTO_MAX_NAME: longest tensor name the daemon takes

MapLocation = Union[None, str, torch.device, Dict[str, str],
                    Callable[[Any, str], Any]]

class _TensorRef:
    """Placeholder for a tensor in a version 1 blob's skeleton: index into the entry table
    (only read now, see _blob)."""

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
_DTYPES_BY_NAME: Dict[str, torch.dtype] = {n: d for d, n in _DTYPE_NAMES.items()}
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

    def __init__(self, limit: int = 0):
        self.limit = limit                # views a file may hold (0: any): LimitReached beyond
        self.views: List[dict] = []       # one per distinct view: goes to the file
        self.payload: List[torch.Tensor] = []  # contiguous data of each view
        self.specs: List[tuple] = []      # each view's (name, dtype, shape, ptr, nbytes)
        self.nbytes = 0                   # bytes of every view
        self.gpu: List[torch.Tensor] = []  # the CUDA ones of payload
        self.originals: List[torch.Tensor] = []  # each view's tensor as found (load_into)
        self.pickled: List[str] = []      # paths of tensors left in the skeleton
        self.entries: List[dict] = []     # one per distinct tensor object
        self.names: set = set()
        self.by_object: Dict[int, int] = {}   # id(tensor) → entry
        self.objects: List[torch.Tensor] = []  # each entry's tensor object (keeps ids alive)
        self.by_view: Dict[tuple, int] = {}   # (storage, dtype, offset, shape, stride) → view
        self.groups: Dict[tuple, int] = {}    # (storage, dtype) → group
        self.seen: set = set()                # id(container) of those walked
        self.hold: List[Any] = []             # keeps walked containers (and their ids) alive

    def name(self, path: str) -> str:
        """A unique tensor name for a key path."""
        base = _short_name(path or "tensor")
        name, n = base, 1
        while name in self.names or name == "__metadata__":
            name, n = f"{base}~{n}", n + 1
        self.names.add(name)
        return name

    def tensor(self, t: torch.Tensor, path: str) -> None:
        """Records a tensor: a new entry (unless the object was met before), and a new view
        unless its view of its storage was. Each attribute is asked for once (a PyTorch
        attribute costs a few hundred nanoseconds)."""
        if id(t) in self.by_object:
            return
        dtype = t.dtype
        if dtype not in DTYPES or t.layout != torch.strided or t.is_meta:
            self.pickled.append(path)
            return  # pickled with the skeleton, by torch's own reduction
        ptr, offset, esz, device = t.data_ptr(), t.storage_offset(), t.element_size(), t.device
        skey = (device, ptr - offset * esz) if ptr else None  # the storage's identity
        shape, stride = tuple(t.shape), t.stride()
        vkey = (skey, dtype, offset, shape, stride) if skey else None
        vi = self.by_view.get(vkey) if vkey is not None else None
        if vi is None:
            if self.limit and len(self.views) == self.limit:   # the walk stops here
                raise error_for(Errno.ELIMIT, "ELIMIT",
                                f"more than {self.limit} tensors ('{path}' is one too many): "
                                f"the daemon's max_tensors_per_save is {self.limit}, and a "
                                "save may hold no more (no tensor was sent)")
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
            self.originals.append(t)
            self.nbytes += nbytes
            if dname.startswith("cuda"):
                self.gpu.append(data)
            if vkey is not None:
                self.by_view[vkey] = vi
        param = type(t) is not torch.Tensor and isinstance(t, torch.nn.Parameter)
        self.entries.append({"view": vi, "param": param, "requires_grad": t.requires_grad})
        self.by_object[id(t)] = len(self.entries) - 1
        self.objects.append(t)

    def walk(self, obj: Any, path: str) -> None:
        """Collects every tensor inside nested dicts, lists and tuples of obj (a container
        met twice is walked once). path: the dotted key path of obj."""
        if isinstance(obj, torch.Tensor):
            self.tensor(obj, path)
            return
        if not isinstance(obj, (dict, list, tuple)) or id(obj) in self.seen:
            return
        self.seen.add(id(obj))
        self.hold.append(obj)
        pre = path + "." if path else ""
        items = obj.items() if isinstance(obj, dict) else enumerate(obj)
        for k, v in items:
            self.walk(v, pre + str(k))


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
        base = torch.zeros(max(high - low, 0), dtype=_DTYPES_BY_NAME[first["dtype"]],
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
