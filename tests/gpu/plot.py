#!/usr/bin/env python3
"""plot.py — PNG pictures of the GPU benchmarks' result JSON, beside their tables.

    python3 tests/gpu/plot.py [--out DIR] RESULT.json...

Each JSON gets what fits it, named after it (DIR defaults to the JSON's own directory):
  <name>.png           bench-train (train.json, bench_train.py; node-train.json too): the
                       iteration time of every mode over the iterations, a vertical tick at
                       each checkpoint; bench-restore (bench-restore-*.json): restore GB/s per
                       source (hot, page cache, tmpfs, cold) for dsckpt and each baseline,
                       the H2D, preadv and dd bounds as horizontal lines;
  <name>-progress.png  bench-train's dsckpt mode when it sampled its saves ("progress"):
                       bytes snapshotted and bytes flushed against the time since the save call.
Without matplotlib it prints "plots: skipped (no matplotlib)" and exits 0: a benchmark never
fails for want of a picture. Exit status 1 when a JSON cannot be read or drawn.
"""
import argparse
import json
import os
import sys

GB = 1e9
SOURCES = (("hot", "hot (daemon cache)"), ("warm", "page cache"), ("tmpfs", "tmpfs"),
           ("cold", "cold disk"))
BOUND_STYLE = {"bound: H2D": ("black", "-"), "bound: preadv": ("dimgray", "--"),
               "bound: dd direct": ("gray", ":")}


