"""dsckpt.deepspeed.recovery — the ``zero_to_fp32.py`` DeepSpeed leaves beside the tags.

At every ZeRO save DeepSpeed's engine copies its own ``zero_to_fp32.py`` into the save
directory (``DeepSpeedEngine._copy_recovery_script``, global rank 0), for users to run
there later; that copy ``torch.load``\\ s the files and fails on ours (``UnpicklingError:
invalid load key``). When the engine's checkpoint engine is dsckpt's, the copy is
:data:`SCRIPT_NAME` written by :func:`write_script` instead (beside the file, then renamed
over it, so it is whole at every moment): a short script with DeepSpeed's command line
(0.19.8's)::

    python zero_to_fp32.py CHECKPOINT_DIR OUTPUT_DIR [-t TAG] [--safe_serialization]
                           [--max_shard_size 5GB] [--exclude_frozen_parameters] [-d]

that runs :func:`main`: :mod:`dsckpt.deepspeed.zero_to_fp32`'s converter (the one of
``python -m dsckpt zero-to-fp32``), writing into OUTPUT_DIR what DeepSpeed's script writes
there: ``pytorch_model.bin`` (``model.safetensors`` with ``--safe_serialization``, its
metadata ``format: pt`` as transformers wants), or, above ``--max_shard_size``, shards
named and indexed as ``huggingface_hub.split_torch_state_dict_into_shards`` names them
(``pytorch_model-00001-of-00002.bin``, ``pytorch_model.bin.index.json``). The script
imports dsckpt (it also tries the directory dsckpt was imported from when it was written)
and re-exports DeepSpeed's two functions of the module for those who import it.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import stat
import sys
from typing import Any, Dict, List, Optional

import torch

log = logging.getLogger("dsckpt.deepspeed")

SCRIPT_NAME = "zero_to_fp32.py"
SIZE_UNITS = {"TB": 10**12, "GB": 10**9, "MB": 10**6, "KB": 10**3}  # huggingface_hub's

_SCRIPT = '''#!/usr/bin/env python3
"""zero_to_fp32.py, written by dsckpt in place of DeepSpeed's copy: the checkpoints here were
saved through dsckptd (safetensors files and .meta skeletons), which DeepSpeed's script
cannot read. The same command line as DeepSpeed's:

    python zero_to_fp32.py CHECKPOINT_DIR OUTPUT_DIR [-t TAG] [--safe_serialization]
                           [--max_shard_size 5GB] [--exclude_frozen_parameters] [-d]

It runs dsckpt.deepspeed.recovery.main (`python -m dsckpt zero-to-fp32` is the same
converter)."""
import sys

try:
    import dsckpt.deepspeed.recovery as _recovery
except ImportError:
    sys.path.insert(0, {path!r})  # where dsckpt was imported from when this was written
    try:
        import dsckpt.deepspeed.recovery as _recovery
    except ImportError as e:
        sys.exit(f"zero_to_fp32.py: these checkpoints were saved through dsckpt, which this "
                 f"Python cannot import ({{e}}): pip install dsckpt's client/python, or put "
                 f"it on PYTHONPATH")
from dsckpt.deepspeed.zero_to_fp32 import (convert_zero_checkpoint_to_fp32_state_dict,  # noqa
                                           get_fp32_state_dict_from_zero_checkpoint)

if __name__ == "__main__":
    sys.exit(_recovery.main())
'''


def script_text() -> str:
    """The script, naming the directory this dsckpt was imported from."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return _SCRIPT.format(path=here)


