"""dsckpt.export — one checkpoint tag out as one file of full tensors, for inference and model
hubs: ``torch.save``'s format (``.pt``, ``.bin``, ``.ckpt``, anything else) or safetensors
(``.safetensors``). From the shell::

    python -m dsckpt export TAG_DIR out.pt            # or out.safetensors
    dsckptctl export TAG_DIR out.safetensors          # the same (dsckptctl runs this)

What a tag holds decides what is exported (:func:`state_dict`):

* a DCP tag (``dcp_metadata.meta``, written by :class:`dsckpt.dcp.Writer`): every item at
  its full size, the shards of every rank (FSDP, DTensor, ShardedTensor) put together by
  DCP's own planner through :class:`dsckpt.dcp.Reader`, nested as the state dict was: what
  ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save`` makes of a
  FileSystemWriter's directory (:func:`dcp_to_torch_save` here is that, for our tags; it
  needs torch >= 2.4);
* a DeepSpeed tag (``*_model_states.pt.safetensors``, from :mod:`dsckpt.deepspeed`): the fp32
  master weights consolidated from the ZeRO 1/2/3 optimizer shards
  (:mod:`dsckpt.deepspeed.zero_to_fp32`);
* a tag of :func:`dsckpt.torch.save` (one ``<file>.safetensors`` per rank, Lightning's
  ``rank0`` included): the state dict of its one file, or of ``file`` when it has several
  (the ranks of a data-parallel run hold the same state).

A tag must be committed (``allow_uncommitted`` exports the files of one that is not).
``key`` narrows it to one entry (a key path, ``state_dict`` of a Lightning checkpoint,
``module`` of a DeepSpeed model file). ``torch.save`` output keeps the state dict as it is
(nested containers and non-tensor values, tensors that overlap in memory still sharing it,
and only their bytes written: each tensor or group of overlapping ones gets a storage of its
own, whatever buffer the load put them in);
safetensors output holds its tensors alone, named by key path (``model.layers.0.weight``),
each its own bytes (tied weights are written twice), with a dsckpt XXH3-64 checksum per
tensor and of the data in ``__metadata__`` so that ``dsckptctl verify out.safetensors``
checks it; the non-tensor values left out are counted in the summary. Every tensor read
from the tag is checked against its checksum; nothing is unpickled unless
``weights_only=False``. Tensors are written bit for bit as stored, dtype and shape kept.

Why no ``.metadata`` for DCP's own tools: DCP's FileSystemReader reads each item with
``torch.load``, and our files are safetensors, so a ``.metadata`` beside them would only
move its failure (``invalid load key``) from the metadata to the first tensor.
"""
from __future__ import annotations

import collections
import ctypes
import json
import os
import struct
from typing import Any, Dict, List, Optional, Tuple

import torch

from . import _xxh3, manifest
from .errors import DsckptError
from ._files import DTYPES, KEY_DATA, KEY_TENSOR

DCP_META = "dcp_metadata.meta"
ALIGN = 8  # the safetensors header is padded so that data starts at a multiple of this


class ExportError(ValueError):
    """A tag that cannot be exported as asked (what it is, what to give)."""


# ---------------------------------------------------------------------------------------
# What a tag is, and its state dict


def kind(tag_dir: str) -> str:
    """What wrote tag_dir: "dcp", "deepspeed" or "torch"; ExportError for anything else."""
    from .deepspeed.zero_to_fp32 import is_deepspeed_tag
    if not os.path.isdir(tag_dir):
        raise ExportError(f"{tag_dir} is not a directory (a checkpoint tag directory is)")
    if os.path.exists(os.path.join(tag_dir, DCP_META)):
        return "dcp"
    if is_deepspeed_tag(tag_dir):
        return "deepspeed"
    if _torch_files(tag_dir):
        return "torch"
    raise ExportError(f"{tag_dir} holds no checkpoint dsckpt wrote (no *.safetensors file)")


def _torch_files(tag_dir: str) -> List[str]:
    """The files (names without .safetensors) of a tag of dsckpt.torch.save, but the empty
    markers of ranks that saved nothing (dsckpt_rank<N>)."""
    names = [n[:-len(".safetensors")] for n in os.listdir(tag_dir)
             if n.endswith(".safetensors") and not n.startswith("dsckpt_rank")]
    return sorted(names)


