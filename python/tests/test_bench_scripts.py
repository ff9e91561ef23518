"""The torch benchmark scripts (bench/torch) run and print the tables docs/torch.md quotes."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="torch is not importable (scripts/setup.sh)")

from test_init import loom_run_path  # noqa: E402

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "torch"


def run_script(name, *args):
    env = dict(os.environ)
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    out = subprocess.run([sys.executable, str(BENCH / name), *args], capture_output=True,
                         text=True, timeout=240, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def table_rows(text, first_cell):
    """The cells of every Markdown row whose first cell is `first_cell`."""
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in text.splitlines() if line.startswith(f"| {first_cell} |")]


def test_allreduce_vs_gloo_layers_and_loom_bench():
    bin_dir = str(pathlib.Path(loom_run_path()).parent)
    out = run_script("allreduce_vs_gloo.py", "--world", "2", "--rounds", "1", "--sizes", "8,64K",
                     "--layers", "--loom-bench", bin_dir, "--per-round")
    assert "loom over shm" in out, out
    # Per size: the main table, the layers table and the inside-Loom table.
    for size in ("8 B", "64 KiB"):
        main, layers, inside = table_rows(out, size)
        assert len(main) == 10 and all(main[1:]), main
        assert re.fullmatch(r"[\d.]+x", main[5]), main
        assert len(layers) == 5 and all(re.fullmatch(r"[\d.]+ us( \([\d.]+\))?", c)
                                        for c in layers[1:]), layers
        assert len(inside) == 5 and inside[4].endswith(" us"), inside
    # 64 KiB operations are timed exactly by the flight recorder: every series has its figure.
    assert all(c.endswith(" us") for c in table_rows(out, "64 KiB")[2][1:]), out
    for series in ("loom", "loom-pg", "loom-cpp", "gloo", "loom-bench"):
        assert f"# 64 KiB {series}: " in out, out


def test_call_cost():
    out = run_script("call_cost.py", "--evict", "64K,1M", "--rounds", "1", "--calls", "50")
    for size in ("64 KiB", "1 MiB"):
        (row,) = table_rows(out, size)
        assert len(row) == 5 and all(re.fullmatch(r"-?[\d.]+", c) for c in row[1:]), row


def test_call_cost_refuses_bad_sizes():
    out = subprocess.run([sys.executable, str(BENCH / "call_cost.py"), "--evict", "lots"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "'lots' is not a byte count" in out.stderr, out.stderr
