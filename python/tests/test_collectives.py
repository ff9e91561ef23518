"""Every collective of backend "loom" against gloo on the same inputs, in the same processes
(the default group is loom, a second group over the same ranks is gloo), for every dtype and
reduce op, on 2 and 3 ranks. Where gloo lacks an operation (reduce_scatter, AVG, some dtypes),
the result is checked against the reduction computed locally from every rank's inputs."""

import pytest

torch = pytest.importorskip("torch", reason="torch is not importable (scripts/setup.sh)")

import ranks  # noqa: E402

TORCH = ranks.TORCH
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int32, torch.int64, torch.bool]
N = 7  # elements per rank: odd, so that no algorithm's chunking divides it


def _ops():
    import torch.distributed as dist
    R = dist.ReduceOp
    return {"sum": R.SUM, "prod": R.PRODUCT, "min": R.MIN, "max": R.MAX, "avg": R.AVG,
            "band": R.BAND, "bor": R.BOR, "bxor": R.BXOR}


def _valid(dtype, op):
    floating = dtype.is_floating_point
    if op in ("band", "bor", "bxor"):
        return not floating
    if dtype == torch.bool:
        return op != "avg"  # sum/max: logical or, prod/min: logical and
    return True


def make(dtype, rank, op="sum", n=N):
    i = torch.arange(n)
    if dtype == torch.bool:
        return ((i + rank) % 2 == 0)
    if op in ("band", "bor", "bxor"):
        return ((i * 3 + rank * 5) % 8).to(dtype)
    return ((i + rank) % 3 + 1).to(dtype)  # 1..3: sums and products exact in every dtype


def reference(op, dtype, world, n=N):
    xs = torch.stack([make(dtype, r, op, n) for r in range(world)])
    if dtype == torch.bool and op not in ("band", "bor", "bxor"):
        if op in ("sum", "max"):
            return xs.any(0)
        return xs.all(0)
    wide = xs.double() if dtype.is_floating_point else xs.long()
    if op == "sum":
        return wide.sum(0).to(dtype)
    if op == "prod":
        return wide.prod(0).to(dtype)
    if op == "min":
        return wide.min(0).values.to(dtype)
    if op == "max":
        return wide.max(0).values.to(dtype)
    if op == "avg":
        if dtype.is_floating_point:
            return (xs.double().sum(0) / world).to(dtype)
        return torch.div(xs.sum(0), world, rounding_mode="trunc").to(dtype)
    acc = xs[0].clone()
    for x in xs[1:]:
        acc = {"band": acc & x, "bor": acc | x, "bxor": acc ^ x}[op]
    return acc


def same(got, want, what):
    if got.dtype.is_floating_point:
        torch.testing.assert_close(got, want, msg=lambda m: f"{what}: {m}")
    else:
        assert torch.equal(got, want), f"{what}: got {got}, want {want}"


class Checker:
    """Runs one collective on loom and on gloo; falls back to `want` where gloo refuses."""

    def __init__(self, gloo):
        self.gloo = gloo
        self.against_gloo = 0
        self.against_reference = 0

    def check(self, what, run, want=None, gloo=True):
        got = run(None)
        try:
            if not gloo:
                raise RuntimeError("not compared with gloo")
            expected = run(self.gloo)
            self.against_gloo += 1
        except RuntimeError:
            assert want is not None or got is None, f"{what}: gloo refused, no reference"
            expected = want
            self.against_reference += 1
        if isinstance(got, (list, tuple)):
            assert len(got) == len(expected), what
            for k, (g, e) in enumerate(zip(got, expected)):
                same(g, e, f"{what}[{k}]")
        elif got is not None:
            same(got, expected, what)


