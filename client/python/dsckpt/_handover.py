"""dsckpt._handover — how ``dsckpt.torch.save`` hands a state dict to the daemon, in O(1)
Python work per tensor when the structure was saved before.

Every checkpoint of a run saves the same structure: the same containers and keys, the same
tensors at the same addresses. The first save of a file name on a connection (cold) walks
the state dict (``_flatten``), describes its tensors to the daemon once as a save plan
(:meth:`Connection.plan`), and keeps an :class:`_Entry`: the containers (``_shape.Shape``),
every tensor's type, pointer, storage offset, dtype, shape, stride and requires_grad
(:class:`_Tensors`), the blob's tables and frame (``_blob``). A later save of that name
(warm) proves, with C-level calls over whole lists, that all of that is unchanged, then adds
the plan by its id (GPU and dsckpt host memory, and the small pageable tensors such as
AdamW's step scalars, gathered into dsckpt memory the plan points into: ``_stage``), the
other host tensors from records packed once (the library stages them), contiguous copies of
the non-contiguous ones (made per save, as the walk does), and a blob of the cached tables
and frame with the leaves (param_groups, ...) encoded afresh (no pickle: a state dict with
values the blob's tree cannot hold is walked every time, its blob pickling those). The
library checks per allocation that the plan's memory is still the memory it was made from
and sends the plan whole when it is not ("resent"). Anything unproven is a cold save again,
with a new plan; state dicts a Shape cannot record are walked every time ("plain").

The file is the same either way, but for the order of its tensors: a cached save adds the
plan's first (planned, then staged), then the others, then the copies, each in walk order.
:func:`add_tensors` gives savers that build their own saves (dsckpt.dcp) the same cache for a
list of tensors.
"""
from __future__ import annotations

import collections
import itertools
import logging
import operator
import struct
import threading
from itertools import compress
from typing import Any, Dict, List, Optional, Tuple

import torch

from . import _blob, _stage, _torchext, _tree
from ._files import DTYPES
from ._flatten import _Flattener
from ._shape import Leaves, Shape, Uncacheable
from ._shape import _match
from ._tree import Unencodable
from .core import Connection, PackedTensors, Plan, Save, in_host_buffer, pack_tensors
from .errors import DsckptError

log = logging.getLogger("dsckpt.torch")

_T = torch.Tensor
_PLAIN = {torch.Tensor, torch.nn.Parameter}  # types whose data_ptr runs no Python code
_zero_place = operator.attrgetter("device", "layout")


def _pattern(objs) -> List[int]:
    """For each object, the index of its first occurrence (which ones are the same)."""
    first: Dict[int, int] = {}
    return list(map(first.setdefault, map(id, objs), itertools.count()))


class _Sub(torch.Tensor):
    """A tensor subclass, for the probe."""


def _probe_guards():
    """torch's C++ TensorGuards (torch >= 2.1, private) when it checks type, dtype, shape,
    stride, requires_grad and device the way _Tensors needs; None otherwise (lists are
    compared)."""
    try:
        from torch._C._dynamo.guards import TensorGuards
        a = torch.zeros(2, 3)
        g = TensorGuards(a, dynamic_dims_sizes=[[2, 3]], dynamic_dims_strides=[[3, 1]])
        ok = g.check(torch.ones(2, 3)) and not any(g.check(t) for t in (
            torch.zeros(2, 3, dtype=torch.float64), torch.zeros(3, 2), torch.zeros(3, 2).t(),
            torch.zeros(2, 3, requires_grad=True), torch.zeros(2, 3, device="meta"),
            torch.nn.Parameter(torch.zeros(2, 3), requires_grad=False),
            torch.zeros(2, 3).as_subclass(_Sub)))
        return TensorGuards if ok else None
    except Exception:  # noqa: BLE001 - absent or changed: compare lists instead
        return None


def _pack_ptrs(ptrs: List[int]) -> bytes:
    """Pointers as native size_t, as _match.same_pointers reads them."""
    return struct.pack(f"{len(ptrs)}N", *ptrs)


