"""Runs a function on N ranks, each a forked process, with a deadline.

spawn(fn, world, *args) forks `world` processes that call fn(rank, world, tmpdir, *args)
(tmpdir: a fresh directory shared by the ranks, for file:// rendezvous) and returns
{rank: value}. A rank that raises, dies or outlives the deadline fails the call with every
rank's traceback; stragglers are killed. Fork happens before any torch thread exists in the
parent (the parent only imports torch).
"""

import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import time
import traceback

import torch

# torch's (major, minor): what the tests' version skips compare against.
TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])


def _child(fn, rank, world, tmp, queue, args):
    code = 0
    try:
        torch.set_num_threads(1)
        queue.put((rank, True, fn(rank, world, tmp, *args)))
    except BaseException:  # report everything, including SystemExit, to the parent
        queue.put((rank, False, traceback.format_exc()))
        code = 1
    finally:
        queue.close()
        queue.join_thread()
        os._exit(code)  # no atexit handlers: torch's process groups die with the process


def spawn(fn, world, *args, timeout=60, expect_dead=()):
    ctx = mp.get_context("fork")
    tmp = tempfile.mkdtemp(prefix="loom_torch_")
    queue = ctx.Queue()
    env = {"GLOO_SOCKET_IFNAME": "lo"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    procs = [ctx.Process(target=_child, args=(fn, r, world, tmp, queue, args)) for r in range(world)]
    try:
        for p in procs:
            p.start()
        results, errors = {}, []
        deadline = time.monotonic() + timeout
        expected = world - len(expect_dead)
        while len(results) + len(errors) < expected:
            left = deadline - time.monotonic()
            if left <= 0:
                errors.append(f"deadline of {timeout} s passed; reported: {sorted(results)}")
                break
            try:
                rank, ok, value = queue.get(timeout=min(left, 0.5))
            except Exception:  # queue.Empty: check for ranks that died without reporting
                dead = [r for r, p in enumerate(procs)
                        if p.exitcode not in (None, 0) and r not in expect_dead]
                unreported = [r for r in dead if r not in results]
                if unreported and all(procs[r].exitcode is not None for r in unreported):
                    time.sleep(0.2)  # its report may still be in the pipe
                    if queue.empty():
                        errors.append(f"ranks {unreported} died (exit codes "
                                      f"{[procs[r].exitcode for r in unreported]})")
                        break
                continue
            if ok:
                results[rank] = value
            else:
                errors.append(f"rank {rank}:\n{value}")
        for p in procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
        if errors:
            raise AssertionError("\n".join(errors))
        return results
    finally:
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
                p.join()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(tmp, ignore_errors=True)


def init_loom_and_gloo(rank, world, tmp, timeout_s=30):
    """The default group on loom (file://), plus a gloo group over the same ranks."""
    from datetime import timedelta

    import torch.distributed as dist

    import loom_torch  # noqa: F401  (registers "loom")

    dist.init_process_group("loom", init_method=f"file://{tmp}/store", rank=rank,
                            world_size=world, timeout=timedelta(seconds=timeout_s))
    gloo = dist.new_group(backend="gloo")
    return gloo
