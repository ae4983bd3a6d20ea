"""Issue 31.12: dsckptd SIGKILLed between renaming ``dcp_metadata.meta`` into place and
renaming ``dcp_metadata.safetensors`` (the kill comes from inside the daemon, at that
rename, through a preloaded renameat). After a restart on the same root, recovery has left
nothing of the uncommitted tag (no .meta without its file, no partial); the tag is not
loadable, and saving it again commits and loads exact."""
import os
import shutil
import subprocess

import pytest
import torch

dcp = pytest.importorskip("torch.distributed.checkpoint",
                          reason="torch.distributed.checkpoint missing")
pytest.importorskip("torch.distributed.checkpoint.staging",
                    reason="DCP's AsyncStager missing (torch < 2.4)")

from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

import dsckpt  # noqa: E402
import dsckpt.dcp  # noqa: E402
from conftest import Daemon  # noqa: E402

T = 60
KILL_AT = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
/* renameat, but SIGKILL when the new name is $DSCKPT_TEST_KILL_RENAME. */
int renameat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath)
{
	static int (*real)(int, const char *, int, const char *);
	const char *at = getenv("DSCKPT_TEST_KILL_RENAME");
	if (at && strcmp(newpath, at) == 0)
		raise(SIGKILL);
	if (!real)
		real = (int (*)(int, const char *, int, const char *))dlsym(RTLD_NEXT, "renameat");
	return real(olddirfd, oldpath, newdirfd, newpath);
}
"""


@pytest.fixture
def kill_at(tmp_path):
    """A shared object whose renameat SIGKILLs the process at a chosen name."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the renameat hook")
    src, lib = tmp_path / "kill_at.c", tmp_path / "kill_at.so"
    src.write_text(KILL_AT)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src), "-ldl"], check=True)
    return str(lib)


def _files(tag):
    """The names in the tag directory (none when it is gone)."""
    return sorted(os.listdir(tag)) if os.path.isdir(tag) else []


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_killed_between_meta_and_safetensors(kill_at, monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", kill_at)
    monkeypatch.setenv("DSCKPT_TEST_KILL_RENAME", "dcp_metadata.safetensors")
    first = Daemon()
    monkeypatch.delenv("LD_PRELOAD")
    monkeypatch.delenv("DSCKPT_TEST_KILL_RENAME")
    tag = os.path.join(first.root, "job", "t")
    second = None
    try:
        sd = {"w": torch.arange(64, dtype=torch.float32), "step": 3}
        conn = dsckpt.Connection(first.socket, job="job", rank=0, world_size=1)
        with pytest.raises(CheckpointException):  # the daemon went away
            dcp.save(sd, storage_writer=dsckpt.dcp.Writer(tag, conn=conn, timeout=T),
                     no_dist=True)
        conn.close()
        assert first.proc.wait(timeout=T) == -9
        left = _files(tag)
        assert "dcp_metadata.meta" in left and "MANIFEST.json" not in left, left
        assert "dcp_metadata.safetensors" not in left, left

        second = Daemon(root=first.root)
        left = _files(tag)
        assert left == [], f"recovery left {left} in the uncommitted tag; log:\n" \
                           + second.read_log()
        with pytest.raises(dsckpt.CheckpointIncomplete):
            dsckpt.dcp.Reader(tag).read_metadata()

        conn = dsckpt.Connection(second.socket, job="job", rank=0, world_size=1)
        dcp.save(sd, storage_writer=dsckpt.dcp.Writer(tag, conn=conn, timeout=T), no_dist=True)
        back = {"w": torch.zeros(64), "step": 0}
        dcp.load(back, storage_reader=dsckpt.dcp.Reader(tag, conn=conn), no_dist=True)
        assert torch.equal(back["w"], sd["w"]) and back["step"] == 3
        conn.close()
    finally:
        if second is not None:
            second.stop()
        if first.proc.poll() is None:
            first.proc.kill()
        shutil.rmtree(first.dir, ignore_errors=True)