def write_script(save_dir: str) -> str:
    """Writes the script as save_dir/SCRIPT_NAME, executable as DeepSpeed makes its copy:
    into a file beside it, flushed, then renamed over it. Returns its path."""
    dst = os.path.join(save_dir, SCRIPT_NAME)
    tmp = os.path.join(save_dir, f".{SCRIPT_NAME}.{os.getpid()}.dsckpt-tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o666)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(script_text())
            f.flush()
            os.fchmod(f.fileno(), os.fstat(f.fileno()).st_mode | stat.S_IEXEC)
            os.fsync(f.fileno())
        os.replace(tmp, dst)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
    return dst


def use_our_script(cls: type) -> None:
    """Makes ``cls._copy_recovery_script`` (DeepSpeedEngine's) write our script when the
    engine's checkpoint engine is dsckpt's, and DeepSpeed's otherwise; once per class. A
    failure is logged: nothing of a save may stop training."""
    copy = getattr(cls, "_copy_recovery_script", None)
    if copy is None or getattr(copy, "_dsckpt", False):
        return

    def _copy_recovery_script(self, save_path):
        """DeepSpeed's copy of its script, or, for dsckpt's checkpoints, ours."""
        from . import DsckptCheckpointEngine
        if not isinstance(getattr(self, "checkpoint_engine", None), DsckptCheckpointEngine):
            return copy(self, save_path)
        try:
            write_script(save_path)
        except OSError as e:
            log.warning("dsckpt: cannot write %s into %s: %s (python -m dsckpt zero-to-fp32 "
                        "does the same)", SCRIPT_NAME, save_path, e)
        return None

    _copy_recovery_script._dsckpt = True  # type: ignore[attr-defined]
    cls._copy_recovery_script = _copy_recovery_script


def parse_size(text: str) -> int:
    """Bytes of a size such as "5GB" (huggingface_hub's parse_size_to_int: KB, MB, GB, TB
    are powers of ten)."""
    text = text.strip()
    unit = text[-2:].upper()
    if unit not in SIZE_UNITS:
        raise ValueError(f"unit {unit!r} not supported: TB, GB, MB, KB (got {text!r})")
    return int(float(text[:-2].strip()) * SIZE_UNITS[unit])


def shards(sd: Dict[str, torch.Tensor], max_bytes: int, shared: bool) -> List[List[str]]:
    """The names of sd by shard, as split_torch_state_dict_into_shards splits them: in
    order, a new shard when the next tensor would pass max_bytes, a tensor larger than
    that alone in a shard of its own; names of one tensor object (tied, when ``shared``)
    counted once and put in the first's shard, after its other names."""
    out: List[List[str]] = []
    current: List[str] = []
    size = 0
    first: Dict[int, str] = {}
    ties: Dict[str, List[str]] = {}
    for name, t in sd.items():
        if shared and id(t) in first:
            ties[first[id(t)]].append(name)
            continue
        first[id(t)] = name
        ties[name] = []
        n = t.numel() * t.element_size()
        if n > max_bytes:
            out.append([name])
            continue
        if current and size + n > max_bytes:
            out.append(current)
            current, size = [], 0
        current.append(name)
        size += n
    if current:
        out.append(current)
    return [shard + [tie for name in shard for tie in ties[name]] for shard in out]


def write_output(sd: Dict[str, torch.Tensor], output_dir: str, safe: bool,
                 max_bytes: int) -> List[str]:
    """Writes sd into output_dir as DeepSpeed's script does (see the module docstring);
    returns the files written."""
    from ..export import write, write_safetensors
    weights = "model.safetensors" if safe else "pytorch_model.bin"
    split = shards(sd, max_bytes, not safe)
    os.makedirs(output_dir, exist_ok=True)
    stem, ext = os.path.splitext(weights)
    files, where = [], {}
    for i, names in enumerate(split):
        name = weights if len(split) == 1 else f"{stem}-{i + 1:05d}-of-{len(split):05d}{ext}"
        part = {k: sd[k] for k in names}
        path = os.path.join(output_dir, name)
        if safe:  # tied tensors are written once per name, as DeepSpeed's clones
            write_safetensors({k: t.contiguous() for k, t in part.items()}, path,
                              {"format": "pt"})
        else:
            write(part, path, "torch")
        files.append(path)
        where.update((k, name) for k in names)
    if len(split) > 1:
        counted = list(sd.values()) if safe else list({id(t): t for t in sd.values()}.values())
        total = sum(t.numel() * t.element_size() for t in counted)
        index = {"metadata": {"total_size": total}, "weight_map": where}
        path = os.path.join(output_dir, weights + ".index.json")
        with open(path + ".partial", "w", encoding="utf-8") as f:
            f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
        os.replace(path + ".partial", path)
        files.append(path)
    return files


def _parser() -> argparse.ArgumentParser:
    """DeepSpeed 0.19.8's zero_to_fp32.py command line."""
    p = argparse.ArgumentParser(
        prog=SCRIPT_NAME,
        description="Consolidates the fp32 weights of a DeepSpeed ZeRO checkpoint saved "
                    "through dsckpt (DeepSpeed's zero_to_fp32.py, for dsckpt's files).")
    p.add_argument("checkpoint_dir", help="the folder holding the tag folders and latest "
                                          "(or one tag folder), e.g. path/checkpoint-12")
    p.add_argument("output_dir", help="directory for the fp32 state_dict's files, e.g. "
                                      "path/checkpoint-12-output/")
    p.add_argument("--max_shard_size", default="5GB",
                   help="largest shard before the output is split (digits and a unit: "
                        "5GB, 500MB)")
    p.add_argument("--safe_serialization", action="store_true",
                   help="write safetensors instead of torch.save's pickle")
    p.add_argument("-t", "--tag", default=None,
                   help="the checkpoint tag, e.g. global_step1 (default: what latest names)")
    p.add_argument("--exclude_frozen_parameters", action="store_true",
                   help="exclude frozen parameters")
    p.add_argument("-d", "--debug", action="store_true", help="enable debug")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    """The script: converts as DeepSpeed's does; prints the files written; errors are one
    line on stderr and exit status 1 (argparse's 2 for a usage error)."""
    from ..errors import DsckptError
    from ..export import ExportError
    from .zero_to_fp32 import ZeroCheckpointError, get_fp32_state_dict_from_zero_checkpoint
    args = _parser().parse_args(argv)
    if args.debug:
        logging.basicConfig(level=logging.DEBUG)
    try:
        max_bytes = parse_size(args.max_shard_size)
        sd: Any = get_fp32_state_dict_from_zero_checkpoint(args.checkpoint_dir, args.tag,
                                                           args.exclude_frozen_parameters)
        for path in write_output(sd, args.output_dir, args.safe_serialization, max_bytes):
            print(path)
        return 0
    except (ValueError, ExportError, ZeroCheckpointError, DsckptError, OSError) as e:
        print(f"{SCRIPT_NAME}: {e}", file=sys.stderr)
        return 1


__all__ = ["SCRIPT_NAME", "write_script", "script_text", "use_our_script", "main",
           "shards", "parse_size", "write_output"]