def require_committed(tag_dir: str) -> None:
    """Raises ExportError unless tag_dir is committed (its MANIFEST.json is there, and every
    seal record it names: dsckpt.manifest.load): files of a tag still being saved, or whose
    save died, are not a checkpoint."""
    try:
        manifest.load(tag_dir)
    except FileNotFoundError:
        raise ExportError(f"{tag_dir} is not committed (no MANIFEST.json): a save into it may "
                          "be in flight or have died (dsckptctl info says which); "
                          "--allow-uncommitted exports the files it holds") from None
    except DsckptError as e:
        raise ExportError(f"{tag_dir} is not a whole checkpoint: {e}") from None


def dcp_state_dict(tag_dir: str, weights_only: bool = True) -> Dict[str, Any]:
    """Every item of a committed DCP tag at full size, as dcp_to_torch_save builds it: DCP's
    planner for an empty state dict, reading through dsckpt.dcp.Reader."""
    try:
        from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
        from .dcp import Reader
    except ImportError as e:
        raise ExportError(f"{tag_dir} is a DCP checkpoint: exporting it needs PyTorch >= 2.4 "
                          f"(this is {torch.__version__}): {e}") from e
    sd: Dict[str, Any] = {}
    _load_state_dict(sd, storage_reader=Reader(tag_dir, weights_only=weights_only),
                     planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    return sd


def _torch_state_dict(tag_dir: str, file: Optional[str], weights_only: bool) -> Any:
    """The state dict of one file of a dsckpt.torch tag."""
    from . import torch as dtorch
    files = _torch_files(tag_dir)
    if file is None and len(files) != 1:
        raise ExportError(f"{tag_dir} holds {len(files)} files ({', '.join(files[:8])}): "
                          "name the one to export (--file; the ranks of a data-parallel run "
                          "hold the same state)")
    file = file if file is not None else files[0]
    if file not in files:
        raise ExportError(f"{tag_dir} has no file {file}.safetensors (it has "
                          f"{', '.join(files[:8])})")
    return dtorch.load(tag_dir, file, map_location="cpu", weights_only=weights_only)


def _narrow(sd: Any, key: str, tag_dir: str) -> Any:
    """The entry at key path key (dots between keys; list indices as numbers)."""
    node = sd
    for part in key.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, (list, tuple)) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            have = ", ".join(map(str, list(node)[:10])) if isinstance(node, dict) else \
                type(node).__name__
            raise ExportError(f"{tag_dir}: no entry {key!r} (at {part!r}; there: {have})")
    return node


def state_dict(tag_dir: str, *, file: Optional[str] = None, key: Optional[str] = None,
               weights_only: bool = True, allow_uncommitted: bool = False) -> Any:
    """The state dict a tag exports (see the module docstring), on the CPU; a tag not
    committed raises ExportError unless allow_uncommitted (a DCP tag always does: its
    metadata is written at commit)."""
    tag_dir = os.fspath(tag_dir)
    what = kind(tag_dir)
    if not allow_uncommitted:
        require_committed(tag_dir)
    if what == "dcp":
        sd = dcp_state_dict(tag_dir, weights_only)
    elif what == "deepspeed":
        from .deepspeed.zero_to_fp32 import state_dict_of_tag
        sd = state_dict_of_tag(tag_dir, weights_only=weights_only)
    else:
        sd = _torch_state_dict(tag_dir, file, weights_only)
    return _narrow(sd, key, tag_dir) if key else sd


# ---------------------------------------------------------------------------------------
# Writing


def flatten(sd: Any) -> Tuple[Dict[str, torch.Tensor], int]:
    """The tensors of a nested state dict by key path, and how many other values it holds."""
    out: Dict[str, torch.Tensor] = {}
    other = 0

    def walk(node: Any, path: str) -> None:
        """Adds node's tensors under path, counting what is neither tensor nor container."""
        nonlocal other
        if isinstance(node, torch.Tensor):
            out[path or "tensor"] = node
        elif isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{path}.{k}" if path else str(k))
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                walk(v, f"{path}.{i}" if path else str(i))
        else:
            other += 1
    walk(sd, "")
    return out, other


