"""tests/gpu/dcp_reshard.py on the CPU (--device cpu, 8 MiB, one load per reader): the GPU
check's resharded restore, 4 ranks saved, 2 and 8 loaded, run against a fixture daemon so that
CI exercises the script the GPU node runs."""
import os
import subprocess
import sys

import pytest

from conftest import REPO

pytest.importorskip("torch.distributed.tensor", reason="DTensor missing (torch < 2.4)")


def test_dcp_reshard_script_on_cpu(daemon, tmp_path):
    """The script exits 0 (every restored shard bit-exact) and writes its JSON to $OUT."""
    script = os.path.join(REPO, "tests", "gpu", "dcp_reshard.py")
    env = dict(os.environ, OUT=str(tmp_path))
    out = subprocess.run([sys.executable, script, "--device", "cpu", "--mb", "8", "--repeat",
                          "1", "--socket", daemon.socket, "--root", daemon.root],
                         capture_output=True, text=True, env=env, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "4->8 Shard(0)" in out.stdout and (tmp_path / "dcp-reshard.json").exists()
