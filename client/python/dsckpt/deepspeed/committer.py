"""dsckpt.deepspeed.committer — what the checkpoint engine's committer thread does for one tag
(the package's docstring says when): every save of the tag DURABLE, DeepSpeed's file names
linked to ours, the ranks' agreement on the engine's gloo group, the seal, and rank 0's commit.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any, List, Optional, Tuple

from .. import torch as dtorch
from ..core import Connection, Level
from ..errors import DsckptError, Errno, error_for

log = logging.getLogger("dsckpt.deepspeed")
MARKER = "dsckpt_rank{rank}"


@dataclasses.dataclass
class Job:
    """One tag handed to the committer thread."""

    tag: str
    tag_dir: Optional[str]
    saves: List[Tuple[str, dtorch.SaveHandle]]  # (DeepSpeed's path, handle)


def durable(ce: Any, handle: dtorch.SaveHandle) -> Optional[DsckptError]:
    """Polls a save of engine ce until DURABLE without blocking the shared connection; its
    error."""
    deadline = None if ce.timeout is None else time.monotonic() + ce.timeout
    delay = 0.002
    while True:
        try:
            p = handle.progress()
        except DsckptError as e:
            return e
        if p.level == Level.FAILED:
            return error_for(Errno.EFAILED, "EFAILED",
                             f"{handle.path}: {ce.conn.last_error}")
        if p.level >= Level.DURABLE:
            return None
        if deadline is not None and time.monotonic() > deadline:
            return error_for(Errno.ETIMEDOUT, "ETIMEDOUT",
                             f"{handle.path} is {p.level.name} after {ce.timeout} s")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def commit_tag(ce: Any, job: Job) -> None:
    """Engine ce's tag job: DURABLE here, agreement everywhere, then rank 0 commits; raises
    on failure."""
    error: Optional[DsckptError] = None
    for path, handle in job.saves:
        error = error or durable(ce, handle)
        if error is None:
            # Beside the file: in the tag, or in its staging directory for a new
            # version of a committed tag (the link goes with it at the exchange).
            for d in (os.path.dirname(path), staging(os.path.dirname(path))):
                if os.path.isfile(os.path.join(d, os.path.basename(handle.path))):
                    link(os.path.join(d, os.path.basename(path)),
                         os.path.join(d, os.path.basename(handle.path)))
    tag_dir = job.tag_dir or next((h.dir for _, h in job.saves
                                   if os.path.basename(h.dir) == job.tag), None)
    mine = any(os.path.normpath(h.dir) == tag_dir for _, h in job.saves)
    ok, no_writer = ce._min(int(error is None), -int(mine))
    if ok and no_writer == 0:
        return  # nothing went into the tag directory (e.g. save_16bit_model)
    if ok and not mine and tag_dir is not None:
        marker = dtorch.save({}, tag_dir, conn=ce.conn, file=MARKER.format(rank=ce.rank),
                             track=False)
        error = durable(ce, marker)
    if error is None and tag_dir is not None:
        try:  # from here the daemons commit the tag even if every trainer dies
            ce.conn.seal(tag_dir)
        except DsckptError as e:
            error = e
    (ok,) = ce._min(int(error is None))
    if error is not None:
        try:
            raise error
        finally:
            error = None  # a frame holding what it raised is a reference cycle
    if not ok:
        raise error_for(Errno.EFAILED, "EFAILED", f"a save into {tag_dir} failed on "
                        "another rank")
    code, failure = 0, None
    if ce.rank == 0:
        try:
            if ce._commit_conn is None:
                ce._commit_conn = Connection(ce.socket, job=ce.job, rank=ce.rank,
                                             world_size=ce.world_size)
            ce._commit_conn.commit(tag_dir, ce.timeout)
        except DsckptError as e:
            code, failure = e.code, e
    (code,) = ce._min(code)
    if failure is not None:
        try:
            raise failure
        finally:
            failure = None  # as error above
    if code < 0:
        raise error_for(code, Errno(code).name if code in Errno._value2member_map_
                        else str(code), f"commit of {tag_dir} failed on rank 0")
    ce.committed.append(tag_dir)
    log.info("dsckpt: committed %s", tag_dir)


def job_dirs(job: Job) -> set:
    """The directories a queued tag's saves went into (the tag's own, and any other)."""
    return {os.path.dirname(p) for p, _ in job.saves} | ({job.tag_dir} if job.tag_dir else set())


def staging(tag_dir: str) -> str:
    """Where the daemon stages a committed tag's new version: ``.<tag>.dsckpt-next``."""
    return os.path.join(os.path.dirname(tag_dir), f".{os.path.basename(tag_dir)}.dsckpt-next")


def link(path: str, target: str) -> None:
    """Points DeepSpeed's file name at our safetensors file (a relative symlink)."""
    if os.path.realpath(path) == os.path.realpath(target):
        return
    tmp = f"{path}.dsckpt-link"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(os.path.basename(target), tmp)
    os.replace(tmp, path)