def _all_collectives(rank, world, tmp):
    import torch.distributed as dist

    gloo = ranks.init_loom_and_gloo(rank, world, tmp)
    ops = _ops()
    c = Checker(gloo)
    root = 1 % world
    for dtype in DTYPES:
        name = str(dtype).replace("torch.", "")
        x = make(dtype, rank)
        for op, rop in ops.items():
            if not _valid(dtype, op):
                continue
            xo = make(dtype, rank, op)
            want = reference(op, dtype, world)

            def allreduce(g, xo=xo, rop=rop):
                t = xo.clone()
                dist.all_reduce(t, rop, group=g)
                return t
            # gloo 1.13 gets bitwise ops on bool wrong (bor of [1,0] and [0,1] gives 0)
            gloo_ok = not (dtype == torch.bool and op in ("band", "bor", "bxor"))
            c.check(f"all_reduce {name} {op}", allreduce, want, gloo_ok)

            def reduce(g, xo=xo, rop=rop):
                t = xo.clone()
                dist.reduce(t, root, rop, group=g)
                return t if rank == root else None
            c.check(f"reduce {name} {op}", reduce, want if rank == root else None, gloo_ok)

            # reduce_scatter: world slices of N elements; slice r of rank k's input = make(k)+r
            def rs_inputs():
                return [make(dtype, rank, op) for _ in range(world)]

            # gloo's reduce_scatter and reduce_scatter_tensor sum whatever op they are given in
            # the torch 2.x before 2.11 that were run (2.4, 2.6, 2.8: MIN and PRODUCT return the
            # sum); 2.11 reduces right. The reference stands in there.
            rs_gloo_ok = gloo_ok and (op == "sum" or TORCH < (2, 0) or TORCH >= (2, 11))

            def reduce_scatter(g, rop=rop):
                out = torch.zeros(N, dtype=dtype)
                dist.reduce_scatter(out, rs_inputs(), rop, group=g)
                return out
            c.check(f"reduce_scatter {name} {op}", reduce_scatter, want, rs_gloo_ok)

            def reduce_scatter_base(g, rop=rop):
                out = torch.zeros(N, dtype=dtype)
                dist.reduce_scatter_tensor(out, torch.cat(rs_inputs()), rop, group=g)
                return out
            c.check(f"reduce_scatter_tensor {name} {op}", reduce_scatter_base, want, rs_gloo_ok)

        everyone = [make(dtype, r) for r in range(world)]

        def broadcast(g):
            t = x.clone()
            dist.broadcast(t, root, group=g)
            return t
        c.check(f"broadcast {name}", broadcast, make(dtype, root))

        def all_gather(g):
            outs = [torch.zeros(N, dtype=dtype) for _ in range(world)]
            dist.all_gather(outs, x, group=g)
            return outs
        c.check(f"all_gather {name}", all_gather, everyone)

        def all_gather_tensor(g):
            out = torch.zeros(world * N, dtype=dtype)
            dist.all_gather_into_tensor(out, x, group=g)
            return out
        c.check(f"all_gather_into_tensor {name}", all_gather_tensor, torch.cat(everyone))

        def gather(g):
            outs = [torch.zeros(N, dtype=dtype) for _ in range(world)] if rank == root else None
            dist.gather(x, outs, dst=root, group=g)
            return outs
        c.check(f"gather {name}", gather, everyone if rank == root else None)

        def scatter(g):
            out = torch.zeros(N, dtype=dtype)
            ins = [make(dtype, r) for r in range(world)] if rank == root else None
            dist.scatter(out, ins, src=root, group=g)
            return out
        c.check(f"scatter {name}", scatter, make(dtype, rank))

        # all_to_all: rank k sends make(dtype, 10*k + j) to rank j
        def all_to_all(g):
            ins = [make(dtype, 10 * rank + j) for j in range(world)]
            outs = [torch.zeros(N, dtype=dtype) for _ in range(world)]
            dist.all_to_all(outs, ins, group=g)
            return outs
        c.check(f"all_to_all {name}", all_to_all, [make(dtype, 10 * k + rank) for k in range(world)])

        def all_to_all_single(g):
            ins = torch.cat([make(dtype, 10 * rank + j) for j in range(world)])
            out = torch.zeros(world * N, dtype=dtype)
            dist.all_to_all_single(out, ins, group=g)
            return out
        c.check(f"all_to_all_single {name}", all_to_all_single,
                torch.cat([make(dtype, 10 * k + rank) for k in range(world)]))

        def send_recv(g):
            # a ring: even ranks send first, odd ranks receive first (works on gloo too)
            right, left = (rank + 1) % world, (rank - 1) % world
            out = torch.zeros(N, dtype=dtype)
            if world == 1:
                return x.clone()
            if rank % 2 == 0:
                dist.send(x, right, group=g)
                dist.recv(out, left, group=g)
            else:
                dist.recv(out, left, group=g)
                dist.send(x, right, group=g)
            return out
        if world % 2 == 0:
            c.check(f"send/recv {name}", send_recv, make(dtype, (rank - 1) % world))

        def isend_irecv(g):
            right, left = (rank + 1) % world, (rank - 1) % world
            out = torch.zeros(N, dtype=dtype)
            reqs = [dist.isend(x, right, group=g), dist.irecv(out, left, group=g)]
            for r in reqs:
                r.wait()
            return out
        c.check(f"isend/irecv {name}", isend_irecv, make(dtype, (rank - 1) % world))

    def coalesced(g):
        ts = [make(torch.float32, rank, n=n) for n in (3, 5, 1000)]
        dist.all_reduce_coalesced(ts, group=g)
        return ts
    c.check("all_reduce_coalesced", coalesced,
            [reference("sum", torch.float32, world, n) for n in (3, 5, 1000)])

    dist.barrier()
    dist.barrier(group=gloo)
    return c.against_gloo, c.against_reference


