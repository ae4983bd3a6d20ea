"""dsckpt.dcp.reader — the loading half of the DCP backend: Reader, DCP's StorageReader, which
serves DCP's ReadItems through the daemon's load path (see dsckpt.dcp). It reads DCP's
Metadata without pickle (dsckpt.dcp.meta); the values DCP itself pickled (BYTE_IO items,
which DCP's DefaultLoadPlanner.load_bytes loads with torch.load(weights_only=False)) are
handed to the planner only once torch's weights-only unpickler has loaded them, unless the
Reader was made with ``weights_only=False``."""
from __future__ import annotations

import io
import os
from typing import Dict, List, Optional

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from .. import _fill, _remote
from .._files import read_meta
from ..core import Connection
from ..errors import DsckptError, Errno, PickleRefused, error_for
from ..torch import default_connection, host_empty
from . import meta
from .layout import META_BLOB, META_FILE, Location


class Reader(StorageReader):
    """A DCP StorageReader for a tag :class:`Writer` committed, through the daemon when one
    answers (``conn``, else :func:`dsckpt.torch.default_connection`), else from the files.

    ``weights_only`` (default True): nothing of the tag is unpickled but by torch's
    weights-only unpickler; a tag whose metadata or values need the full one raises
    :class:`dsckpt.PickleRefused`. ``weights_only=False`` runs whatever code the tag's author
    put there: only for tags whose author you trust."""

    def __init__(self, dir, *, conn: Optional[Connection] = None, weights_only: bool = True):
        super().__init__()
        self.dir = os.fspath(dir)
        self.conn = conn
        self.weights_only = weights_only
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
        """DCP's Metadata of the tag; raises CheckpointIncomplete unless it is committed. A tag
        only the root's remote tier holds is pulled into the local tier first (the daemon)."""
        _remote.ensure_local(self._daemon(), self.dir, _remote.MANIFEST)
        if not os.path.exists(os.path.join(self.dir, "MANIFEST.json")):
            raise error_for(Errno.EINCOMPLETE, "EINCOMPLETE",
                            f"{self.dir} is not a committed checkpoint (no MANIFEST.json)")
        path = os.path.join(self.dir, META_FILE + ".meta")
        blobs = read_meta(path)
        if META_BLOB not in blobs:
            raise ValueError(f"{self.dir}: {META_FILE}.meta has no {META_BLOB} blob")
        return meta.load(blobs[META_BLOB], path, self.weights_only)

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
        """Serves every ReadItem of the plan, one file at a time, the stored chunks that go
        to CPU memory through one scratch buffer of dsckpt host memory that every file reuses
        (see _tensor_plan)."""
        by_file: Dict[str, list] = {}
        for item in plan.items:
            by_file.setdefault(self.storage_data[item.storage_index].file, []).append(item)
        layouts = {file: self._tensor_plan(file, items, planner)
                   for file, items in by_file.items()}
        need = max((_scratch_bytes(layout[2]) for layout in layouts.values()), default=0)
        scratch = host_empty((need,), torch.uint8) if need else None
        conn = self._daemon()
        for file, items in sorted(by_file.items()):
            self._read_file(file, items, planner, conn, layouts[file], scratch)
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

    def _tensor_plan(self, file: str, items: list, planner: LoadPlanner):
        """Where the daemon writes each stored chunk of file the items need: (uses: name →
        its items, direct: name → the destination it fills itself, staged: [(name, dtype,
        shape, device)] to fill into a buffer and copy out of). A destination is filled
        directly when it is exactly one whole stored chunk (the library stages ordinary
        CPU memory itself, one arena per load); the other chunks for the CPU go to the
        scratch buffer, for the GPU to a buffer on their device."""
        uses: Dict[str, list] = {}
        for item in items:
            loc = self.storage_data[item.storage_index]
            if loc.kind == "tensor":
                uses.setdefault(loc.name, []).append(item)
        if not uses:
            return uses, {}, []
        shapes = _fill.header(os.path.join(self.dir, file + ".safetensors"))
        direct, staged = {}, []
        for name, its in uses.items():
            dtype, shape = shapes[name]
            target = planner.resolve_tensor(its[0])
            if (len(its) == 1 and target.is_contiguous() and target.dtype == dtype
                    and tuple(target.shape) == tuple(shape)
                    and not any(its[0].storage_offsets)):
                direct[name] = target
            else:
                staged.append((name, dtype, tuple(shape), target.device))
        return uses, direct, staged

    def _read_file(self, file: str, items: list, planner: LoadPlanner,
                   conn: Optional[Connection], layout, scratch: Optional[torch.Tensor]) -> None:
        """Serves the items stored in one file: blobs from its .meta; tensors filled by the
        daemon (or read here) as layout says (_tensor_plan)."""
        blobs = None
        for item in items:
            loc = self.storage_data[item.storage_index]
            if loc.kind == "tensor":
                continue
            if blobs is None:
                blobs = read_meta(os.path.join(self.dir, file + ".meta"))
            data = io.BytesIO(blobs[loc.name])
            if item.type == LoadItemType.BYTE_IO:
                if self.weights_only:
                    self._check_pickle(file, item.dest_index.fqn, blobs[loc.name])
                planner.load_bytes(item, data)
            else:
                src = torch.load(data, weights_only=True)
                _copy_into(planner, item, _narrow(src, item.storage_offsets, item.lengths))
        uses, direct, staged = layout
        if not uses:
            return
        dests = dict(direct)
        at = 0
        for name, dtype, shape, device in staged:
            if device.type == "cpu":
                n = torch.Size(shape).numel() * _itemsize(dtype)
                dests[name] = scratch[at:at + n].view(dtype).reshape(shape)
                at += _aligned(n)
            else:
                dests[name] = torch.empty(shape, dtype=dtype, device=device)
        self.sources[file] = _fill.fill(self.dir, file, dests, conn, strict=False)
        for name, target in direct.items():
            planner.commit_tensor(uses[name][0], target)
        for name, _, _, _ in staged:
            for item in uses[name]:
                _copy_into(planner, item, _narrow(dests[name], item.storage_offsets,
                                                  item.lengths))

    def _check_pickle(self, file: str, fqn: str, data: bytes) -> None:
        """Raises PickleRefused unless torch's weights-only unpickler loads data (the planner
        then unpickles it with no allowlist: DCP's load_bytes)."""
        try:
            torch.load(io.BytesIO(data), weights_only=True)
        except Exception as e:  # noqa: BLE001 - any refusal: the reason is in the message
            raise PickleRefused(f"{self.dir}/{file}.meta: value {fqn} is a pickle that torch's "
                                "weights-only unpickler refuses, and DCP's planner unpickles "
                                "it with weights_only=False, which runs whatever code the "
                                f"checkpoint's author put in it ({type(e).__name__}: "
                                f"{str(e)[:200]}). " + PickleRefused.HOW) from None


_ALIGN = 64  # where each chunk starts in the scratch buffer: any dtype's alignment


def _itemsize(dtype: torch.dtype) -> int:
    """Bytes per element of dtype."""
    return torch.empty((), dtype=dtype).element_size()


def _aligned(n: int) -> int:
    """n rounded up to _ALIGN."""
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _scratch_bytes(staged) -> int:
    """The scratch bytes the CPU chunks of one file take (_tensor_plan's staged)."""
    return sum(_aligned(torch.Size(shape).numel() * _itemsize(dtype))
               for _, dtype, shape, device in staged if device.type == "cpu")


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
