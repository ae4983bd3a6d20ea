"""dsckpt.materialize — a model built without weights, given its parameters, buffers and
optimizer state straight from a checkpoint on the device it trains on.

A restarted trainer that builds its model normally initialises every parameter at random
(on the CPU, then copies it to the GPU) only for the checkpoint to overwrite it. Instead::

    with dsckpt.materialize.empty_weights():        # or: with torch.device("meta"):
        model = GPT(config)                         # parameters on the meta device: no init
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    model, opt, how, state = dsckpt.torch.materialize(model, opt, "/ckpt/job/step100",
                                                      device="cuda:0")

:func:`materialize` reads the checkpoint's structure (its ``.meta`` blob: the state dict
``dsckpt.torch.save`` wrote, ``{"model": model.state_dict(), "optimizer":
opt.state_dict()}`` by default, see ``model_key`` and ``optimizer_key``), checks it against
the model and the optimizer, allocates one empty tensor per saved tensor on ``device`` and
has them filled the way :func:`dsckpt.torch.load_into` fills tensors: by the daemon when one
answers (from its host cache when it holds the file, checksums checked, GPU memory written by
the daemon), else by reading the file here, every checksum checked. No byte passes through a
CPU copy on the daemon's path; nothing is initialised twice. Then every parameter and
persistent buffer of the model is replaced by its loaded tensor (a parameter shared by
several modules stays one parameter), the optimizer's parameter groups point at the new
parameters and its state (AdamW's ``exp_avg``, ``exp_avg_sq``, ``step``) and group settings
are the checkpoint's. Scalars the optimizer saved on the CPU (``step``) stay there, as torch's
optimizers keep them. Non-persistent buffers are not in any checkpoint: they must be built on
a real device (``empty_weights`` keeps buffers where they are made) and are moved to
``device``.

Everything is checked before anything is allocated: a key the model has and the checkpoint
lacks, a key only the checkpoint has (``strict``), a shape or dtype other than the model's,
optimizer groups of other sizes, a parameter or buffer left on the meta device raise
(:class:`dsckpt.torch.StateDictMismatch`, a KeyError naming the keys, or ValueError) and leave
the model and the optimizer as they were; so does a load that fails (a checksum, say).

Works with torch 1.13 (``empty_weights``; ``with torch.device("meta")`` needs torch >= 2.0,
``load_state_dict(assign=True)`` torch >= 2.1 and is not used here).
"""
from __future__ import annotations

import contextlib
import os
from collections import defaultdict
from itertools import chain
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Tuple, Union

import torch

from . import _blob, _fill
from ._files import read_meta
from ._fill import StateDictMismatch
from ._flatten import _DTYPES_BY_NAME, _is_contiguous, _rebuild_views
from .core import Connection

Device = Union[str, torch.device, None]


class Materialized(NamedTuple):
    """What :func:`materialize` returns: the model and optimizer (the objects given, filled),
    how the checkpoint was read (``"daemon"`` or ``"file"``) and the whole state dict loaded
    (what else was saved beside them: a step count, a scheduler's state, an RNG state)."""

    model: torch.nn.Module
    optimizer: Optional[torch.optim.Optimizer]
    how: str
    state: Any


@contextlib.contextmanager
def empty_weights() -> Iterator[None]:
    """Modules built inside put every parameter they register on the meta device (the
    initialisation of a meta tensor does nothing); buffers stay where they are made. Works
    with any torch; under torch >= 2.0 ``with torch.device("meta")`` does the same for
    buffers too."""
    register = torch.nn.Module.register_parameter

    def on_meta(module, name, param):
        """register_parameter with a meta copy of a parameter made elsewhere."""
        if param is not None and not param.is_meta:
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def _saved(path_dir: str, file: str, weights_only: bool) -> Tuple[dict, List[dict], List[dict]]:
    """The checkpoint's blob sections, views and entries; raises where it has none."""
    from .torch import BLOB  # here: dsckpt.torch imports this module at its end
    meta = os.path.join(path_dir, file + ".meta")
    blob = read_meta(meta).get(BLOB) if os.path.exists(meta) else None
    if blob is None:
        raise ValueError(f"{meta}: no {BLOB} blob (not written by dsckpt.torch.save): "
                         "materialize needs the state dict's structure")
    info = _blob.read(blob, meta, weights_only)
    views, entries = _blob.tables(info)
    return info, views, entries