def _bytes(t: torch.Tensor) -> memoryview:
    """A tensor's bytes in row-major order, as a byte view (a contiguous CPU copy if needed)."""
    t = t.detach().to("cpu").contiguous()
    if t.numel() == 0:
        return memoryview(b"")
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def write_safetensors(tensors: Dict[str, torch.Tensor], path: str,
                      metadata: Optional[Dict[str, str]] = None) -> None:
    """Writes tensors as a safetensors file with dsckpt checksums in __metadata__ (replaced
    whole: written beside it, then renamed)."""
    header: Dict[str, Any] = {}
    views, offset = [], 0
    meta = dict(metadata or {})
    for name, t in tensors.items():
        if t.dtype not in DTYPES:
            raise ExportError(f"tensor {name} is {t.dtype}, which safetensors cannot hold: "
                              "export to a torch.save file instead")
        view = _bytes(t)
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + view.nbytes]}
        meta[KEY_TENSOR + name] = f"{_xxh3.digest(view):016x}"
        views.append(view)
        offset += view.nbytes
    meta[KEY_DATA] = f"{_data_xxh3(views):016x}"
    body = json.dumps({"__metadata__": meta, **header}, separators=(",", ":")).encode()
    body += b" " * (-len(body) % ALIGN)
    tmp = f"{path}.partial"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(body)))
        f.write(body)
        for view in views:
            f.write(view)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _data_xxh3(views: List[memoryview]) -> int:
    """XXH3-64 of the views one after another (the data region), streamed: the xxhash
    package's hasher, else libxxhash's state functions (what dsckpt._xxh3 finds)."""
    try:
        import xxhash
        h = xxhash.xxh3_64()
        for v in views:
            h.update(v)
        return h.intdigest()
    except ImportError:
        pass
    lib = ctypes.CDLL("libxxhash.so.0")
    lib.XXH3_createState.restype = ctypes.c_void_p
    lib.XXH3_64bits_reset.argtypes = [ctypes.c_void_p]
    lib.XXH3_64bits_update.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.XXH3_64bits_digest.argtypes = [ctypes.c_void_p]
    lib.XXH3_64bits_digest.restype = ctypes.c_uint64
    lib.XXH3_freeState.argtypes = [ctypes.c_void_p]
    state = lib.XXH3_createState()
    if not state:
        raise MemoryError("XXH3_createState")
    try:
        lib.XXH3_64bits_reset(state)
        for v in views:
            if v.nbytes:
                buf = (ctypes.c_char * v.nbytes).from_buffer(v)
                lib.XXH3_64bits_update(state, ctypes.cast(buf, ctypes.c_char_p), v.nbytes)
        return int(lib.XXH3_64bits_digest(state))
    finally:
        lib.XXH3_freeState(state)


def _storage_key(t: torch.Tensor) -> int:
    """The address of the memory a tensor is a view of (its storage's first byte)."""
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage().data_ptr()
    return t.storage().data_ptr()


def _span(t: torch.Tensor) -> Tuple[int, int]:
    """The bytes of its storage a tensor covers, [begin, end)."""
    size = t.element_size()
    n = 1 + sum((d - 1) * st for d, st in zip(t.shape, t.stride())) if t.numel() else 0
    begin = t.storage_offset() * size
    return begin, begin + n * size


def _regroup(tensors: List[torch.Tensor]) -> Dict[int, torch.Tensor]:
    """New tensors (by id of the old) that share memory exactly where the old ones overlap:
    each group of overlapping views of one storage copied into a storage of its own, so that
    torch.save writes their bytes and no others (a load through the daemon puts every tensor
    of a file in one buffer; an entry exported alone must not carry its neighbours)."""
    by_storage: Dict[int, List[torch.Tensor]] = {}
    for t in tensors:
        by_storage.setdefault(_storage_key(t), []).append(t)
    out: Dict[int, torch.Tensor] = {}
    for members in by_storage.values():
        members.sort(key=_span)
        group: List[torch.Tensor] = []
        end = -1
        for t in members + [None]:
            if t is not None and group and _span(t)[0] < end:
                group.append(t)
                end = max(end, _span(t)[1])
                continue
            if group:
                out.update(_copy_group(group))
            if t is not None:
                group, end = [t], _span(t)[1]
    return out


