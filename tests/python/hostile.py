"""hostile.py — the Python binding's tests against hostile users, as tests/harness_hostile.c
runs the C ones: two real users (dsckpt-atk, the attacker, and dsckpt-vic, the victim) made
with useradd, each side run in a subprocess that drops to its user (os.setgroups,
os.setgid, os.setuid) before it imports dsckpt or connects, against the real daemon of
conftest.py on a socket both may reach. Without root the tests using it say "SKIP:".

``python hostile.py USER FUNCTION JSON_ARGS`` is how a side runs: it drops to USER, calls
FUNCTION(*args) of this module and prints its JSON result as its last line.
"""
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile

import pytest

ATK, VIC = "dsckpt-atk", "dsckpt-vic"
HERE = os.path.dirname(os.path.abspath(__file__))
T = 60


def users() -> None:
    """Makes sure both users exist (useradd, as tests/harness.c's h_user does); skips the
    test without root."""
    if os.geteuid() != 0:
        pytest.skip("SKIP: attacks need root (useradd, setuid)")
    for name in (ATK, VIC):
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "-r", "-M", "-s", "/usr/sbin/nologin", name],
                           env=dict(os.environ, PATH=os.environ.get("PATH", "") +
                                    ":/usr/sbin:/sbin"), capture_output=True)
            try:
                pwd.getpwnam(name)
            except KeyError:
                pytest.skip(f"SKIP: cannot make user {name}")


def open_daemon(make_daemon):
    """A daemon whose socket both users may connect to and whose root they may traverse
    (as tests/harness_hostile.c's hd_start), and a scratch directory anyone may write to
    (for markers and $HOME)."""
    d = make_daemon(socket_mode="0666")
    os.chmod(d.dir, 0o755)
    os.chmod(d.root, 0o755)
    scratch = tempfile.mkdtemp(prefix="dsckpt-hostile.")
    os.chmod(scratch, 0o1777)
    d.scratch = scratch
    return d


def remove_scratch(d) -> None:
    """Removes the scratch directory of open_daemon."""
    shutil.rmtree(d.scratch, ignore_errors=True)


def as_user(user: str, function: str, *args, home: str = "/tmp"):
    """FUNCTION(*args) of this module run as user in a fresh process: its JSON result."""
    env = dict(os.environ, HOME=home, PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([sys.executable, os.path.join(HERE, "hostile.py"), user, function,
                           json.dumps(args)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, f"{user} {function}: rc {proc.returncode}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def evil_pickle(marker: str) -> bytes:
    """A pickle whose loading runs os.system("touch MARKER") (protocol 0: GLOBAL, MARK,
    STRING, TUPLE, REDUCE)."""
    assert "'" not in marker and "\n" not in marker
    return b"cos\nsystem\n(S'touch " + marker.encode() + b"'\ntR."


# ---- the sides (run as a user) --------------------------------------------------------


def _connect(socket: str, job: str):
    """A connection as rank 0 of a one-rank job."""
    import dsckpt
    return dsckpt.Connection(socket, job=job, rank=0, world_size=1)


def atk_commit(socket: str, dir: str, file: str, blobs: dict, tensor: bool) -> dict:
    """The attacker saves dir/file with the given blobs (name → latin-1 text of the bytes)
    and, when asked, one tensor "w"; commits dir and lets everyone read it."""
    import dsckpt
    import torch
    job = os.path.basename(os.path.dirname(dir))
    with _connect(socket, job) as conn:
        w = torch.arange(4, dtype=torch.float32)
        s = conn.save(dir, file)
        if tensor:
            s.add_tensors([("w", "F32", (4,), w.data_ptr(), 16)])
        for name, text in blobs.items():
            s.add_blob(name, text.encode("latin-1"))
        s.end()
        s.wait(dsckpt.Level.DURABLE, T)
        s.close()
        conn.commit(dir, T)
    os.chmod(os.path.dirname(dir), 0o755)
    os.chmod(dir, 0o755)
    for name in os.listdir(dir):
        os.chmod(os.path.join(dir, name), 0o644)
    return {"uid": os.getuid(), "files": sorted(os.listdir(dir))}


def _outcome(fn) -> dict:
    """What fn() did: its result's repr or its exception's type and message (DCP raises
    CheckpointException, a BaseException)."""
    try:
        return {"ok": repr(fn())[:200]}
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - the test reads what happened
        return {"error": type(e).__name__, "message": str(e), "uid": os.getuid()}


def vic_torch_load(socket: str, dir: str, marker: str) -> dict:
    """The victim loads dir's rank0 with dsckpt.torch.load (through its own daemon
    connection); whether the marker exists afterwards."""
    import dsckpt.torch as dt
    job = "victim"
    with _connect(socket, job) as conn:
        out = _outcome(lambda: dt.load(dir, "rank0", conn=conn))
    return dict(out, marker=os.path.exists(marker))


def vic_dcp_load(socket: str, dir: str, marker: str, value: bool) -> dict:
    """The victim loads a DCP checkpoint from dir with dsckpt.dcp.Reader into a tensor "w"
    and, when asked, a value "x" (which DCP's planner reads as bytes)."""
    import io
    import logging
    import torch
    import torch.distributed.checkpoint as dcp
    import dsckpt.dcp
    # DCP before torch 2.13 raises "metadata is None" and says why only in a warning it logs
    # with the reader's exception: what the user sees there is kept too.
    seen = io.StringIO()
    handler = logging.StreamHandler(seen)
    logging.getLogger("torch.distributed.checkpoint").addHandler(handler)
    with _connect(socket, "victim") as conn:
        state = {"w": torch.zeros(4), **({"x": 0} if value else {})}
        out = _outcome(lambda: dcp.load(state, storage_reader=dsckpt.dcp.Reader(dir,
                                                                                conn=conn)))
    return dict(out, marker=os.path.exists(marker), log=seen.getvalue())


def vic_lightning_load(socket: str, dir: str, marker: str) -> dict:
    """The victim loads a Lightning checkpoint from dir with DsckptCheckpointIO."""
    from dsckpt.lightning import DsckptCheckpointIO
    io = DsckptCheckpointIO(socket, job="victim")
    try:
        out = _outcome(lambda: io.load_checkpoint(dir))
    finally:
        io.teardown()
    return dict(out, marker=os.path.exists(marker))


def main(argv) -> int:
    """Drops to user argv[0], then runs function argv[1] with JSON args argv[2]."""
    pw = pwd.getpwnam(argv[0])
    os.setgroups([])
    os.setgid(pw.pw_gid)
    os.setuid(pw.pw_uid)
    if (os.getuid(), os.geteuid(), os.getgid()) != (pw.pw_uid, pw.pw_uid, pw.pw_gid):
        return 125
    result = globals()[argv[1]](*json.loads(argv[2]))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