def _pick(state: Any, key: Optional[str], what: str, path: str) -> Any:
    """state[key] (state itself for key None); ValueError where it is not a dict."""
    part = state if key is None else (state.get(key) if isinstance(state, dict) else None)
    if not isinstance(part, dict):
        raise ValueError(f"{path}: the checkpoint has no {what} state dict under key {key!r}")
    return part


def _on_meta(info: dict, views: List[dict], entries: List[dict]) -> Tuple[Any, Dict[int, int]]:
    """The saved state dict with a meta tensor per entry (its structure, dtypes and shapes,
    no data), and the view of each of those tensors by id."""
    table, view_of = [], {}
    for e in entries:
        v = views[e["view"]]
        t = torch.empty(v["shape"], dtype=_DTYPES_BY_NAME[v["dtype"]], device="meta")
        view_of[id(t)] = e["view"]
        table.append(t)
    return _blob.skeleton(info, table), view_of


def _describe(t: torch.Tensor) -> str:
    """A tensor's dtype and shape, as mismatches name them."""
    return f"{str(t.dtype)[6:]} {list(t.shape)}"


def _check_model(model: torch.nn.Module, saved: dict, path: str, strict: bool,
                 prefix: str) -> None:
    """Raises StateDictMismatch unless every tensor of the model's state dict is saved with
    its dtype and shape (and, when strict, nothing else is), or ValueError naming a
    non-persistent buffer left on the meta device."""
    want = {k: v for k, v in model.state_dict(keep_vars=True).items()
            if isinstance(v, torch.Tensor)}
    missing = [prefix + k for k in want if not isinstance(saved.get(k), torch.Tensor)]
    unexpected = [prefix + k for k, v in saved.items()
                  if isinstance(v, torch.Tensor) and k not in want] if strict else []
    mismatched = [f"{prefix}{k} (model {_describe(t)}, checkpoint {_describe(saved[k])})"
                  for k, t in want.items() if isinstance(saved.get(k), torch.Tensor)
                  and (t.dtype != saved[k].dtype or t.shape != saved[k].shape)]
    if missing or unexpected or mismatched:
        raise StateDictMismatch(path, missing, unexpected, mismatched)
    _check_lost(model)


def _check_lost(model: torch.nn.Module) -> None:
    """Raises ValueError naming the non-persistent buffers left on the meta device."""
    lost = [f"{mod_name + '.' if mod_name else ''}{name}"
            for mod_name, mod in model.named_modules()
            for name, b in mod._buffers.items()
            if b is not None and b.is_meta and name in mod._non_persistent_buffers_set]
    if lost:
        raise ValueError(f"non-persistent buffers on the meta device, which no checkpoint "
                         f"holds: {', '.join(lost)}; build the model under "
                         "dsckpt.materialize.empty_weights() (buffers stay real)")


def _check_optimizer(optimizer: torch.optim.Optimizer, saved: dict, path: str) -> None:
    """Raises ValueError unless the saved optimizer state has the optimizer's groups, of the
    same sizes, and state only for parameters of those groups."""
    groups, saved_groups = optimizer.param_groups, saved.get("param_groups")
    if not isinstance(saved_groups, list) or len(groups) != len(saved_groups):
        raise ValueError(f"{path}: the checkpoint's optimizer has "
                         f"{len(saved_groups) if isinstance(saved_groups, list) else 'no'} "
                         f"parameter groups, the optimizer {len(groups)}")
    for i, (g, s) in enumerate(zip(groups, saved_groups)):
        if len(g["params"]) != len(s.get("params", ())):
            raise ValueError(f"{path}: parameter group {i} of the checkpoint's optimizer has "
                             f"{len(s.get('params', ()))} parameters, the optimizer's "
                             f"{len(g['params'])}")
    ids = set(chain.from_iterable(s["params"] for s in saved_groups))
    stray = [k for k in saved.get("state", {}) if k not in ids]
    if stray:
        raise ValueError(f"{path}: the checkpoint's optimizer has state for parameters "
                         f"{stray[:8]} of no parameter group")


