"""`make demo` (tests/demo.sh) as a user runs it, in a scratch build directory of links to
this build's binaries: it succeeds, and every `dsckptctl pending` it shows lists saves (none
says "no saves"), taken while a save was on its way unless the machine finished every save
before one could be seen (then one table after the run, which says so)."""
import os
import re
import subprocess

from conftest import DSCKPTD, REPO


def test_demo_shows_saves_moving(tmp_path):
    build = os.path.dirname(os.path.abspath(DSCKPTD))
    for name in ("dsckptd", "dsckptctl", "dsckpt-example-trainer"):
        os.symlink(os.path.join(build, name), tmp_path / name)
    p = subprocess.run([os.path.join(REPO, "tests", "demo.sh"), str(tmp_path)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    samples = re.findall(r"^== dsckptctl pending([^\n]*)\n(.*?)(?=^== |\Z)", p.stdout,
                         re.M | re.S)
    assert samples, p.stdout
    for when, table in samples:
        assert "no saves" not in table, f"a pending sample{when} showed no saves:\n{table}"
        rows = [ln for ln in table.strip().split("\n")[1:] if ln.strip()]
        assert rows, f"an empty pending sample{when}"
        if "after the run" not in when:
            assert re.search(r" (ACCEPTED|SNAPSHOT|DURABLE) ", table), table
