"""dsckpt._torchext — the C++ proof of a warm save's tensors (``_tproof.cpp``), built against
the installed torch at run time, when ``DSCKPT_TORCH_EXT=1``.

A warm ``dsckpt.torch.save`` proves that the state dict's tensors are the recorded ones. In
Python that takes a C pointer check and torch's TensorGuards, which read each tensor and
records of their own kept apart (0.20-0.25 ms for 1,556 tensors on the H200's host); one
C++ pass over the TensorImpls takes 0.02-0.04 ms. It must be compiled against the torch in
use (its C++ ABI is torch's), so it is opt-in: with ``DSCKPT_TORCH_EXT=1`` importing
``dsckpt.torch`` starts ``torch.utils.cpp_extension.load`` (a C++ compiler and ninja; about
20 s, once per torch version: torch keeps the build in its extensions directory,
``TORCH_EXTENSIONS_DIR``) on a thread, and saves use the module once it is built and has
proven itself on a few tensors; until then, or when it cannot be built (logged at debug
level), they prove in Python as without it.
"""
from __future__ import annotations

import logging
import os
import threading
from types import ModuleType
from typing import Optional

import torch

log = logging.getLogger("dsckpt.torch")

NAME = "dsckpt_tproof_1"  # _tproof.cpp's PyInit_ name: bump with the record's layout
_HERE = os.path.dirname(os.path.abspath(__file__))
_lock = threading.Lock()
_built = threading.Event()
_state: dict = {"started": False, "module": None}


class _Sub(torch.Tensor):
    """A tensor subclass, for the probe."""


def _probe(mod: ModuleType) -> bool:
    """Whether mod tells recorded tensors from every kind of other one, as the proof must."""
    base = torch.arange(24.0).reshape(4, 6)
    ts = [base, base[1:], base.t(), torch.nn.Parameter(torch.zeros(3)), torch.empty(0)]
    shared = [True, True, True, False, False]
    r = mod.record(ts, shared)
    others = [base.clone(), base[2:], base, torch.nn.Parameter(torch.zeros(3, 1)),
              torch.empty(0, dtype=torch.int32)]
    fresh = [t.detach() for t in ts[:3]] + [ts[3], ts[4].detach()]  # new objects, same tensors
    strangers = [None, torch.zeros(4, 6).to_sparse(), torch.zeros(4, 6, device="meta"),
                 torch.zeros(4, 6).as_subclass(_Sub), torch.zeros(4, 6, requires_grad=True)]
    return r is not None and mod.check(r, ts) and mod.check(r, fresh) and \
        not any(mod.check(r, ts[:i] + [o] + ts[i + 1:]) for i, o in enumerate(others)) and \
        not any(mod.check(r, [s] + ts[1:]) for s in strangers) and \
        not mod.check(r, ts[:-1]) and mod.record([None], [False]) is None


def _build() -> None:
    """Builds and loads the module, keeps it if its probe passes; logs why not otherwise."""
    try:
        from torch.utils import cpp_extension
        mod = cpp_extension.load(name=NAME, sources=[os.path.join(_HERE, "_tproof.cpp")],
                                 extra_cflags=["-O2"], verbose=False)
        if _probe(mod):
            _state["module"] = mod
        else:
            log.debug("dsckpt: %s answers differently from torch; the proof stays in Python",
                      NAME)
    except Exception as e:  # noqa: BLE001 - no compiler, no ninja, no headers: Python it is
        log.debug("dsckpt: %s not built, the proof stays in Python: %r", NAME, e)
    finally:
        _built.set()


def module() -> Optional[ModuleType]:
    """The built module when ``DSCKPT_TORCH_EXT=1`` and it is ready, else None; the first call
    with it set starts the build."""
    if os.environ.get("DSCKPT_TORCH_EXT") != "1":
        return None
    with _lock:
        if not _state["started"]:
            _state["started"] = True
            threading.Thread(target=_build, name="dsckpt-torch-ext", daemon=True).start()
    return _state["module"]


def wait(timeout: Optional[float] = None) -> Optional[ModuleType]:
    """Starts the build if needed (``DSCKPT_TORCH_EXT=1``), waits up to timeout seconds for
    it, and returns the module or None (for tests and benchmarks)."""
    if module() is None and _state["started"]:
        _built.wait(timeout)
    return _state["module"]
