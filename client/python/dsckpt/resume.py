"""resume.py — which checkpoint a restarted job loads (``find_latest``), and where its nodes
are (``tell_nodes``).

On a root every node shares, the daemons commit a tag once every rank has sealed it, and
``<job>/latest`` names the newest committed tag. On node-local roots no single directory
holds every rank's files, so no manifest is ever written there: each node holds its own
ranks' files and its daemon's seal record (``SEAL+...+<host>.json``, written once the sealed
files were durable). A restarted job then agrees over its process group on the newest tag
that every rank holds complete, and loads that.

A rank that holds no complete tag here (a replacement node with an empty disk) asks its
daemon for the job's latest: on a root with a remote tier that is the tag the remote
``latest`` names, whose remote manifest is there (the daemon starts pulling it at once; the
load that follows waits for it). With peer copies on, the peers that hold its ranks' copies
serve them first; a replacement of a new name at a new address is known to them only once
the job's trainers told their daemons the job's nodes: ``tell_nodes``, before any load.
"""
from __future__ import annotations

import json
import os
import socket
from typing import Dict, List, Optional

import torch

from .errors import DsckptError

MANIFEST = "MANIFEST.json"
SEAL_PREFIXES, SEAL_SUFFIX = ("SEAL+", "SEAL."), ".json"


def _sealed_ranks(tag_dir: str) -> Dict[int, float]:
    """Ranks the seal records of tag_dir name, each with the time its record was written."""
    ranks: Dict[int, float] = {}
    try:
        names = os.listdir(tag_dir)
    except OSError:
        return ranks
    for name in names:
        if not (name.startswith(SEAL_PREFIXES) and name.endswith(SEAL_SUFFIX)):
            continue
        path = os.path.join(tag_dir, name)
        try:
            with open(path) as f:
                record = json.load(f)
            when = os.stat(path).st_mtime
        except (OSError, ValueError):
            continue
        if record.get("format") != "dsckpt-seal":
            continue
        for r in record.get("ranks", []):
            if isinstance(r, int):
                ranks[r] = max(ranks.get(r, 0.0), when)
    return ranks


def local_complete(job_dir: str, rank: int) -> Dict[str, float]:
    """The tags of job_dir this rank holds complete, each with when it became so: committed
    ones (their manifest's time), and ones whose seal records name this rank (its files were
    durable when the record was written)."""
    tags: Dict[str, float] = {}
    try:
        names = os.listdir(job_dir)
    except OSError:
        return tags
    for name in names:
        tag_dir = os.path.join(job_dir, name)
        if not os.path.isdir(tag_dir):
            continue
        manifest = os.path.join(tag_dir, MANIFEST)
        if os.path.isfile(manifest):
            tags[name] = os.stat(manifest).st_mtime
            continue
        sealed = _sealed_ranks(tag_dir)
        if rank in sealed:
            tags[name] = sealed[rank]
    return tags


def _from_daemon(job_dir: str) -> Dict[str, float]:
    """The job's latest as the daemon finds it (here, else in the remote tier), as a tag
    complete at no particular time; empty when none is or no daemon answers."""
    from . import _remote
    from .torch import default_connection
    try:
        conn = default_connection(os.path.join(job_dir, "latest"))
    except DsckptError:
        return {}
    tag = _remote.remote_latest(conn, job_dir)
    return {tag: 0.0} if tag else {}


def find_latest(job_dir: str, group=None) -> Optional[str]:
    """The newest tag of ``job_dir`` that every rank of ``group`` holds complete (committed,
    or sealed by that rank with its files durable), or None. Call it on every rank after a
    restart: the ranks agree (an all-gather over torch.distributed, when initialized) and
    all return the same tag, the one that became complete last on the slowest rank. A rank
    holding none here counts the job's latest in the root's remote tier (see above)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        rank = dist.get_rank(group)
        mine = local_complete(job_dir, rank) or _from_daemon(job_dir)
        everyone = [None] * dist.get_world_size(group)
        dist.all_gather_object(everyone, mine, group=group)
    else:
        everyone = [local_complete(job_dir, int(os.environ.get("RANK", 0)))
                    or _from_daemon(job_dir)]
    common = set(everyone[0])
    for tags in everyone[1:]:
        common &= set(tags)
    if not common:
        return None
    return max(common, key=lambda t: (max(tags[t] for tags in everyone), t))


def tell_nodes(job_dir: str, group=None, host: Optional[str] = None, conn=None) -> List[str]:
    """Tells every node's daemon the job's nodes (peer copies, issue 35): each rank's node
    name (``host``: its daemon's ``host``, by default this machine's hostname, as the
    daemon's own default) is gathered over ``group`` (torch.distributed, when initialized),
    and each rank tells its daemon the sorted names and the ranks of its node, then all wait
    for each other (a barrier), so that no rank loads before every daemon was told. Call it on
    every rank after a restart, before ``find_latest`` and the loads: a replacement node with
    an empty disk, a new name and a new address then restores its ranks' files from the
    peers' copies (its daemon asks the nodes told; theirs serve it as a node of the job, the
    ranks it names, of this user's files only). Returns the nodes told. Raises NotSupported
    when peer copies are off on this node, and what ``Connection.job_nodes`` raises
    (PermissionDenied for another user's job directory, LimitReached past the user's
    bound)."""
    from .torch import default_connection
    dist = torch.distributed
    me = host or socket.gethostname()
    on = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if on else int(os.environ.get("RANK", 0))
    everyone = [(me, rank)]
    if on:
        everyone = [None] * dist.get_world_size(group)
        dist.all_gather_object(everyone, (me, rank), group=group)
    nodes = sorted({h for h, _ in everyone})
    (conn or default_connection(job_dir)).job_nodes(
        job_dir, nodes, sorted(r for h, r in everyone if h == me))
    if on:
        dist.barrier(group)
    return nodes
