"""dsckpt.deepspeed.zero_to_fp32 — DeepSpeed's ``zero_to_fp32.py`` for checkpoints saved
through :mod:`dsckpt.deepspeed`: the fp32 master weights, consolidated from the ZeRO stage 1,
2 or 3 optimizer shards of every data-parallel rank, as one state dict of full tensors.

DeepSpeed copies its script beside the tags, but it ``torch.load``\\ s the files, and ours are
safetensors files with a ``.meta`` skeleton (its error: ``UnpicklingError: invalid load
key``); with :mod:`dsckpt.deepspeed` that copy is ours, running this module with DeepSpeed's
command line (:mod:`dsckpt.deepspeed.recovery`). This module does what the script does,
with the same names and meaning (:func:`get_fp32_state_dict_from_zero_checkpoint`,
:func:`convert_zero_checkpoint_to_fp32_state_dict`), reading the files with
:func:`dsckpt.torch.load` (every tensor checked against its checksum, nothing unpickled unless
``weights_only=False``). From the shell::

    python -m dsckpt zero-to-fp32 CHECKPOINT_DIR [TAG] OUT   # OUT: file.pt, file.safetensors
                                                              # or a directory

Like DeepSpeed's script: ``TAG`` defaults to the one ``CHECKPOINT_DIR/latest`` names (a tag
directory itself is taken as it is); buffers come from the model states file of rank 0, as
fp32 (``.float()``); frozen parameters from ``frozen_param_fragments`` unless excluded;
trainable ones from ``single_partition_of_fp32_groups`` (ZeRO 1 and 2, bf16 included:
partitions of each group concatenated in rank order, parameters laid out in
``param_shapes``' order, the group's tail padding to 2 x world size checked) or
``fp32_flat_groups`` (ZeRO 3: each parameter split ``ceil(numel / world)`` per rank); tied
parameters (``shared_params``) are the same tensor. Unlike DeepSpeed's script, the tag must
be committed (``allow_uncommitted``: the files of one that is not). A tag DeepSpeed saved
without ZeRO (no ZeRO optimizer files) has no fp32 partitions: its ``module`` weights are
returned as saved.

DeepSpeed itself is not needed: where it is not installed, stand-ins named as its classes
(the ZeRO stage enum, the loss scalers, ``fragment_address``) let the files' skeletons load
without unpickling (they are plain records; nothing of them runs).
"""
from __future__ import annotations

import collections
import dataclasses
import enum
import glob
import math
import os
import re
from typing import Any, Dict, List, Optional, Tuple

import torch

from .. import _tree
from .. import torch as dtorch

SUFFIX = ".safetensors"
OPTIM_GLOB = "*_optim_states.pt"
MODEL_GLOB = "*_model_states.pt"


class ZeroCheckpointError(ValueError):
    """A tag that is not a DeepSpeed ZeRO checkpoint dsckpt saved, or is not whole."""


def _stand_ins() -> List[type]:
    """Classes named as DeepSpeed's that its checkpoints hold (dsckpt.deepspeed.SAFE_TYPES),
    for loading them where DeepSpeed is not installed: records, with no behaviour."""

    class ZeroStageEnum(int, enum.Enum):
        """DeepSpeed's ZeRO stages."""

        disabled = 0
        optimizer_states = 1
        gradients = 2
        weights = 3
        max_stage = 3

    class LossScaler:
        """DeepSpeed's static loss scaler: its attributes only."""

    class DynamicLossScaler(LossScaler):
        """DeepSpeed's dynamic loss scaler: its attributes only."""

    @dataclasses.dataclass
    class fragment_address:  # noqa: N801 (DeepSpeed's name)
        """Where a parameter's fragment lies in a flat partition."""

        numel: int
        start: int

    made = []
    for cls, module in ((ZeroStageEnum, "deepspeed.runtime.zero.config"),
                        (LossScaler, "deepspeed.runtime.fp16.loss_scaler"),
                        (DynamicLossScaler, "deepspeed.runtime.fp16.loss_scaler"),
                        (fragment_address, "deepspeed.utils.tensor_fragment")):
        cls.__module__ = module
        cls.__qualname__ = cls.__name__
        made.append(cls)
    return made


