"""python -m dsckpt — getting checkpoints out of dsckpt's format.

``export TAG_DIR OUT``: one tag as one file of full tensors, ``torch.save``'s format or, for
OUT ending in ``.safetensors``, safetensors (:mod:`dsckpt.export`).
``zero-to-fp32 CHECKPOINT_DIR [TAG] OUT``: DeepSpeed's ``zero_to_fp32.py`` for DeepSpeed
checkpoints saved through dsckpt (:mod:`dsckpt.deepspeed.zero_to_fp32`).

Prints one line saying what was written; errors are one line on stderr and exit status 1
(2 for a usage error).
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from .errors import DsckptError


def _parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(
        prog="python -m dsckpt",
        description="Get checkpoints out of dsckpt's format: export a tag as one torch.save "
                    "or safetensors file, or consolidate a DeepSpeed ZeRO checkpoint's fp32 "
                    "weights as DeepSpeed's zero_to_fp32.py does.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    e = sub.add_parser(
        "export", help="one tag as one file of full tensors",
        description="Writes the checkpoint tag TAG_DIR as one file: torch.save's format, or "
                    "safetensors when OUT ends in .safetensors (tensors only, named by key "
                    "path, with dsckpt checksums: dsckptctl verify OUT checks it). A DCP tag "
                    "gives every item at full size (the shards of all ranks put together, as "
                    "dcp_to_torch_save does; needs torch >= 2.4); a DeepSpeed tag gives the "
                    "fp32 weights consolidated from its ZeRO shards (as zero-to-fp32); a tag "
                    "of dsckpt.torch.save (Lightning's included) gives the state dict of its "
                    "one file. The tag must be committed.")
    e.add_argument("tag_dir", metavar="TAG_DIR", help="the checkpoint tag directory")
    e.add_argument("out", metavar="OUT", help="the file to write (replaced whole)")
    e.add_argument("--format", choices=("torch", "safetensors"),
                   help="the output format (default: by OUT's suffix)")
    e.add_argument("--file", help="which file of a dsckpt.torch tag saved by several ranks "
                                  "(rank0, ...)")
    e.add_argument("--key", help="export only this entry, a key path: state_dict (a "
                                 "Lightning checkpoint's weights), module, model.layers.0")
    e.add_argument("--no-weights-only", dest="weights_only", action="store_false",
                   help="unpickle what the checkpoint holds pickled: runs code its author "
                        "put there; only for checkpoints you trust")
    e.add_argument("--allow-uncommitted", action="store_true",
                   help="export a tag that is not committed (no MANIFEST.json) from the "
                        "files it holds")
    z = sub.add_parser(
        "zero-to-fp32", help="DeepSpeed's zero_to_fp32.py for dsckpt checkpoints",
        description="Consolidates the fp32 master weights of a DeepSpeed ZeRO 1, 2 or 3 "
                    "checkpoint saved through dsckpt.deepspeed from every rank's optimizer "
                    "shards, as DeepSpeed's zero_to_fp32.py does, into OUT: a .pt/.bin file "
                    "(torch.save), a .safetensors file, or a directory (pytorch_model.bin, "
                    "or model.safetensors with --safe_serialization, in it). TAG defaults to "
                    "the one CHECKPOINT_DIR/latest names; CHECKPOINT_DIR may be the tag "
                    "directory itself.")
    z.add_argument("checkpoint_dir", metavar="CHECKPOINT_DIR",
                   help="the directory holding the tags and latest (or one tag directory)")
    z.add_argument("rest", nargs="+", metavar="[TAG] OUT", help="the tag, then the output")
    z.add_argument("-t", "--tag", help="the tag (as DeepSpeed's script's option)")
    z.add_argument("--safe_serialization", action="store_true",
                   help="write safetensors (model.safetensors into a directory OUT)")
    z.add_argument("--exclude_frozen_parameters", action="store_true",
                   help="leave frozen parameters out")
    z.add_argument("--no-weights-only", dest="weights_only", action="store_false",
                   help="unpickle what the checkpoint holds pickled (only for checkpoints "
                        "you trust)")
    z.add_argument("--allow-uncommitted", action="store_true",
                   help="read a tag that is not committed (no MANIFEST.json)")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    """Runs the command; the exit status."""
    p = _parser()
    args = p.parse_args(argv)
    from .deepspeed.zero_to_fp32 import ZeroCheckpointError
    from .export import ExportError
    try:
        if args.command == "export":
            from .export import export
            s = export(args.tag_dir, args.out, fmt=args.format, file=args.file, key=args.key,
                       weights_only=args.weights_only,
                       allow_uncommitted=args.allow_uncommitted)
            left = f", {s['left_out']} non-tensor values left out" if s["left_out"] else ""
            print(f"{s['path']}: {s['format']}, {s['tensors']} tensors, {s['bytes']} bytes "
                  f"(from a {s['kind']} tag){left}")
            return 0
        if len(args.rest) > 2 or (len(args.rest) == 2 and args.tag):
            p.error("zero-to-fp32 takes CHECKPOINT_DIR [TAG] OUT")
        tag = args.tag if len(args.rest) == 1 else args.rest[0]
        from .deepspeed.zero_to_fp32 import convert_zero_checkpoint_to_fp32_state_dict
        out = convert_zero_checkpoint_to_fp32_state_dict(
            args.checkpoint_dir, args.rest[-1], tag=tag,
            exclude_frozen_parameters=args.exclude_frozen_parameters,
            safe_serialization=args.safe_serialization, weights_only=args.weights_only,
            allow_uncommitted=args.allow_uncommitted)
        print(f"{out}: fp32 weights of {args.checkpoint_dir}" + (f" tag {tag}" if tag else ""))
        return 0
    except (ExportError, ZeroCheckpointError, DsckptError, OSError) as e:
        print(f"python -m dsckpt {args.command}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
