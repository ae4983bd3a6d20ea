"""dsckpt._fill — fills named destination tensors from a safetensors file, in place: through
the daemon when a connection is given (it takes the bytes from its host cache when it still
holds the file, checks every checksum, and writes CUDA and dsckpt host memory directly), else
by reading the file here (:mod:`dsckpt._files`).

Every destination is compared with the file's header first, on either path, so that a
mismatch fails before a byte is written and with the same words.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Dict, List, Optional, Tuple

import torch

from ._files import DTYPES, ST_DTYPES, header_of, read_safetensors_buffer, tensors_of
from .core import Connection, LoadLevel
from .errors import DaemonUnavailable, DsckptError, Errno, error_for

log = logging.getLogger("dsckpt.torch")

MAX_LISTED = 16


class StateDictMismatch(KeyError):
    """Destinations and a file disagree: ``missing`` (names the file lacks), ``unexpected``
    (the file's names nobody asked for, when strict) and ``mismatched`` (dtype or shape)."""

    def __init__(self, path: str, missing: List[str], unexpected: List[str],
                 mismatched: List[str]):
        KeyError.__init__(self, path)
        self.path = path
        self.missing = missing
        self.unexpected = unexpected
        self.mismatched = mismatched

    def __str__(self) -> str:
        parts = []
        for what, names in (("missing from the file", self.missing),
                            ("in the file but not in the state dict", self.unexpected),
                            ("of another dtype or shape", self.mismatched)):
            if names:
                shown = ", ".join(names[:MAX_LISTED])
                more = f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else ""
                noun = "tensor" if len(names) == 1 else "tensors"
                parts.append(f"{len(names)} {noun} {what}: {shown}{more}")
        return f"{self.path}: " + "; ".join(parts)


_HEADERS: Dict[str, tuple] = {}  # path → (its stat key, header): the last few files read
HEADERS_KEPT = 8
RACY_NS = 1_000_000_000  # a file changed this recently is not kept: its mtime may not move


def header(path: str) -> Dict[str, Tuple[torch.dtype, Tuple[int, ...]]]:
    """The tensors of a safetensors file: name → (torch dtype, shape), in file order. A file
    read before and unchanged since (same device, inode, size and mtime) is not parsed again:
    a trainer's second load of a tag, or ``load_into`` after ``load``, takes the answer of
    the first. The dict is shared: read it, never change it."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        kept = _HEADERS.get(path)
        if kept is not None and kept[0] == key:
            return kept[1]
        have = {name: (ST_DTYPES[dtype], tuple(shape))
                for name, (dtype, shape) in header_of(f, path).items()}
    if st.st_mtime_ns < time.time_ns() - RACY_NS:  # written in place within a tick, a file
        _HEADERS.pop(path, None)                     # could change and keep its mtime
        _HEADERS[path] = (key, have)
        while len(_HEADERS) > HEADERS_KEPT:
            _HEADERS.pop(next(iter(_HEADERS)), None)
    return have


def check(path: str, dests: Dict[str, torch.Tensor], strict: bool) -> None:
    """Raises StateDictMismatch unless every destination is in the file with its dtype and
    shape (and, when strict, every tensor of the file has a destination)."""
    have = header(path)
    bad = [n for n, t in dests.items()
           if (h := have.get(n)) is None or t.dtype != h[0] or t.shape != h[1]]
    if not bad and (not strict or len(have) == len(dests)):
        return
    missing = [n for n in bad if n not in have]
    mismatched = [f"{n} ({DTYPES[dests[n].dtype]} {list(dests[n].shape)}, file "
                  f"{DTYPES[have[n][0]]} {list(have[n][1])})" for n in bad if n in have]
    unexpected = [n for n in have if n not in dests] if strict else []
    if missing or mismatched or unexpected:
        raise StateDictMismatch(path, missing, unexpected, mismatched)


def _spec(name: str, t: torch.Tensor) -> tuple:
    """A contiguous destination as Load.add_tensors takes it."""
    nbytes = t.numel() * t.element_size()
    return (name, DTYPES[t.dtype], tuple(t.shape), t.data_ptr() if nbytes else 0, nbytes)


def through_daemon(conn: Connection, path_dir: str, file: str,
                   dests: Dict[str, torch.Tensor], timeout: Optional[float] = None) -> bool:
    """Has the daemon fill the contiguous destinations; False when it cannot, so that the
    caller reads the file itself: refused before the load started (the file outside the
    daemon's roots or another user's, a limit, destinations on several GPUs: nothing was
    written), or the daemon gone meanwhile (the caller's read overwrites every destination).
    Any other failure once started, such as a corrupted tensor, raises."""
    load = None
    try:
        load = conn.load(path_dir, file)
        load.add_tensors(_spec(n, t) for n, t in dests.items())
        gpus = {t.device for t in dests.values() if t.is_cuda}
        if gpus:  # the daemon's writes wait for work still queued on the destinations
            load.set_stream(torch.cuda.current_stream(next(iter(gpus))).cuda_stream)
        load.end()
        load.wait(timeout)
        log.debug("dsckpt: %s loaded from the daemon's %s", load.path, load.source)
        return True
    except DsckptError as e:
        if load is not None and load.level != LoadLevel.OPEN \
                and not isinstance(e, DaemonUnavailable):
            raise
        log.info("dsckpt: %s/%s not loaded through the daemon (the file is read here): %s",
                 path_dir, file, e)
        return False
    finally:
        if load is not None:
            load.close()


def from_file(path: str, dests: Dict[str, torch.Tensor]) -> None:
    """Fills the destinations by reading the file here: one parallel read of its data
    region (pinned when a destination is on a GPU), then one copy per tensor."""
    pin = any(t.is_cuda for t in dests.values())
    buf, entries = read_safetensors_buffer(path, pin=pin)
    data = tensors_of(buf, [e for e in entries if e[0] in dests])
    with torch.no_grad():  # pinned memory outlives the copies (PyTorch's host allocator)
        for name, t in dests.items():
            t.copy_(data[name], non_blocking=pin)


def fill(path_dir: str, file: str, dests: Dict[str, torch.Tensor],
         conn: Optional[Connection], strict: bool = True) -> str:
    """Fills contiguous destinations (name → tensor) from ``path_dir/file.safetensors``
    after checking them against its header; returns how: ``"daemon"`` or ``"file"``."""
    path = f"{path_dir}/{file}.safetensors"
    check(path, dests, strict)
    for name, t in dests.items():
        if not t.is_contiguous():
            raise error_for(Errno.EINVAL, "EINVAL", f"destination {name} is not contiguous")
    if conn is not None and through_daemon(conn, path_dir, file, dests):
        return "daemon"
    from_file(path, dests)
    return "file"

