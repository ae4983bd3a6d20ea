"""conftest.py — real dsckptd daemons for the binding's tests (as tests/harness.c does).

Each daemon gets a scratch directory with its config, socket and log; the daemon is
``$DSCKPTD`` (default ``build/dsckptd``), started with ``-d -c CONFIG``, and ready once its
socket answers. At the end it gets SIGTERM and must exit 0 (its log is shown otherwise).
"""
import json
import os
import shutil
import signal
import socket as socketlib
import subprocess
import sys
import tempfile
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "client", "python"))
DSCKPTD = os.environ.get("DSCKPTD", os.path.join(REPO, "build", "dsckptd"))


def socket_answers(path):
    """Whether something accepts connections on a Unix socket path."""
    s = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


class Daemon:
    """One dsckptd on a scratch directory; ``root`` may be shared with another daemon;
    ``netns``: run in that network namespace (``ip netns exec``)."""

    def __init__(self, root=None, cache_gib=0.0625, netns=None, **extra):
        self.dir = tempfile.mkdtemp(prefix="dsckpt-pytest.")
        self.root = root or os.path.join(self.dir, "ckpt")
        os.makedirs(self.root, exist_ok=True)
        self.socket = os.path.join(self.dir, "d.sock")
        self.config = os.path.join(self.dir, "dsckptd.json")
        self.log = os.path.join(self.dir, "dsckptd.log")
        cfg = {"socket": self.socket, "socket_mode": "0600", "allowed_roots": [self.root],
               "host_cache_size": cache_gib, "flush_threads": 2, "log_level": "debug"}
        cfg.update(extra)
        with open(self.config, "w") as f:
            json.dump(cfg, f)
        with open(self.log, "ab") as log:
            wrap = ["ip", "netns", "exec", netns] if netns else []
            self.proc = subprocess.Popen([*wrap, DSCKPTD, "-d", "-c", self.config],
                                         stderr=log, stdout=log)
        deadline = time.monotonic() + 10
        while not socket_answers(self.socket):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError(f"dsckptd did not start: {self.read_log()}")
            time.sleep(0.005)

    def read_log(self):
        """The daemon's stderr so far."""
        with open(self.log, errors="replace") as f:
            return f.read()

    def stop(self):
        """SIGTERM, wait, and remove the scratch directory; the daemon must exit 0. Once."""
        if self.dir is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = "killed after 30 s"
        log = self.read_log()
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None
        assert rc == 0, f"dsckptd exit status {rc}; log:\n{log}"


@pytest.fixture
def daemon():
    """A running daemon with its own root."""
    d = Daemon()
    yield d
    d.stop()


@pytest.fixture
def make_daemon():
    """Starts daemons on demand (e.g. two sharing one root); stops them all at the end."""
    started = []

    def start(**kw):
        d = Daemon(**kw)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


@pytest.fixture
def conn(daemon):
    """A connection identified as rank 0 of a one-rank job on the daemon."""
    import dsckpt
    c = dsckpt.Connection(daemon.socket, job="pytest", rank=0, world_size=1)
    yield c
    c.close()


@pytest.fixture
def allowlist(monkeypatch):
    """dsckpt.add_safe_types's classes, restored after the test."""
    from dsckpt import _tree
    monkeypatch.setattr(_tree, "_SAFE_BY_NAME", dict(_tree._SAFE_BY_NAME))
    monkeypatch.setattr(_tree, "_SAFE_BY_TYPE", dict(_tree._SAFE_BY_TYPE))
