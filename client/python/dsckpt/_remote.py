"""_remote.py — checkpoints this node lacks, brought from the root's remote tier by the daemon
(DESIGN.md §9): the load paths (``dsckpt.torch.load`` / ``load_into``, the DCP Reader) read
headers and blobs here, so a tag only the remote tier holds is first pulled into the local
tier (PREFETCH with wait: the daemon checks every object against the manifest and writes the
files as the user's), then loaded as any local tag, from the daemon's cache. ``find_latest``
asks the daemon for the remote ``latest`` when a rank holds no complete tag here."""
from __future__ import annotations

import os
from typing import Optional

from .core import Connection
from .errors import DsckptError, Errno

MANIFEST = "MANIFEST.json"


def ensure_local(conn: Optional[Connection], path_dir: str, name: str) -> bool:
    """When ``path_dir/name`` is missing here and a daemon answers, has it pull the tag
    ``path_dir`` from the remote tier; True when it did. A tag the remote tier lacks leaves
    things as they are (the caller reports the missing file); any other failure (another
    user's tag, a corrupt object, the remote tier down) is raised."""
    if conn is None or os.path.exists(os.path.join(path_dir, name)):
        return False
    try:
        conn.prefetch(os.path.abspath(path_dir), wait=True)
    except DsckptError as e:
        if e.code == Errno.ENOENT:
            return False
        raise
    return os.path.exists(os.path.join(path_dir, name))


def remote_latest(conn: Optional[Connection], job_dir: str) -> Optional[str]:
    """The tag the daemon finds for ``job_dir``'s latest (here, else the remote tier's, whose
    pull it starts), or None when there is none or no daemon answers."""
    if conn is None:
        return None
    try:
        return conn.prefetch(os.path.abspath(job_dir))["tag"] or None
    except DsckptError as e:
        if e.code in (Errno.ENOENT, Errno.EINVAL, Errno.EACCES):
            return None
        raise