@pytest.mark.parametrize("world", [2, 3])
def test_every_collective_matches_gloo(world):
    results = ranks.spawn(_all_collectives, world, timeout=120)
    vs_gloo, vs_ref = results[0]
    print(f"{world} ranks: {vs_gloo} checks against gloo, {vs_ref} against the local reference")
    assert vs_gloo > 100


def _edge_cases(rank, world, tmp):
    import torch.distributed as dist

    import loom_torch

    gloo = ranks.init_loom_and_gloo(rank, world, tmp)
    assert dist.get_backend() == "loom"
    assert "shm" in loom_torch.transport_summary()

    # Non-contiguous tensors are staged and written back. (gloo 1.13 silently reduces only the
    # first element of this column, so there is nothing to compare with.)
    for g in (None,):
        m = torch.arange(12, dtype=torch.float32).reshape(3, 4) + rank
        col = m[:, 1]  # stride 4
        assert not col.is_contiguous()
        dist.all_reduce(col, group=g)
        want = sum(torch.arange(12, dtype=torch.float32).reshape(3, 4)[:, 1] + r for r in range(world))
        assert torch.equal(m[:, 1], want)
        assert torch.equal(m[:, 0], torch.arange(0, 12, 4, dtype=torch.float32) + rank)

    # Outputs that lie end to end in one tensor (torch.chunk) go to Loom in place.
    big = torch.zeros(world * 5)
    dist.all_gather(list(big.chunk(world)), torch.full((5,), float(rank)))
    assert torch.equal(big, torch.arange(world).float().repeat_interleave(5))

    # Async ops, futures and the Work's result.
    t = torch.ones(10)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    assert torch.equal(fut.wait()[0], torch.full((10,), float(world)))
    assert work.is_completed() and work.is_success()
    chained = dist.all_reduce(torch.ones(3), async_op=True).get_future().then(
        lambda f: f.value()[0] * 2)
    assert torch.equal(chained.wait(), torch.full((3,), 2.0 * world))

    # new_group: a subgroup of ranks {0, world-1}, loom as well.
    members = [0, world - 1]
    sub = dist.new_group(members)
    if rank in members:
        s = torch.full((4,), float(rank + 1))
        dist.all_reduce(s, group=sub)
        assert torch.equal(s, torch.full((4,), float(1 + world)))
        assert dist.get_backend(sub) == "loom"

    # What is not supported says so, and leaves the group usable.
    def raises(fn, *words):
        with pytest.raises(loom_torch.LoomError) as info:  # a RuntimeError
            fn()
        for w in words:
            assert w in str(info.value), str(info.value)

    # (CUDA tensors are rejected the same way; Debian's torch has no CUDA to test it with.)
    raises(lambda: dist.all_reduce(torch.ones(4).to_sparse()), "dense")
    raises(lambda: dist.all_reduce(torch.ones(2, dtype=torch.int16)), "dtype Short")
    raises(lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BAND), "bitwise")
    t = torch.ones(3)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((3,), float(world)))

    # The benchmark's C++ loop (bench/torch/allreduce_vs_gloo.py --layers) runs real sums.
    group = dist.distributed_c10d._get_default_group()
    t = torch.ones(5, dtype=torch.float64)
    assert loom_torch._C._allreduce_loop(group, t, 3) > 0
    assert torch.equal(t, torch.full((5,), float(world) ** 3, dtype=torch.float64))
    raises(lambda: loom_torch._C._allreduce_loop(group, t, -1), "-1 iterations")
    gloo = dist.new_group(backend="gloo")
    raises(lambda: loom_torch._C._allreduce_loop(gloo, t, 1), "not a loom process group", "gloo")

    # The flight record: the loop's three all-reduces are its newest operations, done, in order.
    record = loom_torch.flight_record()
    assert record["rank"] == rank and record["size"] == world, record
    newest = sorted(record["entries"], key=lambda e: e["seq"])[-3:]
    assert [e["op"] for e in newest] == ["allreduce"] * 3, newest
    assert all(e["state"] == "done" and e["bytes"] == 40 for e in newest), newest
    assert [e["seq"] for e in newest] == list(range(newest[0]["seq"], newest[0]["seq"] + 3))
    raises(lambda: loom_torch.flight_record(gloo), "flight_record", "not a loom process group")
    dist.barrier()
    return True