def _probe_pointers():
    """The address of torch's C function from a tensor object to its data pointer (private:
    what inductor's C++ wrapper calls, torch >= 2.6) when dsckpt._match is built and the
    function answers as Tensor.data_ptr does; None otherwise (data_ptr is called in Python)."""
    if _match is None or not hasattr(_match, "same_pointers"):
        return None
    try:
        from torch._C._dynamo.guards import _torchinductor_pyobject_tensor_data_ptr as fn
        if not isinstance(fn, int) or fn == 0:
            return None
        base = torch.arange(8.0)
        ts = [base, base[3:], torch.nn.Parameter(torch.zeros(2)), torch.empty(0)]
        ptrs = [t.data_ptr() for t in ts]
        ok = _match.same_pointers(fn, ts, _pack_ptrs(ptrs)) and \
            not _match.same_pointers(fn, ts, _pack_ptrs(ptrs[:1] + [ptrs[0]] + ptrs[2:])) and \
            not any(_match.same_pointers(fn, [x], _pack_ptrs([0]))  # refused, not thrown
                    for x in (None, torch.zeros(2).to_sparse()))
        return fn if ok else None
    except Exception:  # noqa: BLE001 - absent or changed: call data_ptr instead
        return None


_probe_lock = threading.Lock()
_probed: Dict[str, Any] = {}  # "guards": TensorGuards or None, "pointers": address or None


def _probe(what: str, probe):
    """probe()'s answer, asked once per process."""
    with _probe_lock:
        if what not in _probed:
            _probed[what] = probe()
        return _probed[what]


def _guard_class():
    """TensorGuards if usable (probed once), else None."""
    return _probe("guards", _probe_guards)


class _Tensors:
    """What the file and its blob take from each tensor of a state dict, in Shape order:
    type, pointer, dtype, shape, stride, requires_grad, and the storage offset of those
    whose storage another view shares (shared: the places whose blob records their offset
    relative to other views; a view alone in its storage is loaded the same at any
    offset); which places hold the same object; the device of those without memory
    (pointer 0)."""

    def __init__(self, tensors: List[torch.Tensor], shared: List[bool]):
        self.types = list(map(type, tensors))
        self.ptrs = list(map(_T.data_ptr, tensors))
        self.offset_mask = shared
        self.offset_all = all(shared)
        self.offsets = list(map(_T.storage_offset, compress(tensors, shared)))
        guard = _guard_class()
        # TensorGuards refuses one object twice: it checks each object's first place (the
        # places that hold one object are checked below).
        first = _pattern(tensors)
        self.guard_mask = [f == i for i, f in enumerate(first)]
        self.guard_all = all(self.guard_mask)
        once = list(compress(tensors, self.guard_mask))
        self.guard = guard(*once, dynamic_dims_sizes=[list(t.shape) for t in once],
                           dynamic_dims_strides=[list(t.stride()) for t in once]) \
            if guard is not None and tensors else None
        if self.guard is None:
            self.lists = self._lists(tensors)
        # Pointers are compared in C when every recorded type has no Python data_ptr (another
        # type in a place is then refused by the guard, the pointer being no proof of it).
        fast = _probe("pointers", _probe_pointers) if self.guard is not None else None
        self.plain = set(self.types) <= _PLAIN
        self.fast = fast if fast is not None and self.plain else None
        self.ptr_bytes = _pack_ptrs(self.ptrs) if self.fast is not None else b""
        # With the C++ proof (_torchext, once built) one call proves all of that.
        self.ext, self.ext_record, self.ext_tried = None, None, False
        self._ext_try(tensors)
        counts = collections.Counter(self.ptrs)
        # Only places that share a pointer can hold one object twice: the others differ.
        self.dup_mask = [counts[p] > 1 for p in self.ptrs]
        self.dups = any(self.dup_mask)
        self.dup_pattern = _pattern(compress(tensors, self.dup_mask))
        # A pointer names its device, but for tensors without memory.
        self.zero_mask = [p == 0 for p in self.ptrs]
        self.zeros = any(self.zero_mask)
        self.zero_places = list(map(_zero_place, compress(tensors, self.zero_mask)))

    def _ext_try(self, tensors: List[torch.Tensor]) -> None:
        """Takes the C++ proof's record of tensors (just walked, or proven) once its module is
        built; once only (a record may be None: a tensor it cannot describe)."""
        ext = _torchext.module() if self.plain and not self.ext_tried else None
        if ext is not None:
            self.ext, self.ext_record = ext, ext.record(tensors, self.offset_mask)
            self.ext_tried = True

    @staticmethod
    def _lists(tensors: List[torch.Tensor]) -> tuple:
        """dtype, shape, stride and requires_grad of each tensor, as lists."""
        return (list(map(operator.attrgetter("dtype"), tensors)), list(map(_T.size, tensors)),
                list(map(_T.stride, tensors)),
                list(map(operator.attrgetter("requires_grad"), tensors)))

    def hold(self, tensors: List[torch.Tensor]) -> bool:
        """Whether tensors (in Shape order) are what was recorded. The pointers first: the
        guard must not see a tensor without strides (nested: torch aborts there), which has
        other memory. The guard checks each object's type itself (a place holding the same
        object as another is checked by the pattern below)."""
        if self.ext_record is not None:
            return self.ext.check(self.ext_record, tensors) and (
                not self.dups or _pattern(compress(tensors, self.dup_mask)) == self.dup_pattern)
        if self.fast is not None:
            if not _match.same_pointers(self.fast, tensors, self.ptr_bytes):
                return False
        elif list(map(_T.data_ptr, tensors)) != self.ptrs:
            return False
        if self.guard is not None:
            once = tensors if self.guard_all else compress(tensors, self.guard_mask)
            if not self.guard.check(*once):
                return False
        elif list(map(type, tensors)) != self.types or self._lists(tensors) != self.lists:
            return False
        shared = tensors if self.offset_all else compress(tensors, self.offset_mask)
        if list(map(_T.storage_offset, shared)) != self.offsets:
            return False
        if self.dups and _pattern(compress(tensors, self.dup_mask)) != self.dup_pattern:
            return False
        if self.zeros and \
                list(map(_zero_place, compress(tensors, self.zero_mask))) != self.zero_places:
            return False
        if not self.ext_tried:
            self._ext_try(tensors)  # proven: the C++ proof may record them from now on
        return True