def allow_deepspeed_types() -> None:
    """Allows DeepSpeed's classes of its checkpoints: DeepSpeed's own when installed, else
    the stand-ins (once)."""
    from . import SAFE_TYPES, allow_types
    allow_types()
    names = {f"{m}.{c}" for m, cs in SAFE_TYPES.items() for c in cs}
    missing = [cls for cls in _stand_ins() if _tree.type_name(cls) in names
               and not _tree.is_safe(_tree.type_name(cls))]
    if missing:
        _tree.add_safe_types(missing)


def _natural(text: str) -> list:
    """A key that sorts rank 2 before rank 10."""
    return [int(c) if c.isdigit() else c for c in re.split(r"(\d+)", text)]


def _files(tag_dir: str, pattern: str) -> List[str]:
    """DeepSpeed's names (without our suffix) of the files of tag_dir matching pattern, in
    rank order."""
    found = glob.glob(os.path.join(glob.escape(tag_dir), pattern + SUFFIX))
    return sorted((os.path.basename(p)[:-len(SUFFIX)] for p in found), key=_natural)


def is_deepspeed_tag(tag_dir: str) -> bool:
    """Whether tag_dir holds DeepSpeed files saved through dsckpt."""
    return bool(_files(tag_dir, MODEL_GLOB) or _files(tag_dir, OPTIM_GLOB))


def _load(tag_dir: str, name: str, weights_only: bool) -> Dict[str, Any]:
    """One DeepSpeed file of tag_dir, as DeepSpeed saved it, on the CPU."""
    return dtorch.load(tag_dir, name, map_location="cpu", weights_only=weights_only)


def resolve_tag(checkpoint_dir: str, tag: Optional[str] = None) -> str:
    """The tag directory: checkpoint_dir/tag, else the one checkpoint_dir/latest names, else
    checkpoint_dir itself when it is a tag (as DeepSpeed's script, which wants `latest`)."""
    if tag is None and is_deepspeed_tag(checkpoint_dir):
        return checkpoint_dir
    if tag is None:
        latest = os.path.join(checkpoint_dir, "latest")
        if not os.path.isfile(latest):
            raise ZeroCheckpointError(f"{checkpoint_dir}: no DeepSpeed files there and no "
                                      f"'latest' file naming a tag: give the tag")
        with open(latest) as f:
            tag = f.read().strip()
    tag_dir = os.path.join(checkpoint_dir, tag)
    if not os.path.isdir(tag_dir):
        raise ZeroCheckpointError(f"directory '{tag_dir}' doesn't exist")
    if not is_deepspeed_tag(tag_dir):
        raise ZeroCheckpointError(f"{tag_dir} holds no DeepSpeed file saved through dsckpt "
                                  f"({MODEL_GLOB}{SUFFIX}, {OPTIM_GLOB}{SUFFIX})")
    return tag_dir


@dataclasses.dataclass
class _ModelState:
    """What zero_to_fp32 takes of one model states file."""

    buffers: Dict[str, torch.Tensor]
    param_shapes: List[Dict[str, torch.Size]]
    shared_params: List[Tuple[str, str]]
    frozen_param_shapes: Optional[Dict[str, torch.Size]]
    frozen_param_fragments: Optional[Dict[str, torch.Tensor]]
    module: Dict[str, torch.Tensor]


def _model_state(tag_dir: str, name: str, weights_only: bool) -> _ModelState:
    """The parts of a model states file zero_to_fp32 uses."""
    sd = _load(tag_dir, name, weights_only)
    if not isinstance(sd, dict) or "buffer_names" not in sd or "module" not in sd:
        raise ZeroCheckpointError(f"{tag_dir}/{name} is not a DeepSpeed model states file")
    module = sd["module"] or {}
    buffers = {k: v.float() for k, v in module.items() if k in sd["buffer_names"]}
    shapes = sd.get("param_shapes") or []
    if isinstance(shapes, dict):
        shapes = [shapes]
    return _ModelState(buffers, list(shapes),
                       [(k, v) for k, v in (sd.get("shared_params") or {}).items()],
                       sd.get("frozen_param_shapes"), sd.get("frozen_param_fragments"), module)


