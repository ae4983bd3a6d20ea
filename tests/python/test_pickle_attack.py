"""Loading a checkpoint must not run its author's code (issue 29, item 13), from the attacker's
side: dsckpt-atk commits, through the real daemon, a checkpoint whose rank0.meta blob is a
pickle that runs os.system; dsckpt-vic loads it with dsckpt.torch.load's defaults. The load
must refuse with an error that says why and how to opt in, and the attacker's command must not
have run as the victim. Real users (hostile.py); "SKIP:" without root. The DCP Reader and the
Lightning plugin are attacked the same way in tests/python/modern/test_pickle_attack_modern.py.
"""
import os
import subprocess

import pytest

import hostile
from dsckpt import _blob, _tree


@pytest.fixture
def open_daemon(make_daemon):
    """Both users and a daemon they may both reach (hostile.open_daemon)."""
    hostile.users()
    d = hostile.open_daemon(make_daemon)
    yield d
    hostile.remove_scratch(d)


def verify(d, dir):
    """dsckptctl verify of dir, as root: the attacker's checkpoint is a valid one."""
    ctl = os.path.join(os.path.dirname(os.environ.get("DSCKPTD", "build/dsckptd")), "dsckptctl")
    out = subprocess.run([ctl, "verify", dir], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def attack(d, name, blob):
    """dsckpt-atk commits <root>/atk/<name> with blob as its dsckpt.torch blob; returns the
    directory and the marker its pickle would touch."""
    dir = os.path.join(d.root, "atk", name)
    marker = os.path.join(d.scratch, name + ".ran")
    blob = blob(marker) if callable(blob) else blob
    made = hostile.as_user(hostile.ATK, "atk_commit", d.socket, dir, "rank0",
                           {_blob.BLOB: blob.decode("latin-1")}, True, home=d.scratch)
    assert made["files"][:2] == ["MANIFEST.json", "rank0.meta"]
    verify(d, dir)
    return dir, marker


def evil_v3(marker):
    """A blob of today's format whose pickled section runs the command, with a header that
    lies: it claims no pickled values."""
    skeleton = b"d" + (1).to_bytes(4, "little") + b"s\x01\x00\x00\x00x" + b"P" + \
        bytes(4) + (8).to_bytes(4, "little") + b"builtins"
    return _blob.dump(_blob.dump_tables([], []), skeleton, _tree.encode([]),
                      hostile.evil_pickle(marker))


@pytest.mark.parametrize("blob", [hostile.evil_pickle, evil_v3], ids=["pickle", "v3 section"])
def test_victim_load_runs_none_of_the_attackers_code(open_daemon, blob):
    d = open_daemon
    dir, marker = attack(d, "evil", blob)
    got = hostile.as_user(hostile.VIC, "vic_torch_load", d.socket, dir, marker,
                          home=d.scratch)
    assert not os.path.exists(marker) and not got["marker"], "the attacker's code ran"
    assert got.get("error") == "PickleRefused", got
    assert "weights_only=False" in got["message"] and "unpickl" in got["message"], got
