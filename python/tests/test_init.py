"""init_process_group("loom") through env:// (torchrun and loom-run), tcp:// and file://, and
the timeout given to it is honoured."""

import os
import pathlib
import socket
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch", reason="torch is not importable (scripts/setup.sh)")

import ranks  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loom_run_path():
    path = os.environ.get("LOOM_RUN")
    if not path:
        import loom_torch
        path = str(pathlib.Path(loom_torch.__file__).resolve().parents[2] / "bin" / "loom-run")
    return path


def _tcp(rank, world, tmp, port):
    from datetime import timedelta

    import torch.distributed as dist

    import loom_torch  # noqa: F401

    dist.init_process_group("loom", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=30))
    t = torch.full((5,), float(rank))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    assert torch.equal(t, torch.full((5,), float(world - 1)))
    return True


def test_tcp_init():
    ranks.spawn(_tcp, 3, free_port(), timeout=60)


def _run(cmd, timeout=90):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"{cmd} exited {done.returncode}:\n{out}"
    return out


def test_env_init_under_loom_run():
    loom_run = loom_run_path()
    if not os.access(loom_run, os.X_OK):
        pytest.skip(f"loom-run not built ({loom_run})")
    out = _run([loom_run, "--nproc-per-node", "2", "--master-port", str(free_port()),
                sys.executable, str(HERE / "env_worker.py")])
    assert "OK rank 0 of 2" in out and "OK rank 1 of 2" in out, out


def test_env_init_under_torchrun():
    # --redirects 1 --tee 1: torchrun 1.13 under Python 3.11 cannot parse its default "0" (Std is
    # a Flag, and 3.11 no longer iterates its zero member), so give it a non-zero value.
    out = _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--redirects", "1", "--tee", "1",
                "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
                str(HERE / "env_worker.py")])
    assert "OK rank 0 of 2" in out and "OK rank 1 of 2" in out, out


def _timeout(rank, world, tmp):
    from datetime import timedelta

    import torch.distributed as dist

    import loom_torch  # noqa: F401

    dist.init_process_group("loom", init_method=f"file://{tmp}/store", rank=rank,
                            world_size=world, timeout=timedelta(seconds=2))
    done = pathlib.Path(tmp) / "rank0_done"
    if rank == 1:  # stays alive but never joins the all_reduce, until rank 0 has raised
        deadline = time.monotonic() + 30
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # poll interval of a deadline loop
        return None
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4))
        message = None
    except RuntimeError as e:
        message = str(e)
    done.touch()
    return message, time.monotonic() - start


def test_init_timeout_is_honoured():
    message, seconds = ranks.spawn(_timeout, 2, timeout=60)[0]
    print(f"raised after {seconds:.2f} s: {message}")
    assert message is not None, "all_reduce without the peer returned"
    assert 1.5 < seconds < 8, (seconds, message)
    assert "2000 ms" in message and "rank 1" in message, message


def test_a_timeout_that_is_not_positive_is_refused():
    import datetime

    import loom_torch

    # It was clamped to 1 ms: a group whose every operation timed out at once.
    for bad in (datetime.timedelta(seconds=-5), datetime.timedelta(0), 0):
        with pytest.raises(ValueError, match="timeout must be positive"):
            loom_torch._create(None, 0, 1, bad)