def _numel(shape) -> int:
    """Elements of a shape (a torch.Size or a list)."""
    return shape.numel() if hasattr(shape, "numel") else math.prod(shape)


def _optim_states(tag_dir: str, names: List[str], weights_only: bool
                  ) -> Tuple[int, int, List[List[torch.Tensor]]]:
    """ZeRO stage, data-parallel world size and each rank's fp32 partitions (one per param
    group) of the optimizer files names (in rank order)."""
    groups, stage, world = [], None, None
    for name in names:
        osd = _load(tag_dir, name, weights_only).get("optimizer_state_dict")
        if not isinstance(osd, dict) or "zero_stage" not in osd:
            raise ZeroCheckpointError(f"{tag_dir}/{name} is not a ZeRO checkpoint (no "
                                      "optimizer_state_dict.zero_stage)")
        if stage is None:
            stage = int(osd["zero_stage"])
            count = osd["partition_count"]
            world = max(count) if isinstance(count, (list, tuple)) else int(count)
        key = "fp32_flat_groups" if stage == 3 else "single_partition_of_fp32_groups"
        if stage not in (1, 2, 3) or key not in osd:
            raise ZeroCheckpointError(f"{tag_dir}/{name}: unknown zero stage {stage}")
        groups.append(list(osd[key]))
    if world != len(names):
        raise ZeroCheckpointError(
            f"expected {world} of '{OPTIM_GLOB}' under '{tag_dir}' but found {len(names)} "
            "files: a rank's file is missing (see dsckptctl verify)")
    return stage, world, groups


def _zero2_trainable(out: Dict[str, Any], world: int, groups: List[List[torch.Tensor]],
                     shapes: List[Dict[str, Any]]) -> None:
    """ZeRO 1/2: each param group's partitions concatenated, cut by param_shapes."""
    align = 2 * world
    for i, group_shapes in enumerate(shapes):
        full = torch.cat([g[i] for g in groups], 0)
        offset = 0
        for name, shape in group_shapes.items():
            n = _numel(shape)
            out[name] = full.narrow(0, offset, n).view(shape)
            offset += n
        if align * math.ceil(offset / align) != align * math.ceil(full.numel() / align):
            raise ZeroCheckpointError(f"param group {i}: consumed {offset} numels out of "
                                      f"{full.numel()}: param_shapes and partitions disagree")


def _zero3_trainable(out: Dict[str, Any], world: int, groups: List[List[torch.Tensor]],
                     shapes: List[Dict[str, Any]]) -> None:
    """ZeRO 3: each parameter is ceil(numel / world) elements of every rank's flat groups."""
    flat = [torch.cat(g, 0) if len(g) > 1 else g[0] for g in groups]
    offset = 0
    for group_shapes in shapes:
        for name, shape in group_shapes.items():
            n = _numel(shape)
            part = math.ceil(n / world)
            pieces = [f.narrow(0, offset, part) for f in flat]
            out[name] = torch.cat(pieces, 0).narrow(0, 0, n).view(shape).clone()
            offset += part
    if offset != flat[0].numel():
        raise ZeroCheckpointError(f"consumed {offset * world} numels out of "
                                  f"{flat[0].numel() * world}: param_shapes and partitions "
                                  "disagree")


def _frozen(out: Dict[str, Any], stage: int, world: int, states: List[_ModelState]) -> None:
    """Frozen parameters: rank 0's whole (ZeRO 1/2), or every rank's fragment (ZeRO 3)."""
    shapes = states[0].frozen_param_shapes
    for name, shape in (shapes or {}).items():
        if stage < 3:
            out[name] = states[0].frozen_param_fragments[name]
        else:
            frags = [s.frozen_param_fragments[name] for s in states]
            out[name] = torch.cat(frags, 0).narrow(0, 0, _numel(shape)).view(shape)