def test_edge_cases_non_contiguous_futures_subgroups_and_errors():
    ranks.spawn(_edge_cases, 3, timeout=60)


def _uneven(rank, world, tmp):
    import torch.distributed as dist

    ranks.init_loom_and_gloo(rank, world, tmp)
    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        # all_gather: rank k contributes k + 1 elements of value k
        outs = [torch.zeros(k + 1, dtype=dtype) for k in range(world)]
        dist.all_gather(outs, torch.full((rank + 1,), rank, dtype=dtype))
        for k, o in enumerate(outs):
            assert torch.equal(o, torch.full((k + 1,), k, dtype=dtype)), (k, o)

        # reduce_scatter: input j (j + 1 elements) goes to rank j
        out = torch.zeros(rank + 1, dtype=dtype)
        dist.reduce_scatter(out, [torch.full((j + 1,), rank + 1, dtype=dtype) for j in range(world)])
        assert torch.equal(out, torch.full((rank + 1,), world * (world + 1) // 2, dtype=dtype))

        # all_to_all_single with split sizes (rows of 2): rank r sends j + 1 rows of 100 r + j to j
        ins = torch.cat([torch.full((j + 1, 2), 100 * rank + j, dtype=dtype) for j in range(world)])
        out = torch.zeros(world * (rank + 1), 2, dtype=dtype)
        dist.all_to_all_single(out, ins, [rank + 1] * world, [j + 1 for j in range(world)])
        want = torch.cat([torch.full((rank + 1, 2), 100 * k + rank, dtype=dtype) for k in range(world)])
        assert torch.equal(out, want), out

        # all_to_all lists of unequal tensors
        outs = [torch.zeros(rank + 1, dtype=dtype) for _ in range(world)]
        dist.all_to_all(outs, [torch.full((j + 1,), 100 * rank + j, dtype=dtype) for j in range(world)])
        for k, o in enumerate(outs):
            assert torch.equal(o, torch.full((rank + 1,), 100 * k + rank, dtype=dtype)), (k, o)

    # recv from any source: rank 0 hears from every other rank, in whatever order
    if rank == 0:
        seen = set()
        for _ in range(world - 1):
            t = torch.zeros(3)
            src = dist.recv(t)
            assert torch.equal(t, torch.full((3,), float(src))), (src, t)
            seen.add(src)
        assert seen == set(range(1, world))
    else:
        dist.send(torch.full((3,), float(rank)), 0)

    # torch 1.13's dist.monitored_barrier admits gloo only; the group's own method reaches loom.
    from datetime import timedelta
    group = dist.distributed_c10d._get_default_group()
    group.monitored_barrier(timedelta(seconds=10), wait_all_ranks=True)
    return True


@pytest.mark.parametrize("world", [2, 3])
def test_uneven_collectives_recv_any_source_monitored_barrier(world):
    ranks.spawn(_uneven, world, timeout=60)
