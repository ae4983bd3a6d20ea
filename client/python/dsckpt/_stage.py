"""dsckpt._stage — small host tensors a save plan cannot take (pageable memory, such as
AdamW's CPU ``step`` scalars), copied at each save into dsckpt host memory that a save plan
points into, for :mod:`dsckpt._handover`.

The library stages such tensors itself at every save, a few microseconds each: hundreds of
step scalars cost a millisecond and more. Their addresses are proven unchanged before each
save (_handover), so here one ``torch.take`` per element size gathers all of them at once
from a view over the address range they lie in (a view touches nothing; only the proven
addresses are read) into a buffer a plan points into. A save takes one plan, so each buffer
has a plan of the planned tensors followed by the staged ones. Two buffers take turns; a
buffer is written only when the save that last read it is known to have reached SNAPSHOT (or
FAILED), as the daemon reads it until then. When that is not known the save adds every
tensor one by one, as without a plan (the library stages the small ones): it never waits.

Larger tensors in ordinary CPU memory are copied by the library at every save (into shared
memory it keeps for the next save, split between threads: client/lib/stage.c); the first save
that copies at least ``COPY_WARN`` bytes says once per process, in a :class:`HostCopyWarning`,
how to avoid the copy (:func:`dsckpt.torch.host_empty`).
"""
from __future__ import annotations

import ctypes
import warnings
from typing import Dict, List, Optional, Tuple

import torch

from .core import Connection, Level, Plan, Save, pack_tensors
from .errors import DsckptError, DsckptTimeout

SMALL = 64 << 10    # a tensor up to this size may be staged here
TOTAL = 16 << 20    # bytes staged here per file name (in each of two buffers)
_ALIGN = 64
_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # bytes as elements
COPY_WARN = 1 << 20  # bytes of ordinary CPU memory a save copies before it says so (once)
_copy_warned = False


class HostCopyWarning(UserWarning):
    """A save copies ordinary CPU tensors: :func:`dsckpt.torch.host_empty` memory would not
    be copied."""


def warn_copy(nbytes: int, name: str) -> None:
    """Says once per process that a save copies nbytes of ordinary CPU memory (tensor name the
    first of them) at every save, and how to avoid it; nothing below COPY_WARN."""
    global _copy_warned
    if _copy_warned or nbytes < COPY_WARN:
        return
    _copy_warned = True
    warnings.warn(
        f"dsckpt: this save copies {nbytes / (1 << 20):.1f} MiB of ordinary CPU tensors "
        f"('{name}' first) into dsckpt memory, and so will every save of them; make them in "
        "dsckpt host memory (dsckpt.torch.host_empty(shape, dtype), then copy_ into it once) "
        "and the daemon reads them where they are, without a copy (said once per process)",
        HostCopyWarning, stacklevel=4)


_ESIZES: Dict[torch.dtype, int] = {}


def _esize(dtype: torch.dtype) -> int:
    """Bytes per element of dtype (asked once per dtype)."""
    size = _ESIZES.get(dtype)
    if size is None:
        size = _ESIZES[dtype] = torch.empty((), dtype=dtype).element_size()
    return size


def fits(ptr: int, dtype: torch.dtype) -> bool:
    """Whether a tensor at ptr can be gathered as elements of its size."""
    return _esize(dtype) in _INTS and ptr % _esize(dtype) == 0


class _Buffer:
    """One buffer: the gathers that fill it and the plan that reads it."""

    def __init__(self, conn: Connection, planned: List[tuple], specs: List[tuple],
                 dtypes: List[torch.dtype], sources: Dict[int, tuple]):
        """A block per element size; specs (walk order) placed in them; a plan of planned
        then specs. sources: element size → (view of the source range, indices)."""
        from .torch import host_empty
        sizes = {e: len(idx) * e for e, (_, idx) in sources.items()}
        raw = host_empty((max(sum((n + _ALIGN - 1) // _ALIGN * _ALIGN
                                  for n in sizes.values()), 1),), torch.uint8)
        blocks, at = {}, 0
        for e, n in sizes.items():
            blocks[e] = raw[at:at + n].view(_INTS[e])
            at += (n + _ALIGN - 1) // _ALIGN * _ALIGN
        self.gathers = [(src, idx, blocks[e]) for e, (src, idx) in sources.items()]
        used = {e: 0 for e in blocks}
        rows = []
        for (name, st_dtype, shape, _, nbytes), dtype in zip(specs, dtypes):
            e = _esize(dtype)
            rows.append((name, st_dtype, shape, blocks[e].data_ptr() + used[e], nbytes))
            used[e] += nbytes
        self.plan: Plan = conn.plan(planned + rows)
        self.raw = raw
        self.last: Optional[Save] = None  # the save that last read this buffer

    def free(self) -> bool:
        """Whether the daemon is known to read this buffer no more (asks without waiting)."""
        s = self.last
        if s is None or s.level >= Level.SNAPSHOT or s.level == Level.FAILED:
            return True
        if s.closed:
            return False  # its level can no longer be asked
        try:
            s.wait(Level.SNAPSHOT, 0)
        except DsckptTimeout:
            return False
        except DsckptError:
            return s.level == Level.FAILED
        return True


class Stage:
    """The plans of one cached hand-over with staged tensors: the planned specs, then the
    staged tensors (``(spec, dtype)`` in walk order, each at an address that fits())."""

    def __init__(self, conn: Connection, planned: List[tuple],
                 staged: List[Tuple[tuple, torch.dtype]]):
        specs = [spec for spec, _ in staged]
        dtypes = [dtype for _, dtype in staged]
        spans: Dict[int, List[tuple]] = {}  # element size → (ptr, elements) in walk order
        for (_, _, _, ptr, nbytes), dtype in staged:
            e = _esize(dtype)
            spans.setdefault(e, []).append((ptr, nbytes // e))
        sources = {}
        for e, members in spans.items():
            lo = min(p for p, _ in members)
            hi = max(p + n * e for p, n in members)
            view = torch.frombuffer((ctypes.c_uint8 * (hi - lo)).from_address(lo),
                                    dtype=torch.uint8).view(_INTS[e])
            idx = torch.cat([torch.arange((p - lo) // e, (p - lo) // e + n) for p, n in members])
            sources[e] = (view, idx)
        self.buffers: List[_Buffer] = []
        try:
            for _ in range(2):
                self.buffers.append(_Buffer(conn, planned, specs, dtypes, sources))
        except BaseException:
            self.close()
            raise
        self.planned, self.specs = planned, specs
        self.fallback: Optional[list] = None  # packed when first needed
        self.turn = 0

    def next_plan(self) -> Optional[Plan]:
        """The plan the next add uses, or None when it will add the tensors one by one."""
        buf = self.buffers[self.turn]
        return buf.plan if buf.free() else None

    def add(self, s: Save) -> bool:
        """Adds the planned and staged tensors to s: the staged ones gathered into the next
        buffer and its plan added, when the buffer is free; else every tensor added one by
        one, in the same order. True when a plan was sent whole."""
        buf = self.buffers[self.turn]
        self.turn ^= 1
        if not buf.free():
            if self.fallback is None:
                self.fallback = [p for p in (pack_tensors(self.planned),
                                             pack_tensors(self.specs)) if p]
            for packed in self.fallback:
                s.add_tensors(packed)
            return False
        for src, idx, dst in buf.gathers:
            torch.take(src, idx, out=dst)
        resent = s.add_plan(buf.plan)
        buf.last = s
        return resent

    def close(self) -> None:
        """Frees the buffers' plans (the memory goes with the last save reading it)."""
        for buf in self.buffers:
            buf.plan.close()
