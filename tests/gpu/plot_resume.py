#!/usr/bin/env python3
"""plot_resume.py — the time to resume per method as stacked bars, an SVG written by hand (no
matplotlib), from what bench_resume.py wrote (resume.json).

    python3 tests/gpu/plot_resume.py RESUME.json [-o docs/resume.svg]

One bar per method that succeeded, in the benchmark's order: the seconds from exec to the
resumed step split into process start (exec to `import torch` done), CUDA initialisation,
model build, restore and the first step (medians of the runs, as bench_resume.py's table), the
total at the bar's end and the floor's total as a dashed line. A method that failed is listed
as failed. Writes beside the JSON (resume.svg) unless -o says where; exit status 1 when the
JSON cannot be read.
"""
import argparse
import json
import os
import sys
from xml.sax.saxutils import escape

PARTS = (("import", "process start + import torch", "#8c8c8c"),
         ("cuda", "CUDA init", "#b07aa1"),
         ("build", "model build", "#f28e2b"),
         ("restore", "restore", "#4e79a7"),
         ("step", "first step", "#59a14f"))
ROW, BAR, LEFT, RIGHT, TOP = 26, 18, 190, 70, 48
WIDTH = 800


def median(runs, key):
    """The median of key over the runs that succeeded, or None."""
    vals = sorted(r[key] for r in runs if isinstance(r, dict) and r.get(key) is not None)
    return vals[len(vals) // 2] if vals else None


def bars(results):
    """(label, [(part key, start s, end s)], total s) per method that succeeded, and the
    labels of those that failed."""
    out, failed = [], []
    for label, runs in results.items():
        if not runs or any(isinstance(r, str) for r in runs):
            failed.append(label)
            continue
        segs, left = [], 0.0
        for key, _, _ in PARTS:
            end = median(runs, key)
            if end is None:
                continue
            segs.append((key, left, end))
            left = end
        out.append((label, segs, left))
    return out, failed


def nice_step(span):
    """A tick step of 1, 2 or 5 times a power of ten giving 4 to 10 ticks over span."""
    step = 10.0 ** int(f"{span:e}".split("e")[1])
    for m in (0.1, 0.2, 0.5, 1, 2, 5, 10):
        if span / (step * m) <= 10:
            return step * m
    return step * 10


def svg(doc):
    """The SVG text of a resume.json document."""
    rows, failed = bars(doc.get("results", {}))
    longest = max([t for _, _, t in rows] + [1e-9])
    step = nice_step(longest)
    span = step * (int(longest / step) + 1)
    plot_w = WIDTH - LEFT - RIGHT
    height = TOP + ROW * (len(rows) + len(failed)) + 70

    def x(s):
        """The x coordinate of s seconds."""
        return LEFT + plot_w * s / span

    trainer = doc.get("trainer", {})
    title = (f"time to resume, preset {doc.get('preset', '?')}"
             + (f": {trainer['params'] / 1e6:.3g}M parameters + AdamW, "
                f"{trainer['bytes'] / 1e9:.3g} GB" if "params" in trainer and "bytes" in trainer
                else ""))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
           f'<text x="{WIDTH / 2}" y="20" text-anchor="middle" font-size="14">'
           f'{escape(title)}</text>']
    axis_y = TOP + ROW * (len(rows) + len(failed)) + 4
    for i in range(int(span / step) + 1):
        t = i * step
        out.append(f'<line x1="{x(t):.1f}" y1="{TOP - 6}" x2="{x(t):.1f}" y2="{axis_y}" '
                   'stroke="#e0e0e0"/>')
        out.append(f'<text x="{x(t):.1f}" y="{axis_y + 14}" text-anchor="middle">{t:g}</text>')
    out.append(f'<text x="{LEFT + plot_w / 2}" y="{axis_y + 30}" text-anchor="middle">'
               'seconds from exec to the resumed step</text>')
    for i, (label, segs, total) in enumerate(rows):
        y = TOP + ROW * i
        out.append(f'<text x="{LEFT - 8}" y="{y + BAR - 5}" text-anchor="end">'
                   f'{escape(label)}</text>')
        for key, start, end in segs:
            colour = next(c for k, _, c in PARTS if k == key)
            out.append(f'<rect class="{key}" x="{x(start):.2f}" y="{y}" '
                       f'width="{max(x(end) - x(start), 0):.2f}" height="{BAR}" '
                       f'fill="{colour}"><title>{escape(label)}: {key} '
                       f'{end - start:.2f} s</title></rect>')
        out.append(f'<text x="{x(total) + 4:.1f}" y="{y + BAR - 5}">{total:.2f}</text>')
    for j, label in enumerate(failed):
        y = TOP + ROW * (len(rows) + j)
        out.append(f'<text x="{LEFT - 8}" y="{y + BAR - 5}" text-anchor="end">'
                   f'{escape(label)}</text>')
        out.append(f'<text x="{LEFT + 4}" y="{y + BAR - 5}" fill="#c00">failed</text>')
    floor = next((t for label, _, t in rows if label == "floor"), None)
    if floor is not None:
        out.append(f'<line class="floor" x1="{x(floor):.1f}" y1="{TOP - 6}" x2="{x(floor):.1f}"'
                   f' y2="{axis_y}" stroke="black" stroke-dasharray="4 3"/>')
    lx = 40
    for key, name, colour in PARTS:
        out.append(f'<rect x="{lx}" y="{axis_y + 42}" width="12" height="12" fill="{colour}"/>')
        out.append(f'<text x="{lx + 16}" y="{axis_y + 52}">{escape(name)}</text>')
        lx += 24 + 7 * len(name)
    if floor is not None:
        out.append(f'<line x1="{lx}" y1="{axis_y + 48}" x2="{lx + 14}" y2="{axis_y + 48}" '
                   'stroke="black" stroke-dasharray="4 3"/>')
        out.append(f'<text x="{lx + 18}" y="{axis_y + 52}">floor</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("json", help="bench_resume.py's resume.json")
    p.add_argument("-o", "--out", help="the SVG to write (default: resume.svg beside the JSON)")
    a = p.parse_args(argv)
    try:
        with open(a.json) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        print(f"plot_resume: {a.json}: {e}", file=sys.stderr)
        return 1
    out = a.out or os.path.join(os.path.dirname(os.path.abspath(a.json)), "resume.svg")
    with open(out, "w") as f:
        f.write(svg(doc))
    print(f"plot_resume: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
