"""dsckpt.deepspeed.resume — a DeepSpeed engine resumed from a checkpoint with a model built on
the meta device: no random initialisation, no copy of the model from the CPU.

DeepSpeed cannot take a model whose parameters are on the meta device: ``deepspeed.initialize``
moves the module to its device (``module.to(device)``: a meta tensor has no data to copy),
broadcasts every parameter from rank 0, and its ZeRO optimizers copy the parameters into their
flat fp32 partitions (stage 3 partitions each parameter's data at initialize). So the
parameters need memory before initialize, but not values: :func:`resume` gives each meta
parameter uninitialised memory on the engine's device (:func:`dsckpt.materialize.allocate`:
``torch.empty``, no init, no CPU copy; tied parameters stay tied, real buffers keep their
values), calls ``deepspeed.initialize``, then ``engine.load_checkpoint``, which overwrites every
parameter, the optimizer's state and its fp32 master weights from the checkpoint::

    import dsckpt.deepspeed.auto                       # saves and loads through dsckptd
    from dsckpt.deepspeed.resume import resume
    with dsckpt.materialize.empty_weights():           # or: with torch.device("meta")
        model = GPT(config)
    engine, optimizer, _, scheduler, tag_dir, client_state = resume(
        model, "/ckpt/run1", config=ds_config)         # ds_config: optimizer and scheduler

What remains (DeepSpeed's own design, not dsckpt's): initialize still builds its fp32 master
partitions from the uninitialised parameters (a copy on the device), and ``load_checkpoint``
asks the checkpoint engine for ZeRO's optimizer files with ``map_location="cpu"``: they come
to host memory (from the daemon's cache when it holds them) and DeepSpeed copies them into
its partitions on the device. The model states file keeps its saved device.

A resume that did not load (no ``latest``, a missing file) raises: the parameters hold
uninitialised memory, which must never be trained. The optimizer comes from the DeepSpeed
config or as a callable ``optimizer=lambda params: AdamW(params, ...)``; an optimizer object
made over the meta parameters is refused (it would update tensors that no longer exist).
``model_parameters`` (parameter groups, say) may be made from the meta model: each meta
parameter in it is replaced by its allocated one.
"""
from __future__ import annotations

import os
from typing import Any, Dict, NamedTuple, Optional

import torch

from ..materialize import allocate


class Resumed(NamedTuple):
    """What :func:`resume` returns: ``deepspeed.initialize``'s four values, then the tag
    directory loaded and the client state saved with it."""

    engine: Any
    optimizer: Any
    training_dataloader: Any
    lr_scheduler: Any
    load_path: str
    client_state: Any


def _engine_device() -> torch.device:
    """The device DeepSpeed's engine puts the model on: its accelerator's current device."""
    from deepspeed.accelerator import get_accelerator
    return torch.device(get_accelerator().current_device_name())


def _check_optimizer(optimizer: Any) -> None:
    """Raises ValueError for an optimizer object holding meta parameters."""
    if isinstance(optimizer, torch.optim.Optimizer) and any(
            p.is_meta for g in optimizer.param_groups for p in g["params"]):
        raise ValueError("dsckpt.deepspeed.resume: the optimizer was made over the model's "
                         "meta parameters; pass a callable (optimizer=lambda params: "
                         "AdamW(params, ...)) or define it in the DeepSpeed config")


def _remapped(params: Any, new: Dict[int, torch.nn.Parameter]) -> Any:
    """model_parameters with each of the model's old parameters replaced by its new one
    (tensors, or parameter groups: dicts with ``params``); None stays None."""
    if params is None:
        return None
    out = []
    for item in params:
        if isinstance(item, dict):
            out.append(dict(item, params=[new.get(id(p), p) for p in item["params"]]))
        else:
            out.append(new.get(id(item), item))
    return out


def resume(model: torch.nn.Module, load_dir: str, *, tag: Optional[str] = None,
           device: Any = None, **initialize_kwargs: Any) -> Resumed:
    """Allocates ``model``'s meta parameters on ``device`` (default: DeepSpeed's current
    device) without initialising them, runs ``deepspeed.initialize(model=model,
    **initialize_kwargs)`` and ``engine.load_checkpoint(load_dir, tag)`` (strict, optimizer
    and scheduler states included); raises FileNotFoundError when nothing was loaded.
    ``model_parameters`` may name the meta parameters (tensors or parameter groups): they
    are given to DeepSpeed as the allocated ones."""
    import deepspeed

    _check_optimizer(initialize_kwargs.get("optimizer"))
    old = list(model.parameters())
    allocate(model, device if device is not None else _engine_device())
    new = {id(p): q for p, q in zip(old, model.parameters())}
    initialize_kwargs["model_parameters"] = _remapped(initialize_kwargs.get("model_parameters"),
                                                      new)
    engine, optimizer, loader, scheduler = deepspeed.initialize(model=model, **initialize_kwargs)
    load_path, client_state = engine.load_checkpoint(load_dir, tag, load_module_strict=True,
                                                     load_optimizer_states=True,
                                                     load_lr_scheduler_states=True)
    if load_path is None:
        raise FileNotFoundError(f"dsckpt.deepspeed.resume: no checkpoint loaded from {load_dir}"
                                f" (tag {tag!r}; without one, {os.path.join(load_dir, 'latest')}"
                                " names it): the model's parameters are uninitialised memory")
    return Resumed(engine, optimizer, loader, scheduler, load_path, client_state)


__all__ = ["resume", "Resumed"]
