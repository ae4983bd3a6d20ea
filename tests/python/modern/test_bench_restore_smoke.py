"""tests/gpu/bench_restore.py --smoke on the CPU (tiny sizes, host memory, the bundle's daemon
started by the script itself): CI runs the script the GPU node runs, with the options the
device runs use (--daemon-config, --no-copies), so a broken path shows here first."""
import json
import os
import subprocess
import sys

from conftest import REPO


def test_bench_restore_smoke(tmp_path):
    """The script exits 0 (every method's output equal to the saved tensors), the daemon got
    the extra configuration key, and the copy baselines say why they were skipped."""
    build = os.path.dirname(os.environ["DSCKPTD"])
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(tmp_path / "out"))
    out = subprocess.run([os.path.join(REPO, "tests", "gpu", "run-bench-restore"), build,
                          "--smoke", "--no-train", "--no-copies", "--results", str(tmp_path),
                          "--daemon-config", '{"restore_threads": 3}'],
                         capture_output=True, text=True, env=env, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    res = [f for f in os.listdir(tmp_path) if f.endswith(".json")]
    assert len(res) == 1, res
    with open(tmp_path / res[0]) as f:
        doc = json.load(f)
    assert json.loads(doc["args"]["daemon_config"]) == {"restore_threads": 3}
    cells = {(c["method"], c["column"]): c for c in doc["cells"]}
    for col in ("hot", "warm"):
        assert cells[("dsckpt C API", col)]["ok"] is True, cells[("dsckpt C API", col)]
    assert cells[("torch.load", "warm")].get("note") == "skipped (--no-copies)"
