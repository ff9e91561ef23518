"""Where torch.distributed code written for gloo meets the loom backend: the calls must behave
as a torch user expects of a CPU backend, or refuse at once with an error that leaves the group
usable (tests/audit of 2026-11-29)."""

import gc
import weakref

import pytest

torch = pytest.importorskip("torch", reason="torch is not importable (scripts/setup.sh)")

import ranks  # noqa: E402

TORCH = ranks.TORCH


def _still_usable(dist, world):
    t = torch.ones(3)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((3,), float(world))), t


def _debug_detail(rank, world, tmp):
    import torch.distributed as dist

    dist.set_debug_level(dist.DebugLevel.DETAIL)
    gloo = ranks.init_loom_and_gloo(rank, world, tmp)
    t = torch.full((4,), float(rank))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((4,), float(world * (world - 1) // 2))), t
    out = torch.zeros(world * 2)
    dist.all_gather_into_tensor(out, torch.full((2,), float(rank)))
    dist.broadcast(t, src=0)
    dist.barrier()
    # The number DETAIL's wrapper compares: the same on every rank.
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    seqs = [None] * world
    dist.all_gather_object(seqs, backend._get_sequence_number_for_group(), group=gloo)
    assert len(set(seqs)) == 1 and seqs[0] > 0, seqs
    if TORCH >= (2, 15):
        # The wrapper's check names a shape mismatch before Loom sees it; the group goes on.
        with pytest.raises(RuntimeError, match="(?i)mismatch"):
            dist.all_reduce(torch.zeros(3 + rank))
        _still_usable(dist, world)
    return True


@pytest.mark.skipif(TORCH < (2, 1), reason=f"torch {torch.__version__}: DETAIL wraps plugin backends from 2.x")
def test_torch_distributed_debug_detail_runs_every_collective():
    ranks.spawn(_debug_detail, 2, timeout=90)


def _abandoned_batch(rank, world, tmp):
    import torch.distributed as dist

    ranks.init_loom_and_gloo(rank, world, tmp)
    peer = 1 - rank
    # A batch whose first operation Loom refuses (a peer beyond the group): the coalescing
    # block torch opened is never closed (its _coalescing_manager has no try/finally).
    with pytest.raises(RuntimeError, match="rank 5"):
        dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.ones(2), 5),
                                dist.P2POp(dist.irecv, torch.zeros(2), peer)])
    # A Python error in the block's body, before any operation reached Loom. torch leaves its
    # own record of the block open (pg_coalesce_state; _coalescing_manager has no try/finally),
    # so its all_reduce records calls instead of issuing them until the next _coalescing_manager
    # opens, whatever the backend; batch_isend_irecv opens one from torch 2.7 on, for a backend
    # that says it supports coalescing (Loom does from 2.7).
    if TORCH >= (2, 7):
        with pytest.raises(ValueError):
            from torch.distributed.distributed_c10d import _coalescing_manager
            with _coalescing_manager(device=torch.device("cpu")):
                raise ValueError("the body failed")
    # The next batch works...
    got = torch.zeros(3)
    for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((3,), float(rank)), peer),
                                        dist.P2POp(dist.irecv, got, peer)]):
        work.wait()
    assert torch.equal(got, torch.full((3,), float(peer))), got
    # ...and later operations are not collected into a batch nobody waits for: their tensors are
    # freed when the caller lets them go.
    t = torch.ones(1 << 16)
    dist.all_reduce(t)
    ref = weakref.ref(t)
    del t
    gc.collect()
    assert ref() is None, "an all_reduce's tensor outlived the call (kept by the backend)"
    _still_usable(dist, world)
    return True


@pytest.mark.skipif(TORCH < (2, 1), reason=f"torch {torch.__version__}: no coalescing before 2.1")
def test_a_batch_that_raises_leaves_no_coalescing_state():
    ranks.spawn(_abandoned_batch, 2, timeout=90)


def _refused_locally(rank, world, tmp):
    import torch.distributed as dist

    ranks.init_loom_and_gloo(rank, world, tmp)
    # all_to_all_single without split sizes takes whole rows of dim 0, as c10d asks.
    inp = torch.arange(6, dtype=torch.float32).reshape(3, 2) + 100 * rank
    with pytest.raises(RuntimeError, match="dim 0 \\(3 rows\\) does not divide equally"):
        dist.all_to_all_single(torch.zeros(3, 2), inp)
    _still_usable(dist, world)
    out = torch.zeros(4, 2)
    dist.all_to_all_single(out, torch.arange(8, dtype=torch.float32).reshape(4, 2) + 100 * rank)
    want = torch.cat([torch.arange(8, dtype=torch.float32).reshape(4, 2)[2 * rank:2 * rank + 2]
                      + 100 * r for r in range(world)])
    assert torch.equal(out, want), (out, want)
    # An expanded output (stride 0): refused before the collective runs, not at the copy back.
    with pytest.raises(RuntimeError, match="elements that share memory"):
        dist.all_reduce(torch.ones(1).expand(4))
    _still_usable(dist, world)
    # AVG over bool: refused before it is issued, not by the engines on every rank.
    with pytest.raises(RuntimeError, match="avg is not defined for dtype bool"):
        dist.all_reduce(torch.ones(4, dtype=torch.bool), op=dist.ReduceOp.AVG)
    _still_usable(dist, world)
    return True


