#!/usr/bin/env python3
"""Turns the markdown tables printed by compare.sh (several, one per "== ranks op" header)
into one SVG with a log-log panel per table: time per collective (us) against message size
for Loom over shared memory, Loom over tcp and Open MPI (vader). Standard library only.

    python3 bench/shm/plot.py compare-output.txt docs/shm_compare.svg
"""
import math
import re
import sys

SERIES = [("loom shm", "#1f77b4"), ("loom tcp", "#ff7f0e"), ("Open MPI shm", "#2ca02c")]


def bus_factor(op, n):
    if op == "allreduce":
        return 2.0 * (n - 1) / n
    if op in ("allgather", "reduce_scatter"):
        return (n - 1) / n
    return 1.0


def parse(path):
    panels, cur = [], None
    for line in open(path):
        m = re.match(r"== (\d+) (\w+)", line)
        if m:
            cur = {"ranks": int(m.group(1)), "op": m.group(2), "rows": []}
            panels.append(cur)
            continue
        if cur is None or not line.startswith("| ") or line.startswith("| bytes"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not cells[0].isdigit():
            continue
        size = int(cells[0])
        times = []
        for c in cells[1:4]:
            if c.endswith(" us"):
                times.append(float(c[:-3]))
            elif c.endswith(" GB/s"):
                busbw = float(c[:-5])
                algbw = busbw / bus_factor(cur["op"], cur["ranks"])
                times.append(size / (algbw * 1e9) * 1e6 if algbw > 0 else None)
            else:
                times.append(None)
        cur["rows"].append((size, times))
    return panels


def svg(panels, out):
    w, h, pad = 420, 300, 50
    cols = 2
    rows = (len(panels) + cols - 1) // cols
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w * cols}" height="{h * rows}" '
             'font-family="sans-serif" font-size="11">',
             f'<rect width="{w * cols}" height="{h * rows}" fill="white"/>']
    for i, p in enumerate(panels):
        ox, oy = (i % cols) * w, (i // cols) * h
        pts = [(s, t) for s, ts in p["rows"] for t in ts if t]
        if not pts:
            continue
        xs = [math.log10(s) for s, _ in pts]
        ys = [math.log10(t) for _, t in pts]
        x0, x1 = min(xs), max(xs)
        y0, y1 = math.floor(min(ys)), math.ceil(max(ys))
        x1 = x1 if x1 > x0 else x0 + 1
        y1 = y1 if y1 > y0 else y0 + 1
        X = lambda v: ox + pad + (v - x0) / (x1 - x0) * (w - 2 * pad)
        Y = lambda v: oy + h - pad + (y0 - v) / (y1 - y0) * (h - 2 * pad)
        parts.append(f'<text x="{ox + w / 2}" y="{oy + 18}" text-anchor="middle" '
                     f'font-weight="bold">{p["op"]}, {p["ranks"]} ranks: time per call (us)</text>')
        parts.append(f'<line x1="{X(x0)}" y1="{Y(y0)}" x2="{X(x1)}" y2="{Y(y0)}" stroke="black"/>')
        parts.append(f'<line x1="{X(x0)}" y1="{Y(y0)}" x2="{X(x0)}" y2="{Y(y1)}" stroke="black"/>')
        for d in range(y0, y1 + 1):
            parts.append(f'<line x1="{X(x0)}" y1="{Y(d)}" x2="{X(x1)}" y2="{Y(d)}" stroke="#ddd"/>')
            parts.append(f'<text x="{X(x0) - 4}" y="{Y(d) + 4}" text-anchor="end">1e{d}</text>')
        for s, _ in p["rows"]:
            label = f"{s}" if s < 1024 else (f"{s >> 10}K" if s < 1 << 20 else f"{s >> 20}M")
            parts.append(f'<text x="{X(math.log10(s))}" y="{Y(y0) + 14}" '
                         f'text-anchor="middle">{label}</text>')
        for k, (name, color) in enumerate(SERIES):
            line = [(X(math.log10(s)), Y(math.log10(ts[k]))) for s, ts in p["rows"] if ts[k]]
            if line:
                parts.append('<polyline fill="none" stroke-width="2" stroke="%s" points="%s"/>' %
                             (color, " ".join(f"{a:.1f},{b:.1f}" for a, b in line)))
                for a, b in line:
                    parts.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="2.5" fill="{color}"/>')
            parts.append(f'<text x="{ox + pad + 8}" y="{oy + 34 + 13 * k}" fill="{color}">'
                         f'{name}</text>')
    parts.append("</svg>")
    open(out, "w").write("\n".join(parts))


if __name__ == "__main__":
    svg(parse(sys.argv[1]), sys.argv[2])