def state_dict_of_tag(tag_dir: str, exclude_frozen_parameters: bool = False,
                      weights_only: bool = True) -> "collections.OrderedDict[str, torch.Tensor]":
    """The fp32 consolidated state dict of one DeepSpeed tag directory (see the module
    docstring); raises ZeroCheckpointError when it is not whole."""
    allow_deepspeed_types()
    model_files = _files(tag_dir, MODEL_GLOB)
    if not model_files:
        raise ZeroCheckpointError(f"can't find {MODEL_GLOB}{SUFFIX} files in '{tag_dir}'")
    optim_files = _files(tag_dir, OPTIM_GLOB)
    states = [_model_state(tag_dir, model_files[0], weights_only)]
    out: "collections.OrderedDict[str, Any]" = collections.OrderedDict(states[0].buffers)
    if not optim_files:  # DeepSpeed without ZeRO: the module as saved
        out.update(states[0].module)
        return out
    stage, world, groups = _optim_states(tag_dir, optim_files, weights_only)
    if stage == 3:
        states += [_model_state(tag_dir, f, weights_only) for f in model_files[1:]]
        if len(states) != world:
            raise ZeroCheckpointError(f"expected {world} of '{MODEL_GLOB}' under '{tag_dir}' "
                                      f"but found {len(states)} files")
    if not exclude_frozen_parameters:
        _frozen(out, stage, world, states)
    (_zero3_trainable if stage == 3 else _zero2_trainable)(out, world, groups,
                                                            states[0].param_shapes)
    for name, source in states[0].shared_params:
        if source in out:
            out[name] = out[source]
    return out


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir: str, tag: Optional[str] = None,
                                             exclude_frozen_parameters: bool = False,
                                             weights_only: bool = True,
                                             allow_uncommitted: bool = False
                                             ) -> "collections.OrderedDict[str, torch.Tensor]":
    """DeepSpeed's function of this name for a dsckpt checkpoint: the fp32 state dict of
    checkpoint_dir/tag (tag: what checkpoint_dir/latest names; checkpoint_dir may be the
    tag directory itself), on the CPU, for ``model.load_state_dict``. The tag must be
    committed unless allow_uncommitted."""
    from ..export import require_committed
    tag_dir = resolve_tag(checkpoint_dir, tag)
    if not allow_uncommitted:
        require_committed(tag_dir)
    return state_dict_of_tag(tag_dir, exclude_frozen_parameters, weights_only)


def convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir: str, output_file: str,
                                               tag: Optional[str] = None,
                                               exclude_frozen_parameters: bool = False,
                                               safe_serialization: Optional[bool] = None,
                                               weights_only: bool = True,
                                               allow_uncommitted: bool = False) -> str:
    """Writes the fp32 state dict to output_file (a directory: ``pytorch_model.bin``, or
    ``model.safetensors`` with safe_serialization, inside it as DeepSpeed's script names
    them; a path ending in .safetensors: safetensors); returns the file written."""
    from ..export import write
    sd = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag,
                                                  exclude_frozen_parameters, weights_only,
                                                  allow_uncommitted)
    if os.path.isdir(output_file) or output_file.endswith(os.sep):
        os.makedirs(output_file, exist_ok=True)
        output_file = os.path.join(output_file, "model.safetensors" if safe_serialization
                                   else "pytorch_model.bin")
    fmt = "safetensors" if safe_serialization or output_file.endswith(".safetensors") \
        else "torch"
    write(sd, output_file, fmt)
    return output_file


__all__ = ["get_fp32_state_dict_from_zero_checkpoint",
           "convert_zero_checkpoint_to_fp32_state_dict", "state_dict_of_tag", "resolve_tag",
           "is_deepspeed_tag", "allow_deepspeed_types", "ZeroCheckpointError"]
