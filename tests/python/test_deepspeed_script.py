"""The zero_to_fp32.py DeepSpeed copies beside the tags (issue 31.13), with dsckpt.deepspeed:
DeepSpeedEngine._copy_recovery_script (0.19.8's: copyfile of its own script, then chmod +x)
writes ours instead when the checkpoint engine is dsckpt's, whole at every moment; ours runs
with DeepSpeed's command line (CHECKPOINT_DIR OUTPUT_DIR, -t, --safe_serialization,
--max_shard_size, --exclude_frozen_parameters, -d) and writes into OUTPUT_DIR what DeepSpeed's
script writes there, from dsckpt's files. DeepSpeed itself is not needed: a stand-in engine
class carries DeepSpeed's method; real DeepSpeed runs in tests/gpu/ds_train.py."""
import json
import os
import shutil
import stat
import subprocess
import sys
import types

import pytest
import torch

import dsckpt.deepspeed as dd
from dsckpt.deepspeed import recovery
from test_export import same, zero_tag

THEIRS = "import pickle\nraise pickle.UnpicklingError('invalid load key')  # DeepSpeed's copy\n"


class Plain:
    """A checkpoint engine of DeepSpeed's own (torch.save)."""

    def is_decoupled(self):
        return False


def engine_class(src):
    """A DeepSpeedEngine stand-in whose _copy_recovery_script is DeepSpeed 0.19.8's."""

    class DeepSpeedEngine:
        def __init__(self):
            self._config = None
            self.checkpoint_engine = Plain()

        def _copy_recovery_script(self, save_path):
            dst = os.path.join(save_path, "zero_to_fp32.py")
            shutil.copyfile(src, dst)
            os.chmod(dst, os.stat(dst).st_mode | stat.S_IEXEC)

    return DeepSpeedEngine