def pyplot():
    """matplotlib's pyplot on the Agg backend (files only, no display), or None."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plain_log_ticks(ax):
    """Log-scale y ticks at 1, 2, 5 per decade, labelled as plain numbers (not 10^x)."""
    import matplotlib.ticker as ticker
    ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())


def kind_of(doc):
    """Which benchmark wrote a result document: "train", "restore" or None."""
    if isinstance(doc.get("cells"), list):
        return "restore"
    if isinstance(doc.get("results"), list):
        return "train"
    return None


def iteration_ms(r):
    """A train mode's iteration times in ms (bench_node: its slowest rank's), or None."""
    return r.get("iter_ms") or r.get("iter_ms_slowest_rank")


def plot_train(plt, doc, path):
    """Iteration time per mode over the iterations, checkpoint iterations ticked; log scale
    when the slowest iteration after the first is over 20 times the fastest (a blocking
    save's), else the scale ends above the iterations after the first (warm-up) one."""
    fig, ax = plt.subplots(figsize=(10, 5))
    lo, hi, first = float("inf"), 0.0, 0.0
    for r in doc["results"]:
        ms = iteration_ms(r)
        if not ms:
            continue
        its = range(1, len(ms) + 1)
        ax.plot(its, ms, marker=".", markersize=4, linewidth=1.2, label=r["mode"])
        rest = ms[1:] or ms
        lo, hi, first = min(lo, min(rest)), max(hi, max(rest)), max(first, ms[0])
    ckpts = doc.get("checkpoint_iters") or []
    for i, c in enumerate(ckpts):
        ax.axvline(c, color="red", alpha=0.35, linewidth=1, linestyle="--",
                   label="checkpoint" if i == 0 else None)
    if hi > 0 and hi / max(lo, 1e-9) > 20:
        ax.set_yscale("log")
        plain_log_ticks(ax)
    elif first > 1.5 * hi:  # a warm-up first iteration would flatten every other one
        ax.set_ylim(top=hi * 1.1)
        ax.annotate(f"iteration 1 (warm-up): up to {first:,.0f} ms, off the scale",
                    xy=(1, hi * 1.1), xytext=(3, hi * 1.05), fontsize=8, color="dimgray")
    cfg = doc.get("config") or {}
    state = doc.get("params", cfg.get("params", 0)) * 12 / GB
    preset = f"preset {cfg['preset']}, " if cfg.get("preset") else ""
    ax.set_title(f"bench-train: iteration time per mode ({doc.get('device', '?')}, {preset}"
                 f"~{state:.1f} GB state, checkpoint every {cfg.get('every', '?')})")
    ax.set_xlabel("iteration")
    ax.set_ylabel("iteration time (ms)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="best", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def progress_of(doc):
    """The dsckpt mode's sampled saves: a list of {"tag", "samples": [[s, snap, flushed,
    total], ...], ...}; empty when none were sampled."""
    for r in doc.get("results", []):
        if r.get("progress"):
            return r["progress"]
    return []


def checkpoint_colours(plt, n):
    """n distinct colours, one per checkpoint: the default cycle while it lasts, else n
    evenly spaced colours of a qualitative map."""
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    if n <= len(cycle):
        return cycle[:n]
    cmap = plt.get_cmap("tab20" if n <= 20 else "turbo")
    return [cmap(i / max(n - 1, 1)) if n > 20 else cmap(i) for i in range(n)]


def progress_figure(plt, doc):
    """The progress figure of plot_progress, not yet saved: bytes snapshotted (solid) and
    flushed (dashed) against seconds since each save call, one colour per checkpoint, with a
    zoom on the snapshot; a dot where wait_snapshot returned (drawn at the save's size). One
    legend below both panels: the three line styles once, then one entry per checkpoint's
    colour (not three per checkpoint over the data)."""
    from matplotlib.lines import Line2D
    saves = [p for p in progress_of(doc) if p["samples"]]
    fig, (ax, zoom) = plt.subplots(1, 2, figsize=(12, 5.5), gridspec_kw={"width_ratios": [2, 1]})
    colours = checkpoint_colours(plt, len(saves))
    snap_end = 0.0
    handles = [Line2D([], [], color="black", linewidth=1.5, label="snapshotted"),
               Line2D([], [], color="black", linewidth=1.5, linestyle="--", label="flushed"),
               Line2D([], [], color="black", marker="o", linestyle="", markersize=5,
                      label="wait_snapshot returned")]
    for p, c in zip(saves, colours):
        s = p["samples"]
        t = [0.0] + [x[0] for x in s]   # nothing is snapshotted at the save call
        snap = [0.0] + [x[1] / GB for x in s]
        flushed = [0.0] + [x[2] / GB for x in s]
        for a in (ax, zoom):
            a.plot(t, snap, color=c, linewidth=1.5)
            a.plot(t, flushed, color=c, linewidth=1.5, linestyle="--")
            if p.get("snapshot_s") is not None:
                a.plot([p["snapshot_s"]], [s[-1][3] / GB], "o", color=c, markersize=5)
        handles.append(Line2D([], [], color=c, linewidth=4, label=p["tag"]))
        done = next((x[0] for x in s if x[3] and x[1] >= x[3]), p.get("snapshot_s"))
        if done is not None:
            snap_end = max(snap_end, done, p.get("snapshot_s") or 0.0)
    total = max((x[3] for p in saves for x in p["samples"]), default=0) / GB
    for a in (ax, zoom):
        if total:
            a.axhline(total, color="gray", linewidth=0.8, linestyle=":")
        a.set_xlabel("seconds since the save call")
        a.grid(True, alpha=0.3)
    ax.set_ylabel("GB")
    ax.set_title(f"dsckpt: snapshot and flush of each {total:.1f} GB save "
                 f"({len(saves)} checkpoints)")
    zoom.set_xlim(0, max(snap_end * 1.5, 0.05))
    zoom.set_title("the snapshot (zoom)")
    rows = -(-len(handles) // 8)
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 8), fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.045 * rows + 0.01, 1, 1))
    return fig


def plot_progress(plt, doc, path):
    """Draws progress_figure into path."""
    fig = progress_figure(plt, doc)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def restore_cells(doc, size):
    """{method: {column: GB/s}} of one checkpoint size, the cells that measured a number
    (wrong or failed ones left out)."""
    out = {}
    for c in doc["cells"]:
        bad = (c.get("note") or "").startswith(("WRONG", "FAILED"))
        if c.get("size_gb") != size or c.get("gbps") is None or bad:
            continue
        out.setdefault(c["method"], {})[c["column"]] = c["gbps"]
    return out


