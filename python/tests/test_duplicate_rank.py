"""RANK given to two processes under torch: init_process_group("loom") fails on both, well
within the timeout, naming the rank and both processes (host and pid), instead of one of them
joining in the other's place or both waiting out the timeout."""

import os
import time

import pytest

torch = pytest.importorskip("torch", reason="torch is not importable (scripts/setup.sh)")

import ranks  # noqa: E402

TIMEOUT_S = 30


def _same_rank(index, processes, tmp):
    from datetime import timedelta

    import torch.distributed as dist

    import loom_torch  # noqa: F401

    os.environ["RANK"] = "0"  # the copied environment: both processes are rank 0 of two
    start = time.monotonic()
    try:
        dist.init_process_group("loom", init_method=f"file://{tmp}/store",
                                rank=int(os.environ["RANK"]), world_size=2,
                                timeout=timedelta(seconds=TIMEOUT_S))
        return os.getpid(), None, time.monotonic() - start
    except Exception as e:  # noqa: BLE001: the type is checked by the caller through the text
        return os.getpid(), f"{type(e).__name__}: {e}", time.monotonic() - start


def test_rank_given_twice_fails_both_naming_both():
    results = ranks.spawn(_same_rank, 2, timeout=TIMEOUT_S + 30)
    pids = [results[i][0] for i in range(2)]
    for i in range(2):
        pid, message, seconds = results[i]
        print(f"process {i} (pid {pid}) after {seconds:.2f} s: {message}")
        assert message is not None, f"process {i} joined a group of two alone"
        assert "rank 0 of this group is claimed by two processes" in message, message
        assert f"pid {pids[0]}" in message and f"pid {pids[1]}" in message, message
        assert seconds < TIMEOUT_S / 3, (seconds, message)