def run_script(path, *args, env=None):
    """Runs a zero_to_fp32.py with this Python, offline (no daemon), without PYTHONPATH
    (the script finds dsckpt where it was when written); its result."""
    env = dict(os.environ if env is None else env, DSCKPT_SOCKET="/nonexistent/dsckpt.sock")
    env.pop("PYTHONPATH", None)
    return subprocess.run([sys.executable, path, *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_engine_writes_ours_in_place_of_deepspeeds(daemon, tmp_path):
    """install(engine) makes the engine's class write our script where DeepSpeed copies its
    own, replacing the file (a new inode, nothing left beside it, executable); an engine of
    the class whose checkpoint engine is DeepSpeed's still gets DeepSpeed's copy."""
    src = tmp_path / "theirs.py"
    src.write_text(THEIRS)
    cls = engine_class(str(src))
    save_dir = tmp_path / "save"
    save_dir.mkdir()
    ours, theirs = cls(), cls()
    ours._copy_recovery_script(str(save_dir))  # before install: DeepSpeed's
    script = save_dir / "zero_to_fp32.py"
    before = os.stat(script).st_ino
    assert script.read_text() == THEIRS
    ce = dd.install(ours, {"socket": daemon.socket, "job": "script"})
    try:
        ours._copy_recovery_script(str(save_dir))
        text = script.read_text()
        assert text == recovery.script_text() and "dsckpt.deepspeed.recovery" in text
        assert os.stat(script).st_ino != before  # renamed over, never rewritten in place
        assert os.stat(script).st_mode & stat.S_IXUSR
        assert sorted(os.listdir(save_dir)) == ["zero_to_fp32.py"]
        theirs._copy_recovery_script(str(save_dir))
        assert script.read_text() == THEIRS
        patched = cls._copy_recovery_script
        assert getattr(patched, "_dsckpt", False)
        dd.install(ours, {"socket": daemon.socket, "job": "script"}).close()
        assert cls._copy_recovery_script is patched  # once per class
    finally:
        ce.close()


def test_enable_patches_deepspeeds_engine_class(monkeypatch, tmp_path):
    """enable() (import dsckpt.deepspeed.auto) patches deepspeed.runtime.engine's
    DeepSpeedEngine the same way, once."""
    src = tmp_path / "theirs.py"
    src.write_text(THEIRS)
    engine = types.ModuleType("deepspeed.runtime.engine")
    engine.DeepSpeedEngine = engine_class(str(src))
    engine.create_checkpoint_engine = lambda *a, **kw: Plain()
    for name, mod in (("deepspeed", types.ModuleType("deepspeed")),
                      ("deepspeed.runtime", types.ModuleType("deepspeed.runtime")),
                      ("deepspeed.runtime.engine", engine)):
        monkeypatch.setitem(sys.modules, name, mod)
    sys.modules["deepspeed"].runtime = sys.modules["deepspeed.runtime"]
    sys.modules["deepspeed.runtime"].engine = engine
    dd.enable()
    patched = engine.DeepSpeedEngine._copy_recovery_script
    assert getattr(patched, "_dsckpt", False)
    dd.enable()
    assert engine.DeepSpeedEngine._copy_recovery_script is patched


def test_failed_write_is_logged_not_raised(daemon, tmp_path, caplog):
    """A script that cannot be written (here: no such directory) is logged; the save goes
    on."""
    src = tmp_path / "theirs.py"
    src.write_text(THEIRS)
    e = engine_class(str(src))()
    ce = dd.install(e, {"socket": daemon.socket, "job": "script"})
    try:
        e._copy_recovery_script(str(tmp_path / "missing"))
    finally:
        ce.close()
    assert "cannot write zero_to_fp32.py" in caplog.text


@pytest.mark.parametrize("stage,world", [(2, 2), (3, 2)])
def test_script_has_deepspeeds_command_line(daemon, tmp_path, allowlist, stage, world):
    """The script written beside a ZeRO checkpoint saved through dsckpt consolidates it as
    DeepSpeed's does: OUTPUT_DIR/pytorch_model.bin from `latest` (bit for bit, tied weights
    one tensor), model.safetensors with -t and --safe_serialization (metadata format pt),
    shards and their index above --max_shard_size, frozen parameters left out on asking;
    a missing tag is one line on stderr and exit status 1."""
    job = os.path.join(daemon.root, "ds")
    tag = os.path.join(job, f"z{stage}w{world}")
    want = zero_tag(daemon, tag, stage, world)
    script = recovery.write_script(job)
    out = tmp_path / "out"
    r = run_script(script, job, str(out))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(out / "pytorch_model.bin")]
    got = torch.load(out / "pytorch_model.bin")
    same(want, got)
    assert got["tied.weight"] is got["b.weight"]

    r = run_script(script, job, str(tmp_path / "st"), "-t", os.path.basename(tag),
                   "--safe_serialization", "-d")
    assert r.returncode == 0, r.stderr
    from safetensors import safe_open
    with safe_open(str(tmp_path / "st" / "model.safetensors"), "pt") as f:
        assert f.metadata()["format"] == "pt"
        same(dict(want), {k: f.get_tensor(k) for k in want})

    r = run_script(script, job, str(tmp_path / "sh"), "--max_shard_size", "0.0002MB")
    assert r.returncode == 0, r.stderr
    with open(tmp_path / "sh" / "pytorch_model.bin.index.json") as f:
        index = json.load(f)
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and files[0] == f"pytorch_model-00001-of-{len(files):05d}.bin"
    assert sorted(os.listdir(tmp_path / "sh")) == sorted(files + ["pytorch_model.bin.index.json"])
    merged = {}
    for name in files:
        part = torch.load(tmp_path / "sh" / name)
        assert {k for k, v in index["weight_map"].items() if v == name} == set(part)
        merged.update(part)
    same(dict(want), {k: merged[k] for k in want})
    assert set(merged) == set(want)
    assert index["metadata"]["total_size"] == sum(
        t.numel() * t.element_size() for k, t in want.items() if k != "tied.weight")

    r = run_script(script, job, str(tmp_path / "nf"), "--exclude_frozen_parameters")
    assert r.returncode == 0, r.stderr
    assert "frozen.weight" not in torch.load(tmp_path / "nf" / "pytorch_model.bin")

    r = run_script(script, job, str(tmp_path / "x"), "-t", "nosuchtag")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "nosuchtag" in r.stderr


def test_shards_as_huggingface_hub():
    """shards() splits as split_torch_state_dict_into_shards: in order, a new shard when the
    next tensor would pass the limit, an oversized tensor alone (the open shard goes on
    after it), a tied name in its first's shard, after the others (only when tensors are
    shared)."""
    a, b, big, c = (torch.zeros(n) for n in (10, 10, 100, 5))  # 40, 40, 400, 20 bytes
    sd = {"a": a, "b": b, "big": big, "tied": a, "c": c}
    assert recovery.shards(sd, 60, True) == [["a", "tied"], ["big"], ["b", "c"]]
    assert recovery.shards(sd, 60, False) == [["a"], ["big"], ["b"], ["tied", "c"]]
    assert recovery.shards(sd, 10**9, True) == [["a", "b", "big", "c", "tied"]]
    assert recovery.parse_size("5GB") == 5 * 10**9 and recovery.parse_size(" 0.5 mb") == 500000
    with pytest.raises(ValueError):
        recovery.parse_size("5GiB")