def _shared_storage(flat: _Flattener, tensors: List[torch.Tensor]) -> List[bool]:
    """For each tensor (Shape order) of a walked state dict: whether its view shares its
    storage with another view (its group in the blob has several)."""
    members = collections.Counter(v["group"] for v in flat.views)
    group_of = [flat.views[flat.entries[flat.by_object[id(t)]]["view"]]["group"]
                for t in tensors]
    return [members[g] > 1 for g in group_of]


class _Handing:
    """How a fixed list of contiguous tensors is added to saves: by a plan of the GPU and
    dsckpt host memory ones (with small pageable ones staged into it, _stage), the others
    one by one from records packed once; each kind in list order."""

    def __init__(self, conn: Connection, specs: List[tuple], datas: List[torch.Tensor]):
        planned, staged, others = [], [], []
        small = copied = 0
        first = ""  # the first tensor copied (ordinary CPU memory), for the warning
        for spec, data in zip(specs, datas):
            nbytes, cpu = spec[4], data.device.type == "cpu"
            if nbytes and (data.is_cuda or (cpu and in_host_buffer(spec[3], nbytes))):
                planned.append(spec)
            elif 0 < nbytes <= _stage.SMALL and small + nbytes <= _stage.TOTAL and cpu \
                    and _stage.fits(spec[3], data.dtype):
                staged.append((spec, data.dtype))
                small += nbytes
            else:
                others.append(spec)
                if cpu and nbytes:
                    copied += nbytes
                    first = first or spec[0]
        if copied:
            _stage.warn_copy(copied, first)
        self.plan: Optional[Plan] = None
        self.stage: Optional[_stage.Stage] = None
        try:
            if staged:
                self.stage = _stage.Stage(conn, planned, staged)
            elif planned:
                self.plan = conn.plan(planned)
        except DsckptError as e:  # e.g. memory a plan cannot take: add them every time
            log.debug("dsckpt: no save plan (%s); its tensors are added each save", e)
            others = planned + [spec for spec, _ in staged] + others
        self.others: Optional[PackedTensors] = pack_tensors(others)

    def prepare(self, s: Save) -> None:
        """Starts the library's check of the plan add(s) will use (Save.prepare_plan)."""
        plan = self.stage.next_plan() if self.stage is not None else self.plan
        if plan is not None:
            s.prepare_plan(plan)

    def add(self, s: Save) -> bool:
        """Adds the tensors to s; True when a plan was sent whole (memory under it changed)."""
        resent = False
        if self.stage is not None:
            resent = self.stage.add(s)
        elif self.plan is not None:
            resent = s.add_plan(self.plan)
        if self.others is not None:
            s.add_tensors(self.others)
        return resent

    def close(self) -> None:
        """Frees the plans (saves already ended are not affected)."""
        if self.plan is not None:
            self.plan.close()
        if self.stage is not None:
            self.stage.close()


