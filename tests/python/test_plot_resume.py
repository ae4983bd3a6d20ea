"""tests/gpu/plot_resume.py: a bench_resume.py result drawn as an SVG by hand: one stacked bar
per method that succeeded, its segments the medians of the phases end to end, the floor a
dashed line, a failed method listed as failed; the file is well-formed XML."""
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, "tests", "gpu"))
import plot_resume  # noqa: E402

NS = "{http://www.w3.org/2000/svg}"


def run(imp, cuda, build, restore=None, step=None):
    """One child's marks as bench_resume.py's run_child returns them."""
    r = {"start": 0.05, "import": imp, "cuda": cuda, "build": build, "loss": 1.5}
    if restore is not None:
        r.update(restore=restore, step=step)
    r["total"] = r.get("step", build)
    return r


def doc():
    """A result: the floor, a method of three runs (medians in the middle), a failed one."""
    return {"preset": "smoke", "trainer": {"params": 686e6, "bytes": 8.2e9},
            "results": {"floor": [run(1.0, 3.0, 3.1)],
                        "dsckpt-meta hot": [run(1.2, 3.2, 3.3, 4.0, 4.5),
                                            run(1.0, 3.0, 3.1, 3.5, 4.0),
                                            run(1.4, 3.4, 3.5, 4.5, 5.0)],
                        "dcp": ["exit 1: ['boom']"]},
            "tmpfs": False}


def rects(root, label):
    """The bar segments of one method: {phase: (x, width)}."""
    return {r.get("class"): (float(r.get("x")), float(r.get("width")))
            for r in root.iter(NS + "rect")
            if r.find(NS + "title") is not None and r.find(NS + "title").text.startswith(label)}


def test_svg_stacks_medians_and_lists_failures():
    root = ET.fromstring(plot_resume.svg(doc()))
    meta = rects(root, "dsckpt-meta hot")
    assert list(meta) == ["import", "cuda", "build", "restore", "step"]
    for a, b in zip(list(meta.values()), list(meta.values())[1:]):
        assert abs(a[0] + a[1] - b[0]) < 0.02  # end to end
    scale = meta["cuda"][1] / 2.0  # CUDA init: 3.2 - 1.2 s, the medians
    assert abs(meta["restore"][1] - 0.7 * scale) < 0.02 and abs(meta["step"][1] - 0.5 * scale) < 0.02
    assert list(rects(root, "floor")) == ["import", "cuda", "build"]
    texts = [t.text for t in root.iter(NS + "text")]
    assert "dcp" in texts and "failed" in texts and "4.50" in texts
    assert not rects(root, "dcp")
    floor = [ln for ln in root.iter(NS + "line") if ln.get("class") == "floor"]
    assert len(floor) == 1 and abs(float(floor[0].get("x1")) - (plot_resume.LEFT + 3.1 * scale)) < 0.1


def test_cli_writes_beside_the_json(tmp_path):
    src = tmp_path / "resume.json"
    src.write_text(json.dumps(doc()))
    r = subprocess.run([sys.executable, os.path.join(REPO, "tests", "gpu", "plot_resume.py"),
                        str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ET.parse(tmp_path / "resume.svg")
    r = subprocess.run([sys.executable, os.path.join(REPO, "tests", "gpu", "plot_resume.py"),
                        str(tmp_path / "none.json")], capture_output=True, text=True)
    assert r.returncode == 1 and "none.json" in r.stderr