def _copy_group(group: List[torch.Tensor]) -> Dict[int, torch.Tensor]:
    """The tensors of one group of overlapping views as views of one new storage, at the
    same places relative to each other."""
    lo = _span(group[0])[0]
    hi = max(_span(t)[1] for t in group)
    buf = torch.empty((hi - lo + 7) // 8 * 8, dtype=torch.uint8)
    out = {}
    with torch.no_grad():
        for t in group:
            at, size = _span(t)[0] - lo, t.element_size()
            if at % size:  # views of one memory as dtypes it does not align to: apart
                new = t.detach().clone()
            else:
                new = buf.view(t.dtype).as_strided(t.shape, t.stride(), at // size)
                new.copy_(t)
            if isinstance(t, torch.nn.Parameter):
                new = torch.nn.Parameter(new, requires_grad=t.requires_grad)
            elif t.requires_grad:
                new.requires_grad_(True)
            out[id(t)] = new
    return out


def _replace(node: Any, new: Dict[int, torch.Tensor], made: Dict[int, Any]) -> Any:
    """A copy of node's dicts, lists and tuples with each tensor t replaced by new[id(t)]
    (one container met twice stays one; containers of other types are kept as they are)."""
    if isinstance(node, torch.Tensor):
        return new.get(id(node), node)
    if id(node) in made:
        return made[id(node)]
    if type(node) in (dict, collections.OrderedDict):
        out = made[id(node)] = type(node)()
        for k, v in node.items():
            out[k] = _replace(v, new, made)
        return out
    if type(node) is list:
        out = made[id(node)] = []
        out.extend(_replace(v, new, made) for v in node)
        return out
    if type(node) is tuple:
        return tuple(_replace(v, new, made) for v in node)
    return node


def _tensors(node: Any, out: Dict[int, torch.Tensor]) -> Dict[int, torch.Tensor]:
    """The tensors _replace reaches in node, by id."""
    if isinstance(node, torch.Tensor):
        out[id(node)] = node
    elif type(node) in (dict, collections.OrderedDict):
        for v in node.values():
            _tensors(v, out)
    elif type(node) in (list, tuple):
        for v in node:
            _tensors(v, out)
    return out


def write(sd: Any, path: str, fmt: Optional[str] = None) -> Dict[str, Any]:
    """Writes sd to path as "torch" (torch.save) or "safetensors" (default: by the suffix);
    returns a summary: format, tensors, bytes, values left out."""
    path = os.fspath(path)
    fmt = fmt or ("safetensors" if path.endswith(".safetensors") else "torch")
    tensors, other = flatten(sd)
    if fmt == "safetensors":
        write_safetensors(tensors, path)
    elif fmt == "torch":
        tmp = f"{path}.partial"
        cpu = [t for t in _tensors(sd, {}).values() if t.device.type == "cpu"]
        sd = _replace(sd, _regroup(cpu), {})
        torch.save(sd, tmp)
        os.replace(tmp, path)
    else:
        raise ExportError(f"unknown format {fmt!r}: 'torch' or 'safetensors'")
    return {"path": path, "format": fmt, "tensors": len(tensors),
            "bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
            "left_out": other if fmt == "safetensors" else 0}


def export(tag_dir: str, out: str, *, fmt: Optional[str] = None, file: Optional[str] = None,
           key: Optional[str] = None, weights_only: bool = True,
           allow_uncommitted: bool = False) -> Dict[str, Any]:
    """Exports a tag (see the module docstring) to out; returns write's summary and the kind
    of tag."""
    summary = write(state_dict(tag_dir, file=file, key=key, weights_only=weights_only,
                               allow_uncommitted=allow_uncommitted), out, fmt)
    summary["kind"] = kind(tag_dir)
    return summary


def dcp_to_torch_save(dcp_checkpoint_dir, torch_save_path) -> None:
    """``torch.distributed.checkpoint.format_utils.dcp_to_torch_save`` for a tag
    :class:`dsckpt.dcp.Writer` committed: the same state dict, the same torch.save file."""
    write(dcp_state_dict(os.fspath(dcp_checkpoint_dir)), os.fspath(torch_save_path), "torch")


__all__ = ["export", "state_dict", "write", "write_safetensors", "flatten", "kind",
           "dcp_state_dict", "dcp_to_torch_save", "ExportError"]
