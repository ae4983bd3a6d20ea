"""tests/gpu/bench_restore.py --smoke on the CPU (tiny sizes, host memory, the bundle's daemon
started by the script itself): CI runs the script the GPU node runs, with the options the
device runs use (--daemon-config, and a run split by --no-copies and --copies-only), so a
broken path shows here first."""
import json
import os
import subprocess
import sys

from conftest import REPO


def smoke(tmp_path, *args):
    """Runs the script with --smoke --no-train and args; its one result's cells by (method,
    column) and its arguments."""
    build = os.path.dirname(os.environ["DSCKPTD"])
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(tmp_path / "out"))
    out = subprocess.run([os.path.join(REPO, "tests", "gpu", "run-bench-restore"), build,
                          "--smoke", "--no-train", "--results", str(tmp_path), *args],
                         capture_output=True, text=True, env=env, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    res = [f for f in os.listdir(tmp_path) if f.endswith(".json")]
    assert len(res) == 1, res
    with open(tmp_path / res[0]) as f:
        doc = json.load(f)
    return {(c["method"], c["column"]): c for c in doc["cells"]}, doc["args"]


def test_bench_restore_smoke_no_copies(tmp_path):
    """Exit 0 (every method's output equal to the saved tensors), the daemon got the extra
    configuration key, and the copy baselines say why they were skipped."""
    cells, args = smoke(tmp_path, "--no-copies", "--daemon-config", '{"restore_threads": 3}')
    assert json.loads(args["daemon_config"]) == {"restore_threads": 3}
    for col in ("hot", "warm"):
        assert cells[("dsckpt C API", col)]["ok"] is True, cells[("dsckpt C API", col)]
    assert cells[("torch.load", "warm")].get("note") == "skipped (--no-copies)"


def test_bench_restore_smoke_copies_only(tmp_path):
    """The other half: torch.load and DCP measured and checked, every other row skipped."""
    cells, _ = smoke(tmp_path, "--copies-only")
    for method in ("torch.load", "DCP load"):
        assert cells[(method, "warm")]["ok"] is True, cells[(method, "warm")]
    assert cells[("dsckpt C API", "hot")].get("note") == "skipped (--copies-only)"
    assert cells[("bound: preadv", "warm")].get("note") == "skipped (--copies-only)"
