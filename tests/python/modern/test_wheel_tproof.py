"""The C++ tensor proof built with the package (issue 31.4): `pip install --no-build-isolation`
where torch is compiles dsckpt/_tproof.cpp into the package, and a trainer then uses that module
at once, compiling nothing at run time (no build directory, no build process)."""
import os
import shutil
import subprocess
import sys

import pytest
import torch

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def have_msgpack_headers() -> bool:
    """Whether a C compiler here finds msgpack-c's header, which the wheel's libdsckpt needs."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        return False
    return subprocess.run([cc, "-E", "-x", "c", "-", "-o", os.devnull],
                          input="#include <msgpack.h>\n", text=True,
                          capture_output=True).returncode == 0


def test_package_carries_the_tensor_proof(tmp_path):
    if not have_msgpack_headers():
        pytest.skip("no msgpack-c headers here (Debian: libmsgpack-dev): the wheel's "
                    "libdsckpt cannot be built")
    # A copy of what setup.py builds from, so pip's in-tree build leaves nothing in the repository.
    src = tmp_path / "repo"
    for part in ("client", "proto", "format"):
        shutil.copytree(os.path.join(REPO, part), src / part,
                        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "--no-build-isolation", "--no-deps", "--target", str(site),
                    str(src / "client" / "python")], check=True, stdin=subprocess.DEVNULL)
    stamp = (site / "dsckpt" / "_tproof.built").read_text()
    assert stamp.startswith(torch.__version__ + " "), stamp
    ext = tmp_path / "torch_extensions"
    ext.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("DSCKPT_LIB", "DSCKPT_TORCH_EXT")}
    env.update(PYTHONPATH=str(site), TORCH_EXTENSIONS_DIR=str(ext))
    out = subprocess.run([sys.executable, "-c", """
import subprocess, dsckpt._torchext as t
def refuse(*a, **k):
    raise AssertionError("a build process was started")
subprocess.run = refuse
m = t.wait(60)
print(m.__file__ if m is not None else None)
"""], env=env, cwd=str(tmp_path), check=True, capture_output=True, text=True)
    where = out.stdout.strip()
    assert where.startswith(str(site / "dsckpt") + os.sep), out
    assert not os.listdir(ext), os.listdir(ext)
