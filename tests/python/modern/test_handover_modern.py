"""tests/python/test_handover.py again with the modern torch (TensorGuards proves dtypes,
shapes, strides and requires_grad there; torch 1.13 compares lists), and dsckpt.dcp's
Writer through the same plan cache; the C++ proof (dsckpt._torchext) through the same
cases, and how its build is tried, remembered when it fails, and turned off."""
import os
import subprocess
import sys
import time

import pytest
import torch

import dsckpt
import dsckpt.torch as dt
from dsckpt import _handover, _torchext
from test_handover import *  # noqa: F401,F403 - collected here too
from test_handover import (CHANGES, T, files, fresh, gpt_like, same, save,
                           test_any_change_saves_exactly, test_offset_of_a_lone_view_stays_warm,
                           test_warm_save_writes_the_cold_save_files)


def test_tensor_guards_in_use():
    assert _handover._guard_class() is not None


def test_pointers_compared_in_c(daemon, conn):
    """With dsckpt._match built and a torch that has inductor's data pointer function, a
    warm save's proof compares pointers in C; the cases of test_any_change_saves_exactly
    then run through it."""
    if _handover._match is None:
        pytest.skip("skipped: dsckpt._match is not built (make builds build/_match.abi3.so)")
    if not hasattr(torch._C._dynamo.guards, "_torchinductor_pyobject_tensor_data_ptr"):
        pytest.skip(f"skipped: torch {torch.__version__} has no C data pointer function")
    assert _handover._probe("pointers", _handover._probe_pointers) is not None
    state = gpt_like()
    save(conn, daemon.root, "p0", fresh(state))
    entry = _handover.cache(conn).get("rank0")
    assert entry.proof.fast is not None


OTHERS = ["sparse", "meta", "nested", "not a tensor"]


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("other", OTHERS)
def test_tensor_without_storage_in_a_planned_place(daemon, conn, other):
    """An object whose data pointer torch cannot give (or gives as 0), put where the plan
    recorded a dense tensor of the same dtype and shape: the proof refuses it before it asks
    torch's C function for a pointer, and the save walks (or refuses what it cannot save)."""
    state = gpt_like()
    save(conn, daemon.root, "s0", fresh(state))
    s = fresh(state)
    w = s["model"]["layers.2.weight"]
    s["model"]["layers.2.weight"] = {
        "sparse": lambda: w.to_sparse(),
        "meta": lambda: torch.empty_like(w, device="meta"),
        "nested": lambda: torch.nested.nested_tensor([w[0], w[1]]),
        "not a tensor": lambda: [w.tolist()]}[other]()
    proof = _handover.cache(conn).get("rank0").proof
    found = _handover.cache(conn).get("rank0").shape.match(s)
    assert found is None or not proof.hold(found[0])
    try:
        d, h = save(conn, daemon.root, "s1", s)
    except (dsckpt.DsckptError, TypeError, ValueError, RuntimeError, NotImplementedError):
        return  # what the walk refuses for such a tensor, said in Python
    assert h.handover in ("cold", "plain"), h.handover
    same(dt.load(d, conn=conn), s) if other == "not a tensor" else files(d)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_dcp_writer_saves_through_the_cache(daemon, conn):
    """dsckpt.dcp's Writer goes through the same plan cache: the second checkpoint of the
    same tensors is warm, and what changed in place in between is what it saves."""
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    import dsckpt.dcp
    sd = {"w": dt.host_empty((4, 6)).fill_(1), "b": torch.zeros(3), "step": torch.tensor(1.0)}
    before = dict(_handover.counts(conn))
    for i in range(3):
        sd["w"].add_(1)
        sd["step"].add_(1)
        tag = os.path.join(daemon.root, "pytest", f"dcp{i}")
        dcp.save(sd, storage_writer=dsckpt.dcp.Writer(tag, conn=conn, timeout=T), no_dist=True)
        back = {"w": torch.zeros(4, 6), "b": torch.ones(3), "step": torch.tensor(0.0)}
        dcp.load(back, storage_reader=dsckpt.dcp.Reader(tag, conn=conn), no_dist=True)
        for k in sd:
            assert torch.equal(back[k], sd[k]), (i, k)
    after = _handover.counts(conn)
    assert after.get("cold", 0) - before.get("cold", 0) == 1
    assert after.get("warm", 0) - before.get("warm", 0) == 2


@pytest.fixture
def torch_ext(monkeypatch):
    """DSCKPT_TORCH_EXT=1 with the C++ proof built (this suite's machine has a C++ compiler and
    ninja: a failed build fails the test); every proof the test makes must go through it."""
    monkeypatch.setenv("DSCKPT_TORCH_EXT", "1")
    mod = _torchext.wait(600)
    assert mod is not None, "the C++ proof was not built: see the dsckpt.torch debug log"
    hold, used = _handover._Tensors.hold, []

    def counted(self, tensors):
        """_Tensors.hold, noting whether the C++ proof made it."""
        used.append(self.ext_record is not None)
        return hold(self, tensors)

    monkeypatch.setattr(_handover._Tensors, "hold", counted)
    yield mod
    assert used and all(used), used