def test_bad_calls_are_refused_and_the_group_goes_on():
    ranks.spawn(_refused_locally, 2, timeout=90)


def _set_timeout(rank, world, tmp):
    import time
    from datetime import timedelta

    import torch.distributed as dist

    ranks.init_loom_and_gloo(rank, world, tmp, timeout_s=60)
    dist.set_timeout(timedelta(seconds=1))
    if rank == 1:
        time.sleep(6)  # rank 0's all_reduce must give up after 1 s, not the group's 60
    start = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        dist.all_reduce(torch.ones(2))
    if rank == 0:
        assert "1000 ms" in str(info.value) or "timed out" in str(info.value), str(info.value)
        assert time.monotonic() - start < 6, "set_timeout was not applied"
    return True


@pytest.mark.skipif(not hasattr(__import__("torch.distributed").distributed, "set_timeout"),
                    reason=f"torch {torch.__version__} has no dist.set_timeout")
def test_set_timeout_applies_to_later_operations():
    ranks.spawn(_set_timeout, 2, timeout=90)


def _p2p_bytes(rank, world, tmp):
    import torch.distributed as dist

    ranks.init_loom_and_gloo(rank, world, tmp)
    peer = 1 - rank
    dtypes = [torch.int16, torch.uint16, torch.uint32, torch.uint64]
    dtypes += [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]
    for dtype in [d for d in dtypes if d is not None]:
        want = torch.arange(7).to(dtype)
        if rank == 0:
            dist.send(want, peer)
            got = torch.zeros(2, 7, dtype=dtype)[:, 0]  # non-contiguous: staged and copied back
            dist.recv(got, peer)
            sent = want[:2].view(torch.uint8).tolist()
            assert got.contiguous().view(torch.uint8).tolist() == sent, dtype
        else:
            got = torch.zeros(7, dtype=dtype)
            dist.recv(got, peer)
            assert got.view(torch.uint8).tolist() == want.view(torch.uint8).tolist(), dtype
            dist.send(want[:2].clone(), peer)
    _still_usable(dist, world)
    return True


@pytest.mark.skipif(not hasattr(torch, "uint16"), reason=f"torch {torch.__version__}: no uint16")
def test_send_recv_move_any_dtype_as_bytes():
    ranks.spawn(_p2p_bytes, 2, timeout=90)