def _tensors_in(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor inside nested dicts, lists and tuples."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors_in(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors_in(v)


def _places(saved_model: dict, saved_opt: Optional[dict], views: List[dict],
            view_of: Dict[int, int], target: torch.device) -> List[torch.device]:
    """Where each view goes: the model's and the optimizer's to target, but the optimizer's
    ``step`` scalars saved on the CPU (torch's optimizers keep them there unless capturable or
    fused, and move them themselves then); anything else saved on the CPU (an RNG state, say)
    stays there, the rest goes to target."""
    places = [torch.device("cpu") if v["device"] == "cpu" else target for v in views]
    steps = {id(s.get("step")) for s in (saved_opt or {}).get("state", {}).values()
             if isinstance(s, dict)}
    for t in chain(_tensors_in(saved_model), _tensors_in(saved_opt)):
        vi = view_of.get(id(t))
        cpu_step = id(t) in steps and t.dim() == 0
        if vi is not None and not (cpu_step and views[vi]["device"] == "cpu"):
            places[vi] = target
    return places


def _allocate(views: List[dict], places: List[torch.device]) -> Dict[str, torch.Tensor]:
    """An empty contiguous destination per view, on its place."""
    return {v["name"]: torch.empty(v["shape"], dtype=_DTYPES_BY_NAME[v["dtype"]], device=p)
            for v, p in zip(views, places)}


def _tensors(views: List[dict], dests: Dict[str, torch.Tensor], places: List[torch.device],
             entries: List[dict]) -> List[torch.Tensor]:
    """A tensor per entry from the filled destinations: a view alone in its storage is its
    destination; views that shared a storage when saved share one again (on the place of the
    first)."""
    groups: Dict[int, List[int]] = {}
    for i, v in enumerate(views):
        groups.setdefault(v["group"], []).append(i)
    out: List[Optional[torch.Tensor]] = [None] * len(views)
    for members in groups.values():
        v = views[members[0]]
        if len(members) == 1 and _is_contiguous(v["shape"], v["stride"]):
            out[members[0]] = dests[v["name"]]
            continue
        shared = _rebuild_views([views[i] for i in members], dests, places[members[0]])
        for i, t in zip(members, shared):
            out[i] = t
    table, used = [], set()
    for e in entries:
        t = out[e["view"]]
        if e["view"] in used:  # another object over the same view: alias it, as load does
            t = t.as_strided(t.shape, t.stride(), t.storage_offset())
        used.add(e["view"])
        table.append(t)
    return table  # type: ignore[return-value]


def _assign_model(model: torch.nn.Module, loaded: dict,
                  device: torch.device) -> Dict[int, torch.nn.Parameter]:
    """Replaces every parameter and persistent buffer by its loaded tensor (one new object per
    old one, so that what was shared stays shared) and moves non-persistent buffers to
    device; returns the new parameters by the id of the old."""
    params: Dict[int, torch.nn.Parameter] = {}
    buffers: Dict[int, torch.Tensor] = {}
    for prefix, mod in model.named_modules(remove_duplicate=False):
        pre = prefix + "." if prefix else ""
        for name, p in mod._parameters.items():
            if p is not None and id(p) not in params:
                params[id(p)] = torch.nn.Parameter(loaded[pre + name],
                                                   requires_grad=p.requires_grad)
        for name, b in mod._buffers.items():
            if b is not None and id(b) not in buffers:
                persistent = name not in mod._non_persistent_buffers_set
                buffers[id(b)] = loaded[pre + name] if persistent else b.to(device)
    for mod in model.modules():
        for name, p in mod._parameters.items():
            if p is not None:
                mod._parameters[name] = params[id(p)]
        for name, b in mod._buffers.items():
            if b is not None:
                mod._buffers[name] = buffers[id(b)]
    return params


def _cast(param: torch.Tensor, value: Any, key: Any = None) -> Any:
    """An optimizer state value as torch's Optimizer.load_state_dict casts it (floating
    tensors to the parameter's dtype and device, ``step`` as it is), without copying a
    tensor that already is."""
    if isinstance(value, torch.Tensor):
        if key == "step":
            return value
        if param.is_floating_point() and value.is_floating_point():
            value = value.to(param.dtype)
        return value.to(param.device)
    if isinstance(value, dict):
        return {k: _cast(param, v, k) for k, v in value.items()}
    return value


def _load_optimizer(optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """Loads the saved optimizer state: torch's own load_state_dict from torch 2.0 (which no
    longer deep-copies the tensors), else its steps without the deep copy torch 1.x makes."""
    if int(torch.__version__.split(".")[0]) >= 2:
        optimizer.load_state_dict(saved)
        return
    groups = optimizer.param_groups
    by_id = dict(zip(chain.from_iterable(g["params"] for g in saved["param_groups"]),
                     chain.from_iterable(g["params"] for g in groups)))
    state: Dict[Any, Any] = defaultdict(dict)
    for k, v in saved["state"].items():
        state[by_id[k]] = _cast(by_id[k], v)
    param_groups = [dict(s, params=g["params"]) for g, s in zip(groups, saved["param_groups"])]
    optimizer.__setstate__({"state": state, "param_groups": param_groups})


def allocate(model: torch.nn.Module, device: Device = None,
             optimizer: Optional[torch.optim.Optimizer] = None) -> torch.nn.Module:
    """Gives every parameter and buffer of ``model`` left on the meta device uninitialised
    memory on ``device`` (``torch.empty``: nothing initialised, nothing copied) and moves the
    others there, for a loader that fills allocated tensors (DeepSpeed's ``load_checkpoint``,
    DCP's ``dcp.load``). Unlike ``model.to_empty`` a parameter several modules share stays
    one parameter and real buffers keep their values; ``optimizer`` (made over the meta
    parameters) then points at the new ones. Raises ValueError, changing nothing, for a
    non-persistent buffer on the meta device (no checkpoint holds it). Returns the model."""
    _check_lost(model)
    target = _device(device)
    params: Dict[int, torch.nn.Parameter] = {}
    buffers: Dict[int, torch.Tensor] = {}
    for mod in model.modules():
        for p in mod._parameters.values():
            if p is not None and id(p) not in params:
                data = torch.empty_like(p, device=target) if p.is_meta else p.detach().to(target)
                params[id(p)] = torch.nn.Parameter(data, requires_grad=p.requires_grad)
        for b in mod._buffers.values():
            if b is not None and id(b) not in buffers:
                buffers[id(b)] = torch.empty_like(b, device=target) if b.is_meta else b.to(target)
    for mod in model.modules():
        for name, p in mod._parameters.items():
            if p is not None:
                mod._parameters[name] = params[id(p)]
        for name, b in mod._buffers.items():
            if b is not None:
                mod._buffers[name] = buffers[id(b)]
    if optimizer is not None:
        for g in optimizer.param_groups:
            g["params"] = [params.get(id(p), p) for p in g["params"]]
    return model


def _device(device: Device) -> torch.device:
    """The target device: as given, else the current CUDA device, else the CPU."""
    if device is not None:
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def materialize(model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer],
                path_dir: str, file: Optional[str] = None, *, device: Device = None,
                conn: Optional[Connection] = None, model_key: Optional[str] = "model",
                optimizer_key: str = "optimizer", strict: bool = True,
                weights_only: bool = True) -> Materialized:
    """Gives ``model`` (built on the meta device, see :func:`empty_weights`) and
    ``optimizer`` (made over its meta parameters, or None) the state saved as
    ``path_dir/<file>`` (default ``rank{rank}``) by :func:`dsckpt.torch.save`, allocated on
    ``device`` (default: the current CUDA device, else the CPU) and filled by the daemon when
    one answers (``conn``, else the process's shared connection), else from the file.

    ``model_key``: where the model's state dict is in the saved one (None: the saved state
    dict is the model's); ``optimizer_key``: the optimizer's. ``strict``: a tensor the
    checkpoint holds for the model but the model lacks fails too. Raises before touching
    the model or the optimizer (see the module's documentation); returns
    :class:`Materialized` ``(model, optimizer, how, state)``.
    """
    from .torch import _daemon, dist_rank_world
    if file is None:
        file = f"rank{dist_rank_world()[0]}"
    target = _device(device)
    path = os.path.join(path_dir, file + ".safetensors")
    info, views, entries = _saved(path_dir, file, weights_only)
    meta_state, view_of = _on_meta(info, views, entries)
    saved_model = _pick(meta_state, model_key, "model", path)
    saved_opt = _pick(meta_state, optimizer_key, "optimizer", path) if optimizer else None
    _check_model(model, saved_model, path, strict, model_key + "." if model_key else "")
    if optimizer is not None:
        _check_optimizer(optimizer, saved_opt, path)
    places = _places(saved_model, saved_opt, views, view_of, target)
    dests = _allocate(views, places)
    how = _fill.fill(path_dir, file, dests, _daemon(conn, path_dir), strict=True)
    state = _blob.skeleton(info, _tensors(views, dests, places, entries))
    params = _assign_model(model, state if model_key is None else state[model_key], target)
    if optimizer is not None:
        for g in optimizer.param_groups:
            g["params"] = [params.get(id(p), p) for p in g["params"]]
        _load_optimizer(optimizer, state[optimizer_key])
    return Materialized(model, optimizer, how, state)


__all__ = ["materialize", "empty_weights", "allocate", "Materialized"]
