"""tests/gpu/plot.py on small synthetic results: a bench-train result (iteration times, a
sampled save's progress) and a bench-restore result (sources, baselines, bounds, a wrong cell)
are drawn into PNGs without error where matplotlib is importable; without it plot.py says so
and exits 0."""
import json
import os
import sys

import pytest

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, "tests", "gpu"))
import plot  # noqa: E402

try:
    import matplotlib  # noqa: F401
    HAVE_MPL = True
except ImportError:
    HAVE_MPL = False
needs_mpl = pytest.mark.skipif(not HAVE_MPL, reason="skipped: no matplotlib")

PNG = b"\x89PNG\r\n\x1a\n"


def train_doc():
    """A bench-train result: three modes over 12 iterations, checkpoints after 4 and 8, the
    dsckpt mode's two saves sampled."""
    def mode(name, spike):
        """One mode's result: flat 100 ms iterations, or 300 ms ones at the checkpoints."""
        return {"mode": name, "iter_ms": [300.0 if i in (4, 8) else 100.0 + i for i in
                                          range(1, 13)] if spike else [100.0] * 12}
    saves = [{"tag": f"step{s}", "snapshot_s": 0.3,
              "samples": [[t / 10, min(1.0, t / 3) * 4e9, max(0.0, t / 20 - 0.1) * 4e9, 4e9]
                          for t in range(1, 25)]} for s in (4, 8)]
    dsckpt = dict(mode("dsckpt", False), progress=saves, progress_errors=[])
    return {"device": "synthetic", "params": 1000, "checkpoint_iters": [4, 8],
            "config": {"preset": "smoke", "every": 4},
            "results": [mode("baseline", False), dsckpt, mode("torch.save", True),
                        {"mode": "dcp.async_save", "skipped": "not here"}]}


def restore_doc():
    """A bench-restore result of one size: dsckpt and a baseline per source, the bounds, a
    save cell and a WRONG cell (left out of the picture)."""
    cells = [{"size_gb": 0.2, "method": "dsckpt save+commit", "column": "disk", "gbps": 1.0},
             {"size_gb": 0.2, "method": "bound: H2D", "column": "any", "gbps": 55.0}]
    for i, col in enumerate(("hot", "warm", "tmpfs", "cold")):
        cells.append({"size_gb": 0.2, "method": "dsckpt load", "column": col, "gbps": 40.0 - i})
        cells.append({"size_gb": 0.2, "method": "bound: preadv", "column": col, "gbps": 28.0})
        if col != "hot":
            cells.append({"size_gb": 0.2, "method": "safetensors", "column": col,
                          "gbps": 5.0 + i})
    cells.append({"size_gb": 0.2, "method": "torch.load", "column": "warm", "gbps": 2.0,
                  "note": "WRONG: bytes differ"})
    return {"device": "synthetic", "cells": cells, "train": None}


def write(tmp_path, name, doc):
    """doc written as tmp_path/name; its path."""
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


@needs_mpl
def test_train_and_progress_drawn(tmp_path, capsys):
    """A train result gives <name>.png and, with sampled saves, <name>-progress.png."""
    src = write(tmp_path, "train.json", train_doc())
    assert plot.main([src]) == 0
    for name in ("train.png", "train-progress.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG
    assert "train-progress.png" in capsys.readouterr().out


@needs_mpl
def test_restore_drawn_into_out(tmp_path):
    """A restore result gives <name>.png in the --out directory."""
    src = write(tmp_path, "bench-restore-x.json", restore_doc())
    out = tmp_path / "pictures"
    out.mkdir()
    assert plot.main(["--out", str(out), src]) == 0
    assert (out / "bench-restore-x.png").read_bytes()[:8] == PNG


@needs_mpl
def test_unreadable_result_fails_the_others_drawn(tmp_path):
    """A JSON that does not parse makes the exit status 1; the next one is drawn all the same."""
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    good = write(tmp_path, "train.json", train_doc())
    assert plot.main([str(bad), good]) == 1
    assert (tmp_path / "train.png").exists()


def test_no_matplotlib_skips(tmp_path, monkeypatch, capsys):
    """Without matplotlib: one line saying so, exit 0, no picture."""
    monkeypatch.setattr(plot, "pyplot", lambda: None)
    assert plot.main([write(tmp_path, "train.json", train_doc())]) == 0
    assert capsys.readouterr().out.strip() == "plots: skipped (no matplotlib)"
    assert not (tmp_path / "train.png").exists()


@needs_mpl
def test_progress_legend_one_colour_per_checkpoint_outside(tmp_path, monkeypatch):
    """Ten sampled checkpoints: one colour each (solid, dashed and the dot of a checkpoint
    share it, no two checkpoints do), a legend of at most the three line styles plus one entry
    per checkpoint, and no legend over either panel's data or title."""
    plt = plot.pyplot()
    drawn = []
    monkeypatch.setattr(plt, "close", drawn.append)   # keep the figure plot_progress made
    doc = train_doc()
    doc["results"][1]["progress"] = [
        {"tag": f"step{s}", "snapshot_s": 0.2 + s / 1000,
         "samples": [[t / 10, min(1.0, t / 3) * 4e9, max(0.0, t / 20 - 0.1) * 4e9, 4e9]
                     for t in range(1, 25)]} for s in range(10, 110, 10)]
    plot.plot_progress(plt, doc, str(tmp_path / "p.png"))
    fig = drawn[0]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    panels = fig.axes
    legends = list(fig.legends) + [a.get_legend() for a in panels if a.get_legend()]
    assert legends
    entries = sum(len(lg.get_texts()) for lg in legends)
    assert entries <= 3 + 10, f"{entries} legend entries for 10 checkpoints"
    for a in panels:
        solid = [ln for ln in a.get_lines() if ln.get_linestyle() == "-" and len(ln.get_xdata()) > 2]
        dashed = [ln for ln in a.get_lines() if ln.get_linestyle() == "--"]
        colours = [tuple(plt.matplotlib.colors.to_rgba(ln.get_color())) for ln in solid]
        assert len(solid) == 10 and len(set(colours)) == 10, "one colour per checkpoint"
        assert [plt.matplotlib.colors.to_rgba(ln.get_color()) for ln in dashed] == colours
    for lg in legends:
        box = lg.get_window_extent(renderer)
        for a in panels:
            assert not box.overlaps(a.get_window_extent(renderer)), "legend over the data"
            assert not box.overlaps(a.title.get_window_extent(renderer)), "legend over a title"
    monkeypatch.undo()
    plt.close(fig)