def _dropped_work(rank, world, tmp):
    import time

    import torch.distributed as dist

    gloo = ranks.init_loom_and_gloo(rank, world, tmp, timeout_s=30)
    x = torch.full((1 << 10,), float(rank + 1))
    if rank == 0:
        # Dropping an unfinished Work returns at once (it used to wait for the operation, up to
        # its timeout, holding the GIL); the operation runs on and its result still lands.
        work = dist.all_reduce(x, async_op=True)
        start = time.monotonic()
        del work
        gc.collect()
        assert time.monotonic() - start < 1.0, f"del work took {time.monotonic() - start:.2f} s"
        dist.barrier(group=gloo)  # now rank 1 joins the all-reduce
    else:
        dist.barrier(group=gloo)
        time.sleep(0.5)
        dist.all_reduce(x)
    dist.barrier()  # issued after the all-reduce: it completes after it, in order
    assert torch.equal(x, torch.full_like(x, float(world * (world + 1) // 2))), x[:4]
    # A non-contiguous tensor is staged: a Work dropped after it completed, never waited for,
    # still copies the result back (it was lost: the copy back ran only in wait()).
    y = torch.full((8, 4), float(rank + 1)).t()
    work = dist.all_reduce(y, async_op=True)
    dist.barrier()
    del work
    gc.collect()
    assert torch.equal(y, torch.full_like(y, float(world * (world + 1) // 2))), y
    return True


def test_a_dropped_work_does_not_block_and_its_result_lands():
    ranks.spawn(_dropped_work, 2, timeout=90)


def _abort_from_thread(rank, world, tmp):
    import threading
    import time

    import torch.distributed as dist

    gloo = ranks.init_loom_and_gloo(rank, world, tmp, timeout_s=30)
    if rank == 1:
        dist.barrier(group=gloo)  # never joins the all-reduce rank 0 blocks in
        dist.barrier(group=gloo)
        return True
    dist.barrier(group=gloo)
    group = dist.distributed_c10d._get_default_group()
    threading.Timer(1.0, group.abort).start()
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="aborted"):
        dist.all_reduce(torch.ones(4))
    assert time.monotonic() - start < 10, f"abort took {time.monotonic() - start:.1f} s"
    dist.barrier(group=gloo)
    return True


@pytest.mark.skipif(not hasattr(torch.distributed, "ProcessGroup")
                    or not hasattr(torch.distributed.ProcessGroup, "abort"),
                    reason=f"torch {torch.__version__} has no ProcessGroup.abort (2.7 has)")
def test_abort_from_another_thread_ends_a_blocked_collective():
    ranks.spawn(_abort_from_thread, 2, timeout=90)


def _leave_after_the_store_host(rank, world, tmp, port):
    import os
    import time

    import torch.distributed as dist

    import loom_torch  # noqa: F401  (registers "loom")

    # torch's TCPStore client logs its failed requests to fd 2, with a C++ backtrace each.
    log = os.path.join(tmp, f"stderr{rank}")
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    dist.init_process_group("loom", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    t = torch.ones(4)
    dist.all_reduce(t)
    time.sleep(1.2)  # heartbeats beat; rank 1 estimates its clock through rank 0's listener
    if rank == 1:
        time.sleep(0.5)  # rank 0, whose process hosts the store's server, leaves first
    # A thread that needs the GIL: rank 0's wait for rank 1 must not hold it.
    import threading

    ticks, stop = [0], threading.Event()

    def tick():
        while not stop.wait(0.01):
            ticks[0] += 1

    ticker = threading.Thread(target=tick)
    ticker.start()
    start = time.monotonic()
    dist.destroy_process_group()
    took = time.monotonic() - start
    stop.set()
    ticker.join()
    if rank == 1:
        time.sleep(1.0)  # rank 0's process exits meanwhile, and its server with it
    with open(log) as f:
        return took, ticks[0], f.read()


def test_the_store_host_leaves_after_the_others_and_nobody_prints_store_errors():
    """destroy_process_group on rank 0 (torch's TCPStore server runs in its process) returns only
    once rank 1 has left too, so that rank 1's flight recorder threads (its listener, heartbeat
    and clock rounds) never use a store that is gone. Before, rank 0 returned at once and its
    exit made rank 1's TCPStore client print 'recvValue failed ... Connection was likely
    closed' with a C++ backtrace (6 of 6 runs on torch 2.15)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = ranks.spawn(_leave_after_the_store_host, 2, port, timeout=90)
    took, ticks = out[0][0], out[0][1]
    assert took >= 0.3, f"rank 0 left {took:.3f} s after it began, before rank 1 did"
    assert took < 30, out
    # One tick per 10 ms would be ~30 in 0.3 s; 3 says the GIL was free for the wait.
    assert ticks >= 3, f"rank 0's ticker ran {ticks} times in its {took:.3f} s wait (GIL held)"
    for rank in (0, 1):
        text = out[rank][2]
        assert "TCPStore" not in text and "failed" not in text, f"rank {rank}:\n{text}"


def _cross_group_deadlock(rank, world, tmp):
    from datetime import timedelta

    import torch.distributed as dist

    import loom_torch

    dist.init_process_group("loom", init_method=f"file://{tmp}/store", rank=rank,
                            world_size=world, timeout=timedelta(seconds=2))
    g = dist.new_group(ranks=[0, 1], timeout=timedelta(seconds=60))
    record = loom_torch.flight_record(g)
    assert record["group"].startswith("torch:") and record["parent_ranks"] == [0, 1], record
    assert loom_torch.flight_record().get("group", "") == ""
    t = torch.ones(4)
    if rank == 1:
        dist.all_reduce(t, group=g)  # rank 0 calls the default group's first
        return ""
    with pytest.raises(RuntimeError) as failed:
        dist.all_reduce(t)
    dist.all_reduce(t, group=g)  # ends rank 1's wait
    return str(failed.value)


def test_a_hang_across_torch_groups_names_the_other_group():
    """Rank 0 all-reduces on the default group, rank 1 on a subgroup: the default group's timeout
    says that rank 1 is blocked in the subgroup's all-reduce, which rank 0 has not entered (a
    cross-group deadlock), naming the subgroup as torch does. Loom learns torch's group name and
    the group's global ranks through torch's extended backend API; before, torch's groups were
    unnamed in Loom and the hang read as 'rank 1 never entered collective #1: it has issued no
    operation'."""
    out = ranks.spawn(_cross_group_deadlock, 2, timeout=90)
    assert 'blocked in allreduce#1 of group "torch:' in out[0], out[0]
    assert "cross-group deadlock" in out[0], out[0]