def plot_restore(plt, doc, path):
    """Restore GB/s per source, one bar per method, one panel per checkpoint size; the bounds
    as lines: H2D across the panel, preadv and dd over their source's bars. Log scale."""
    sizes = sorted({c["size_gb"] for c in doc["cells"]
                    if c.get("gbps") is not None and c.get("column") != "disk"})
    fig, axes = plt.subplots(1, max(len(sizes), 1), figsize=(11 * max(len(sizes), 1), 6.5),
                             squeeze=False)
    for ax, size in zip(axes[0], sizes):
        cells = restore_cells(doc, size)
        methods = [m for m in cells if not m.startswith("bound:") and m != "dsckpt save+commit"]
        width = 0.8 / max(len(methods), 1)
        for j, m in enumerate(methods):
            xs = [i - 0.4 + width * (j + 0.5) for i, (col, _) in enumerate(SOURCES)
                  if col in cells[m]]
            ys = [cells[m][col] for col, _ in SOURCES if col in cells[m]]
            bars = ax.bar(xs, ys, width, label=m, hatch="" if m.startswith("dsckpt") else "//",
                          edgecolor="white" if m.startswith("dsckpt") else "black",
                          linewidth=0.4)
            ax.bar_label(bars, fmt="%.1f", fontsize=7, padding=1)
        for bound, (colour, style) in BOUND_STYLE.items():
            vals = cells.get(bound, {})
            first = True
            if "any" in vals:
                ax.axhline(vals["any"], color=colour, linestyle=style, linewidth=1.2,
                           label=f"{bound} ({vals['any']:.0f} GB/s)")
                continue
            for i, (col, _) in enumerate(SOURCES):
                if col in vals:
                    ax.hlines(vals[col], i - 0.45, i + 0.45, colors=colour, linestyles=style,
                              linewidth=1.5, label=bound if first else None)
                    first = False
        ax.set_xticks(range(len(SOURCES)))
        ax.set_xticklabels([label for _, label in SOURCES])
        ax.set_yscale("log")
        plain_log_ticks(ax)
        ax.set_ylabel("restore onto the GPU (GB/s, GB = 1e9 B)")
        ax.set_title(f"bench-restore: {size:g} GB checkpoint ({doc.get('device', '?')})")
        ax.grid(True, axis="y", which="both", alpha=0.3)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.08), fontsize=8, ncol=5)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_file(plt, src, out_dir):
    """Draws what fits the result JSON src into out_dir; the paths written."""
    with open(src) as f:
        doc = json.load(f)
    base = os.path.join(out_dir, os.path.splitext(os.path.basename(src))[0])
    kind = kind_of(doc)
    written = []
    if kind == "train":
        plot_train(plt, doc, base + ".png")
        written.append(base + ".png")
        if progress_of(doc):
            plot_progress(plt, doc, base + "-progress.png")
            written.append(base + "-progress.png")
    elif kind == "restore":
        plot_restore(plt, doc, base + ".png")
        written.append(base + ".png")
    return written


def main(argv):
    """Plots every result JSON named; 0 also without matplotlib, 1 when one failed."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", help="directory of the PNGs (default: beside each JSON)")
    p.add_argument("results", nargs="+", help="result JSON files")
    a = p.parse_args(argv)
    plt = pyplot()
    if plt is None:
        print("plots: skipped (no matplotlib)")
        return 0
    failed = 0
    for src in a.results:
        try:
            written = plot_file(plt, src, a.out or os.path.dirname(os.path.abspath(src)))
        except Exception as e:  # one bad file must not keep the others from being drawn
            print(f"plots: {src}: {type(e).__name__}: {e}")
            failed += 1
            continue
        print(f"plots: {src}: " + (", ".join(written) if written else "nothing to draw"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