def test_torch_ext_proves_warm_saves(torch_ext, daemon, conn):
    test_warm_save_writes_the_cold_save_files(daemon, conn)


def test_torch_ext_keeps_a_lone_view_warm(torch_ext, daemon, conn):
    test_offset_of_a_lone_view_stays_warm(daemon, conn)


@pytest.mark.parametrize("change", CHANGES)
def test_torch_ext_any_change_saves_exactly(torch_ext, daemon, conn, change):
    test_any_change_saves_exactly(daemon, conn, change)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("other", OTHERS)
def test_torch_ext_tensor_without_storage(torch_ext, daemon, conn, other):
    test_tensor_without_storage_in_a_planned_place(daemon, conn, other)


def test_torch_ext_takes_over_a_proof_made_before_it_was_built(daemon, conn, monkeypatch):
    """An entry made while the module was being built proves in Python, then records for the
    C++ proof at its first proven save and uses it from the next."""
    monkeypatch.setenv("DSCKPT_TORCH_EXT", "0")
    state = gpt_like()
    save(conn, daemon.root, "b0", fresh(state))
    proof = _handover.cache(conn).get("rank0").proof
    assert proof.ext_record is None
    monkeypatch.setenv("DSCKPT_TORCH_EXT", "1")
    assert _torchext.wait(600) is not None
    _, h = save(conn, daemon.root, "b1", fresh(state))
    assert h.handover == "warm" and proof.ext_record is not None
    state["model"]["layers.3.weight"].add_(5)
    d, h = save(conn, daemon.root, "b2", fresh(state))
    assert h.handover == "warm"
    same(dt.load(d, conn=conn), state)


# A process that waits for the C++ proof's build, logging at debug level and saying on
# stderr when it runs the build process.
EXT_PROCESS = """
import logging, subprocess, sys
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
run = subprocess.run
def counted(*args, **kw):
    print("build process", file=sys.stderr)
    return run(*args, **kw)
subprocess.run = counted
from dsckpt import _torchext
print("built" if _torchext.wait(900) is not None else "none")
"""


def ext_process(tmp_path, mode, **env):
    """EXT_PROCESS with DSCKPT_TORCH_EXT=mode and its own extensions directory: (what it
    printed, its log)."""
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(tmp_path), DSCKPT_TORCH_EXT=mode, **env)
    r = subprocess.run([sys.executable, "-c", EXT_PROCESS], env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip(), r.stderr


def test_torch_ext_is_tried_once_per_torch_unless_forced(tmp_path):
    """Unset, the build is tried; a failure (here: no compiler) is written down and not tried
    again; DSCKPT_TORCH_EXT=1 tries anyway (past the lock a killed build left) and clears
    it; a built module is loaded again without the build process, but for a record of
    another torch or source, of a file that does not load or of one outside the build
    directory; 0 never builds."""
    failed = tmp_path / _torchext.NAME / _torchext.FAILED
    built = tmp_path / _torchext.NAME / _torchext.BUILT
    assert ext_process(tmp_path, "", CXX="false")[0] == "none"
    assert failed.read_text().startswith(torch.__version__ + " ") and not built.exists()
    out, log = ext_process(tmp_path, "")
    assert out == "none" and "failed to build before" in log
    lock = tmp_path / _torchext.NAME / "lock"
    lock.touch()
    os.utime(lock, (time.time() - _torchext.STALE_LOCK_S - 60,) * 2)
    assert ext_process(tmp_path, "1")[0] == "built"
    assert not failed.exists()
    stamp, module = built.read_text().splitlines()
    assert stamp == _torchext._stamp().strip() and os.path.isfile(module)
    out, log = ext_process(tmp_path, "")
    assert out == "built" and "build process" not in log
    elsewhere = tmp_path / os.path.basename(module)
    elsewhere.write_bytes(open(module, "rb").read())
    for record in (f"{torch.__version__} other source\n{module}\n",
                   f"{stamp}\n{tmp_path / _torchext.NAME / 'build.ninja'}\n",
                   f"{stamp}\n{elsewhere}\n"):
        built.write_text(record)
        out, log = ext_process(tmp_path, "")
        assert out == "built" and "build process" in log
        assert built.read_text() == f"{stamp}\n{module}\n"
    out, log = ext_process(tmp_path, "0")
    assert out == "none" and _torchext.NAME not in log


def test_torch_ext_directory_is_torchs(tmp_path, monkeypatch):
    """_torchext finds the build directory where torch's cpp_extension puts it, with
    TORCH_EXTENSIONS_DIR and without (then under the user's cache directory)."""
    from torch.utils import cpp_extension
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for where in (None, str(tmp_path / "ext")):
        if where is None:
            monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
        else:
            monkeypatch.setenv("TORCH_EXTENSIONS_DIR", where)
        assert _torchext._directory() == cpp_extension._get_build_directory(_torchext.NAME,
                                                                            False)
