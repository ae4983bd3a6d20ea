"""manifest.py — a committed tag's MANIFEST.json as a list of every file of the tag, the one
place the Python side reads it (C's is format/manifest.c's ``manifest_load``).

A commit of one node writes version 1: ``files`` lists every file. A commit of several nodes
on a shared root writes version 2: ``files`` lists the collecting node's files only, and
``records`` names the other nodes' seal records in the tag (``name``, ``host``, ``ranks``),
whose ``files`` hold theirs. :func:`load` reads those records (only the ones naming a rank
asked for, when ``ranks`` is given: a rank's load opens its own record, not every node's) and
returns the manifest as version 1 has it. A named record that is missing, unreadable, or of
another run, world size, host or rank set than the manifest says raises, never a partial
list.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterable, Optional

from .errors import CheckpointIncomplete, DsckptError, Errno

MANIFEST = "MANIFEST.json"
FORMAT = "dsckpt-manifest"
VERSIONS = (1, 2)
SEAL_FORMAT = "dsckpt-seal"


def _bad(tag_dir: str, what: str) -> DsckptError:
    """The error of a manifest or record that does not say what it must."""
    return DsckptError(int(Errno.EPROTO), "EPROTO", f"{tag_dir}: {what}")


def _record(tag_dir: str, manifest: Dict[str, Any], entry: Any) -> list:
    """The files of the seal record a version-2 manifest names in entry, checked against it."""
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or \
            "/" in entry["name"] or not isinstance(entry.get("ranks"), list):
        raise _bad(tag_dir, f"a record of {MANIFEST} is not a name, host and ranks")
    name = entry["name"]
    try:
        with open(os.path.join(tag_dir, name), "rb") as f:
            record = json.load(f)
    except FileNotFoundError:
        raise CheckpointIncomplete(int(Errno.EINCOMPLETE), "EINCOMPLETE",
                                   f"{tag_dir}: seal record {name}, which {MANIFEST} names, "
                                   "is missing") from None
    except (OSError, ValueError) as e:
        raise _bad(tag_dir, f"seal record {name}, which {MANIFEST} names, is unreadable: "
                            f"{e}") from None
    if not isinstance(record, dict) or record.get("format") != SEAL_FORMAT:
        raise _bad(tag_dir, f"seal record {name} is not a {SEAL_FORMAT} record")
    if record.get("run", "") != manifest.get("run", "") or \
            record.get("world") != manifest.get("world_size"):
        raise _bad(tag_dir, f"seal record {name} is of another run or world size than the "
                            "manifest")
    if record.get("host") != entry.get("host") or \
            sorted(record.get("ranks") or []) != sorted(entry["ranks"]):
        raise _bad(tag_dir, f"seal record {name} names another host or other ranks than the "
                            "manifest")
    files = record.get("files")
    if not isinstance(files, list):
        raise _bad(tag_dir, f"seal record {name} does not describe its files")
    ranks = set(entry["ranks"])
    if any(not isinstance(f, dict) or f.get("rank") not in ranks for f in files):
        raise _bad(tag_dir, f"seal record {name} describes a file of another rank")
    return files


def load(tag_dir: str, ranks: Optional[Iterable[int]] = None) -> Dict[str, Any]:
    """The manifest of the committed tag ``tag_dir`` with every file of the tag in ``files``
    (version 1's layout, ``records`` gone, ``total_bytes`` theirs); with ``ranks``, the files
    of those ranks only are sure to be there (the other nodes' records are not read). Raises
    FileNotFoundError when the tag is not committed, :class:`CheckpointIncomplete` when a
    record it names is missing and :class:`DsckptError` (EPROTO) when the manifest or a
    record is not what it must be."""
    path = os.path.join(tag_dir, MANIFEST)
    with open(path, "rb") as f:
        try:
            manifest = json.load(f)
        except ValueError as e:
            raise _bad(tag_dir, f"{MANIFEST} is not JSON: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or \
            manifest.get("version") not in VERSIONS or \
            not isinstance(manifest.get("files"), list):
        raise _bad(tag_dir, f"{MANIFEST} is not a {FORMAT} of version 1 or 2")
    if manifest["version"] == 1:
        return manifest
    records = manifest.pop("records", None)
    if not isinstance(records, list) or not records:
        raise _bad(tag_dir, f"{MANIFEST} of version 2 names no records")
    wanted = None if ranks is None else set(ranks)
    for entry in records:
        if wanted is not None and isinstance(entry, dict) and \
                not wanted.intersection(entry.get("ranks") or []):
            continue
        manifest["files"].extend(_record(tag_dir, manifest, entry))
    manifest["version"] = 1
    manifest["total_bytes"] = sum(f.get("size", 0) for f in manifest["files"])
    return manifest
