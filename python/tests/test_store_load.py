"""Bounded background load on torch's store: an idle loom group costs the store about one
request per second per rank (its heartbeat, LOOM_HEARTBEAT_MS), through torch's TCPStore (Loom's
long waits, the diagnostics listener's among them, run on a client connection of their own and
are answered by the server) and through a store written in Python (waits poll, at most once a
second after their first); and the cross-rank diagnosis still reaches an idle rank at once.

The idle counts are upper bounds: a slow machine only lowers them."""

import pathlib
import socket
import time

import pytest

torch = pytest.importorskip("torch", reason="torch is not importable (scripts/setup.sh)")

import ranks  # noqa: E402

IDLE_S = 3.0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_clock_estimates(group, world):
    """Waits (at most 20 s) until every rank's heartbeat in `group`'s store carries its clock
    estimate (docs/diagnostics.md, "Clocks"): the group's setup traffic is over. Read through
    the group's store before the count is taken."""
    from loom_torch import _C

    deadline = time.monotonic() + 20
    for r in range(1, world):
        while True:
            # Through the group's own store: torch 1.13 and 2.x nest a group's prefixes
            # differently.
            fields = _C._store_get(group, f"flight/heartbeat/{r}").decode().split()
            if fields[1] == "2" and (fields[-2] != "0" or fields[-1] != "0"):
                break
            assert time.monotonic() < deadline, f"rank {r}: no clock estimate within 20 s"
            time.sleep(0.05)  # poll interval of a deadline loop


def _idle_rates(rank, world, tmp, port):
    """Requests per second that each of two idle loom groups sent to torch's store."""
    from datetime import timedelta

    import torch.distributed as dist

    import loom_torch
    from loom_torch import _C

    dist.init_process_group("loom", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=30))
    sub = dist.new_group(backend="loom")
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.all_reduce(t, group=sub)
    groups = [dist.distributed_c10d._get_default_group(), sub]
    for g in groups:
        _wait_for_clock_estimates(g, world)
    dist.barrier()
    before = [_C._store_requests(g) for g in groups]
    start = time.monotonic()
    time.sleep(IDLE_S)  # the measured idle time, not a wait for anything
    seconds = time.monotonic() - start
    rates = [(_C._store_requests(g) - b) / seconds for g, b in zip(groups, before)]
    dist.all_reduce(t)  # every rank still there: the store lives until all measured
    assert loom_torch.transport_summary()
    return rates


def test_idle_groups_cost_the_tcp_store_about_one_request_per_second_per_rank():
    results = ranks.spawn(_idle_rates, 3, free_port(), timeout=90)
    print("requests/s per rank and group (default, new_group):", results)
    for rank, rates in results.items():
        for rate in rates:
            # The heartbeat is one request a second; the listener's wait costs about one a
            # minute. Before its waits had a connection of their own, the listener polled
            # every 50 ms: 20 requests a second.
            assert rate <= 1.5, (rank, rates)


class CountingStore(torch.distributed.Store):
    """A store written in Python over torch's FileStore that counts the calls it forwards. (torch
    1.13's Python stores have no check(): it is a wait of 1 ms, which a FileStore, unlike a
    TCPStore client, can give up without harm.)"""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.calls = 0

    def _count(self):
        self.calls += 1

    def set(self, key, value):
        self._count()
        return self.inner.set(key, value)

    def get(self, key):
        self._count()
        return self.inner.get(key)

    def add(self, key, value):
        self._count()
        return self.inner.add(key, value)

    def compare_set(self, key, expected, desired):
        self._count()
        # torch hands a Python store the values as lists of ints; FileStore takes bytes.
        return self.inner.compare_set(key, bytes(expected), bytes(desired))

    def check(self, keys):
        from datetime import timedelta

        self._count()
        try:
            self.inner.wait(keys, timedelta(milliseconds=1))
            return True
        except RuntimeError:
            return False

    def wait(self, keys, timeout=None):
        self._count()
        return self.inner.wait(keys) if timeout is None else self.inner.wait(keys, timeout)

    def delete_key(self, key):
        self._count()
        return self.inner.delete_key(key)

    def num_keys(self):
        self._count()
        return self.inner.num_keys()


def _idle_python_store(rank, world, tmp):
    from datetime import timedelta

    import torch.distributed as dist

    import loom_torch  # noqa: F401

    store = CountingStore(dist.FileStore(f"{tmp}/store", world))
    dist.init_process_group("loom", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))
    t = torch.ones(4)
    dist.all_reduce(t)
    # Setup over (its heartbeat comes a second after it: the listener's first, faster polled
    # second is over too).
    _wait_for_clock_estimates(dist.distributed_c10d._get_default_group(), world)
    dist.barrier()
    before = store.calls
    start = time.monotonic()
    time.sleep(IDLE_S)  # the measured idle time
    seconds = time.monotonic() - start
    rate = (store.calls - before) / seconds
    dist.all_reduce(t)
    return rate


def test_idle_group_over_a_python_store_polls_at_most_once_a_second():
    results = ranks.spawn(_idle_python_store, 2, timeout=90)
    print("requests/s per rank through a Python store:", results)
    for rank, rate in results.items():
        # The heartbeat (1/s) and the listener's polled wait (1/s after its first second).
        assert rate <= 2.5, (rank, rate)


def _idle_peer_is_diagnosed(rank, world, tmp, port):
    from datetime import timedelta

    import torch.distributed as dist

    import loom_torch  # noqa: F401

    dist.init_process_group("loom", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=2))
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.all_reduce(t)
    done = pathlib.Path(tmp) / f"rank{rank}_done"
    if rank == 2:  # idle (its listener waits), until the others have raised
        deadline = time.monotonic() + 30
        while not all((pathlib.Path(tmp) / f"rank{r}_done").exists() for r in (0, 1)):
            assert time.monotonic() < deadline, "the others never raised"
            time.sleep(0.05)  # poll interval of a deadline loop
        return None
    start = time.monotonic()
    try:
        dist.all_reduce(t)
        message = None
    except RuntimeError as e:
        message = str(e)
    seconds = time.monotonic() - start
    done.touch()
    # Rank 0 hosts torch's TCPStore: it stays until rank 1 has read the reports too.
    deadline = time.monotonic() + 30
    while not all((pathlib.Path(tmp) / f"rank{r}_done").exists() for r in (0, 1)):
        assert time.monotonic() < deadline, "the other rank never raised"
        time.sleep(0.05)  # poll interval of a deadline loop
    return message, seconds


def test_cross_rank_diagnosis_reaches_an_idle_rank_through_the_tcp_store():
    results = ranks.spawn(_idle_peer_is_diagnosed, 3, free_port(), timeout=90)
    for rank in (0, 1):
        message, seconds = results[rank]
        print(f"rank {rank} raised after {seconds:.2f} s: {message}")
        assert message is not None
        # Its record came from its listener, woken by the failing rank's request.
        assert "rank 2 never entered collective #3: it is idle since allreduce#2 completed" \
            in message, message
        assert seconds < 2 + 2 + 3, message  # the timeout, the report window, slack