class _Entry:
    """One file name's cached hand-over of a state dict on one connection (fixed once made,
    but for the staging buffers' turns; its plans are closed when the entry is replaced)."""

    def __init__(self, conn: Connection, flat: _Flattener, shape: Shape,
                 tensors: List[torch.Tensor], frame: bytes, frame_types: set, leaves: Leaves):
        self.shape = shape
        self.proof = _Tensors(tensors, _shared_storage(flat, tensors))
        self.ntensors = len(flat.views)
        self.nbytes = flat.nbytes
        self.tables = _blob.dump_tables(flat.views, flat.entries)
        self.frame = frame
        self.frame_types = frame_types  # the allowed classes the frame holds (namedtuples)
        self.leaves = leaves
        self.blob = self._dump(leaves)
        entry_of = flat.by_object
        view_at: Dict[int, int] = {}  # view → its first place in Shape order
        for place, t in enumerate(tensors):
            view_at.setdefault(flat.entries[entry_of[id(t)]]["view"], place)
        specs, datas = [], []
        self.copies: List[Tuple[int, tuple]] = []  # (place, spec) of non-contiguous views
        self.gpu_mask = [False] * len(tensors)
        self.device: Optional[torch.device] = flat.gpu[0].device if flat.gpu else None
        for vi, (spec, data, orig) in enumerate(zip(flat.specs, flat.payload, flat.originals)):
            if data is not orig:
                self.copies.append((view_at[vi], spec))
                continue
            if data.is_cuda:
                self.gpu_mask[view_at[vi]] = True
            specs.append(spec)
            datas.append(data)
        self.handing = _Handing(conn, specs, datas)

    def blob_of(self, leaves: List[Any]) -> bytes:
        """The blob of a save whose leaves (Shape order) are these: the last save's when they
        encode to the same bytes, else made anew (raises Unencodable as Leaves)."""
        if not self.leaves.same(leaves):
            made = Leaves(leaves, self.leaves)
            self.blob = self._dump(made)
            self.leaves = made
        return self.blob

    def _dump(self, leaves: Leaves) -> bytes:
        """The blob of the frame and these leaves, its header naming their allowed classes."""
        types = self.frame_types | leaves.types
        head = _blob.header((), types) if types else _blob.HEADER
        return _blob.dump(self.tables, self.frame, leaves.encoded, head=head)

    def add(self, s: Save, tensors: List[torch.Tensor]) -> Tuple[bool, list]:
        """Adds tensors (in Shape order, proven to be the recorded ones) to s: the handing's,
        then contiguous copies of the non-contiguous ones. Returns whether a plan was sent
        whole, and the GPU tensors the daemon reads until SNAPSHOT."""
        resent = self.handing.add(s)
        keep = list(compress(tensors, self.gpu_mask))
        if self.copies:
            datas = [tensors[place].detach().contiguous() for place, _ in self.copies]
            s.add_tensors([(name, dtype, shape, data.data_ptr() if nbytes else 0, nbytes)
                           for (_, (name, dtype, shape, _, nbytes)), data
                           in zip(self.copies, datas)])  # host copies are staged by now
            keep += [data for data in datas if data.is_cuda]
        return resent, keep

    def close(self) -> None:
        """Frees the plans (saves already ended are not affected)."""
        self.handing.close()


class _Listed:
    """A cached hand-over of a list of contiguous tensors (add_tensors): the specs it was
    made from, which a later list must equal."""

    def __init__(self, conn: Connection, specs: List[tuple], datas: List[torch.Tensor]):
        self.specs = specs
        self.handing = _Handing(conn, specs, datas)

    def close(self) -> None:
        """Frees the plans."""
        self.handing.close()


MAX_ENTRIES = 4  # cached file names per connection: each holds up to two plans in the
# daemon, which allows max_plans_per_user (64) for all of one user's ranks on the node


class _Cache:
    """A connection's entries by file name, the least recently used first; its lock
    serialises the connection's saves through this module."""

    def __init__(self):
        self.lock = threading.Lock()
        # file → _Entry, ("list", file) → _Listed
        self.entries: "collections.OrderedDict[Any, Any]" = collections.OrderedDict()
        self.counts = collections.Counter()  # how saves were handed over (see Handed.how)

    def get(self, file):
        """file's entry (now the most recently used), or None."""
        entry = self.entries.get(file)
        if entry is not None:
            self.entries.move_to_end(file)
        return entry

    def replace(self, file, entry) -> None:
        """Makes entry file's (None: forgets it) and closes the one it replaces, and the
        least recently used beyond MAX_ENTRIES (a run saving under ever new names)."""
        old = self.entries.pop(file, None)
        if entry is not None:
            self.entries[file] = entry
        if old is not None and old is not entry:
            old.close()
        while len(self.entries) > MAX_ENTRIES:
            self.entries.popitem(last=False)[1].close()


_caches_lock = threading.Lock()


def cache(conn: Connection) -> _Cache:
    """The hand-over cache kept on a connection (made on first use)."""
    with _caches_lock:
        c = getattr(conn, "_dsckpt_handover", None)
        if c is None:
            c = conn._dsckpt_handover = _Cache()
        return c


def counts(conn: Connection) -> Dict[str, int]:
    """How many saves of conn were handed over each way: "warm" (plan by id), "resent"
    (warm, but the library sent the plan whole), "cold" (walked, new plan), "plain"
    (walked, no cache)."""
    return dict(cache(conn).counts)


class Handed:
    """A save with its tensors and blob added (not ended): the GPU tensors to keep until
    SNAPSHOT, the first GPU tensor's device, the file's tensor count and bytes, and how it
    was handed over ("warm", "resent", "cold" or "plain")."""

    def __init__(self, save: Save, keep: list, device, ntensors: int, nbytes: int, how: str):
        self.save = save
        self.keep = keep
        self.device = device
        self.ntensors = ntensors
        self.nbytes = nbytes
        self.how = how


def hand_over(conn: Connection, state_dict: Any, dir: str, file: str) -> Handed:
    """Opens a save of ``dir/file`` and adds state_dict's tensors and blob: warm when
    conn's entry for file proves the state dict unchanged, else walked (cold or plain). The
    save's start goes to the daemon first (early: the daemon makes the directory and the
    file while this proves or walks); what it refuses there is raised by Save.end."""
    c = cache(conn)
    with c.lock:
        s = conn.save(dir, file, early=True)
        try:
            entry = c.get(file)
            handed = None
            if entry is not None:
                handed, s = _warm(conn, entry, state_dict, s)
            if handed is None:
                handed = _cold(conn, c, state_dict, s)
        except BaseException:
            s.close()
            raise
        c.counts[handed.how] += 1
        return handed


def _warm(conn: Connection, entry: _Entry, state_dict: Any,
          s: Save) -> Tuple[Optional[Handed], Save]:
    """The save s through entry, or None when state_dict is not what entry recorded; and the
    save to go on with (a new one when s took part of the cached hand-over and failed)."""
    try:
        # The library's driver queries for the plan run while this matches and proves. Their
        # answers are as of now: add_plan uses them only once the proof shows that the state
        # dict, held by the caller throughout, has its tensors at the plan's addresses.
        entry.handing.prepare(s)
        found = entry.shape.match(state_dict)
        if found is None or not entry.proof.hold(found[0]):
            return None, s
        blob = entry.blob_of(found[1])
    except Unencodable:  # a tensor, or a value to pickle: the walk decides
        return None, s
    except Exception as e:  # noqa: BLE001 - whatever a proof trips on: walk instead
        log.debug("dsckpt: cached hand-over of %s not usable: %r", s.file, e)
        return None, s
    try:
        resent, keep = entry.add(s, found[0])
        s.add_blob(_blob.BLOB, blob)
    except DsckptError as e:  # e.g. the plan, sent anew, met memory a plan cannot take
        s.close()
        log.debug("dsckpt: cached hand-over of %s failed, walking instead: %s", s.file, e)
        return None, conn.save(s.dir, s.file, defer=True)
    return Handed(s, keep, entry.device, entry.ntensors, entry.nbytes,
                  "resent" if resent else "warm"), s


def _cold(conn: Connection, c: _Cache, state_dict: Any, s: Save) -> Handed:
    """The save s through the full walk; makes the file's entry when state_dict can be
    cached."""
    flat = _Flattener(conn.max_tensors)   # more tensors: refused before any is staged or sent
    flat.walk(state_dict, "")
    made = _entry(conn, flat, state_dict, s.file)
    c.replace(s.file, made[0] if made is not None else None)
    if made is not None:
        entry, tensors = made
        _, keep = entry.add(s, tensors)
        blob = entry.blob
    else:
        keep = flat.gpu
        s.add_tensors(flat.specs)
        blob = _blob.dump_state(state_dict, _blob.dump_tables(flat.views, flat.entries),
                                flat.objects)
    s.add_blob(_blob.BLOB, blob)
    return Handed(s, keep, flat.gpu[0].device if flat.gpu else None, len(flat.views),
                  flat.nbytes, "cold" if made is not None else "plain")


def _entry(conn: Connection, flat: _Flattener, state_dict: Any, file: str):
    """(entry, tensors in Shape order) for a walked state dict, or None when it cannot be
    cached."""
    if flat.pickled:
        return None  # tensors the skeleton pickles: the walk decides about them every time
    try:
        shape = Shape(state_dict, flat.by_object, len(flat.entries))
        found = shape.match(state_dict)
        if found is None:
            return None
        frame_types: set = set()
        frame = _tree.encode(shape.frame, {id(s): i for i, s in enumerate(shape.seeds())},
                             types=frame_types)
        leaves = Leaves(found[1])
    except (Uncacheable, Unencodable) as e:
        log.debug("dsckpt: %s saved without a cached hand-over: %s", file, e)
        return None
    except Exception as e:  # noqa: BLE001 - a structure Shape did not foresee: walk each time
        log.debug("dsckpt: %s saved without a cached hand-over: %r", file, e)
        return None
    return _Entry(conn, flat, shape, found[0], frame, frame_types, leaves), found[0]


def add_tensors(conn: Connection, s: Save, key: str, tensors: List[Tuple[str, torch.Tensor]]
                ) -> str:
    """Adds contiguous ``(name, tensor)`` pairs to s (a save of conn) by a plan cached under
    key when the list is the one the key's last save had (names, dtypes, shapes, pointers,
    bytes), else by the tensors themselves and a new plan. Returns how ("warm", "resent" or
    "cold"). For savers that build their own saves (dsckpt.dcp)."""
    specs = [(name, DTYPES[t.dtype], tuple(t.shape), t.data_ptr() if t.numel() else 0,
              t.numel() * t.element_size()) for name, t in tensors]
    c = cache(conn)
    with c.lock:
        listed = c.get(("list", key))
        if listed is not None and listed.specs == specs:
            try:
                how = "resent" if listed.handing.add(s) else "warm"
            except DsckptError:  # the plan, sent anew, met memory it cannot take
                c.replace(("list", key), None)
                raise
        else:
            listed = _Listed(conn, specs, [t for _, t in tensors])
            c.replace(("list", key), listed)
            listed.handing.add(s)
            how = "cold"
        c.counts[how] += 1
        return how
