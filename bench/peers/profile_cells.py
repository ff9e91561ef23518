#!/usr/bin/env python3
"""Profiles every cell of a peers table that misses one of issue 19's targets: where the time
of Loom's series in that cell goes.

For each cell below target (targets.py's evaluate(): tcp below 1.5x Gloo or 1.2x Open MPI,
shared memory below 1.5x vader, the 8-byte all-reduce slower than Open MPI) it runs Loom's
series of that cell alone (loom-run + loom-bench at that one size, out of place then in place,
about --seconds of calls in all, as many as the table's figure says fit; results not checked) under `perf record -a` (cpu-clock samples of both CPUs, kernel included),
and sorts the samples into classes by symbol:

  socket copies   the kernel's copies between user memory and socket buffers
  tcp/ip          the rest of the TCP/IP stack, loopback delivery, socket locks and accounting
  syscalls, poll  syscall entry and exit, poll/epoll/futex, the file table, libc's wrappers
  scheduler       context switches, wake-ups, yields, timers and clocks
  page faults     faults and the zeroing of fresh pages
  user copies     memcpy/memmove and Loom's streaming copy in user space
  reduction       Loom's reduction kernels
  waiting         Loom's spin and wait loops (shared-memory flags, the progress loop)
  bench harness   loom-bench's own work outside the timed loop (filling buffers, sorting the
                  samples for percentiles, parsing settings)
  loom other      everything else in Loom (the issue path, bookkeeping, malloc, clock reads)
  kernel other    kernel code in none of the classes above
  idle            no task ran on the CPU (every rank blocked)
  other           the rest (listed by the top symbol column)

The shared-memory cells profile the series that came closest (staged, window or tuned); the
tcp cells the built-in series. Each cell runs twice, the second run with more calls, and the
profile is the difference of the two (per symbol): the cost of the extra calls alone, without
loom-bench's setup. Prints a Markdown table: one row per cell, the per-call time
measured under the profiler, the classes as shares of all samples of both CPUs, and the three
heaviest symbols.

Usage: bench/peers/profile_cells.py DIR/median.md [--build build] [--seconds 3]
           [--only SUBSTRING] [--dry-run]
DIR is the peers.sh output the table came from (its tuning_n<N>.txt files serve the tuned
series). Needs perf (linux-perf) and root or kernel.perf_event_paranoid <= 0 for -a.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import targets  # noqa: E402

# (class, pattern over "dso symbol"), first match wins. Kernel symbols come as "[kernel] name".
CLASSES = [
    ("idle", r"\[kernel\] (do_idle|default_idle|default_idle_call|native_safe_halt|"
             r"pv_native_safe_halt|cpuidle_\w+|intel_idle\w*|acpi_idle\w*|poll_idle|"
             r"arch_cpu_idle|cpu_startup_entry|mwait_idle\w*|__cpuidle_text_start)"),
    ("socket copies", r"\[kernel\] (_copy_from_iter|_copy_to_iter|copy_user_\w+|"
                      r"rep_movs_alternative|__copy_user\w*|copyin|copyout|"
                      r"skb_copy_datagram_iter|__skb_datagram_iter|simple_copy_to_iter|"
                      r"csum_partial_copy\w*|memcpy_orig|__memcpy|memcpy_erms|memcpy)$"),
    ("page faults", r"\[kernel\] (clear_page\w*|\w*page_fault\w*|handle_mm_fault|"
                    r"__handle_mm_fault|do_anonymous_page|do_fault|\w*_pte\w*|"
                    r"alloc_pages\w*|__alloc_pages\w*|get_page_from_freelist|"
                    r"free_unref_page\w*|\w*folio\w*|rmqueue\w*|lru_\w+|"
                    r"__mem_cgroup\w*|mem_cgroup\w*|zap_\w+|unmap_\w+|"
                    r"release_pages|__free_pages\w*|free_pages\w*)$"),
    ("scheduler", r"\[kernel\] (__schedule|schedule\w*|finish_task_switch\w*|__switch_to\w*|"
                  r"pick_next\w*|\w*_task_fair|update_curr|update_load_avg|\w*enqueue\w*|"
                  r"\w*dequeue\w*|try_to_wake_up|ttwu_\w+|wake_up\w*|__wake_up\w*|"
                  r"do_sched_yield|\w*sched_yield|yield_task_fair|set_next_entity|"
                  r"put_prev\w*|select_task_rq\w*|hrtimer\w*|__hrtimer\w*|"
                  r"\w*tick\w*|irq_exit\w*|__irq_exit\w*|sysvec_\w+|asm_sysvec_\w+|"
                  r"__sysvec_\w+|native_sched_clock|sched_clock\w*|psi_\w+|"
                  r"raw_spin_rq\w*|_raw_spin_lock_irq\w*|update_rq_clock\w*|"
                  r"reweight_entity|newidle_balance|load_balance|rcu_\w+|"
                  r"native_write_msr|native_apic\w*|x2apic\w*|kvm_\w+|pvclock\w*|read_tsc|"
                  r"ktime_get\w*)$"),
    ("syscalls, poll", r"\[kernel\] (entry_SYSCALL\w*|\w*syscall\w*|__x64_sys_\w+|"
                       r"do_syscall_64|__fget\w*|fget\w*|__fdget\w*|fdget\w*|fput\w*|do_poll\w*|"
                       r"do_sys_poll|\w*poll\w*|ep_\w+|futex_\w+|__futex\w*|do_futex|"
                       r"__x64_sys_futex|restore_fpregs\w*|switch_fpu\w*|"
                       r"fpregs_\w+|exit_to_user_mode\w*|syscall_exit\w*|"
                       r"__check_object_size|check_heap_object|__virt_addr_valid|"
                       r"import_iovec|__import_iovec|copy_msghdr_from_user|"
                       r"___sys_sendmsg|___sys_recvmsg|__sys_sendmsg|__sys_recvmsg|"
                       r"__sys_recvfrom|__sys_sendto|sock_sendmsg|sock_recvmsg|"
                       r"security_\w+|apparmor_\w+|aa_\w+|__audit\w*|audit_\w+)$"),
    ("tcp/ip", r"\[kernel\] (\w*tcp\w*|\w*ip_\w+|ip\w+_rcv\w*|inet_\w+|\w*sk_\w+|\w*skb\w*|"
               r"sock_\w+|\w*sock\w*|\w*net_rx\w*|\w*netif_\w+|\w*dev_queue_xmit\w*|"
               r"loopback_\w+|process_backlog|\w*napi\w*|__do_softirq|do_softirq\w*|"
               r"\w*local_bh\w*|\w*softirq\w*|\w*neigh\w*|dst_\w+|\w*kfree\w*|"
               r"\w*kmalloc\w*|kmem_cache\w*|__slab\w*|slab_\w+|___slab\w*|"
               r"\w*page_frag\w*|__build_skb\w*|\w*csum\w*|nf_\w+|\w*raw_spin\w*|"
               r"_raw_\w+|\w*queued_spin\w*|native_queued\w*|\w*refcount\w*|"
               r"__ksize|ksize|memcg_\w+|__mod_\w+|mod_\w+|lock_sock\w*|release_sock|"
               r"\w*validate_xmit\w*|\w*qdisc\w*|\w*pfifo\w*|\w*dev_hard_start_xmit\w*|"
               r"eth_\w+|\w*gro\w*|\w*rps\w*|__netdev\w*|netdev\w*)$"),
    ("kernel other", r"^\[kernel\] "),
    # User space from here.
    ("scheduler", r"^\S+ (__)?sched_yield$"),
    ("syscalls, poll", r"^libc\S* (__poll|__libc_(recv|send)\w*|(__)?(recv|send)(msg|from|to)?|"
                       r"__GI___pthread_\w*cancel\w*|syscall|epoll_wait|__GI___poll|"
                       r"__futex\w*|__lll_lock_wait\w*|__lll_lock_wake\w*)$"),
    ("bench harness", r"(loom::bench::|std::__introsort|std::__insertion_sort|std::__sort|"
                      r"nlohmann::|__memcmp\w*|__strcmp\w*|std::nth_element)"),
    ("user copies", r"(^\S+ (__)?(memmove|memcpy|mempcpy)\w*|loom::comm::shm::streamCopy)"),
    ("reduction", r"(plainKernel|halfKernel|bf16\w*Kernel|divideLoop|divideHalf|"
                  r"loom::comm::\w+::\w*[Kk]ernel\b)"),
    ("waiting", r"(waitFor|waitCounter|spinWait|Backoff|backoff|cpuRelax|_mm_pause|"
                r"Request::wait|"
                r"loom::comm::\w*Engine::poll|waitAny|waitUntil|Event::wait)"),
    ("loom other", r"(^(loom-bench|libloom\S*) |^libc\S* (malloc|free|cfree|_int_\w+|"
                   r"__vdso_clock_gettime|clock_gettime)|^\[vdso\] )"),
]
COMPILED = [(name, re.compile(pattern)) for name, pattern in CLASSES]
# In order of first appearance (the user-space rules reuse kernel-side class names).
CLASS_NAMES = list(dict.fromkeys([name for name, _ in CLASSES] + ["other"]))

SHM_SERIES = {
    # targets.py's column -> (environment, extra loom-bench flags, name in the output)
    "loom÷mpi shm": ({"LOOM_SHM": "1"}, [], "shm staged"),
    "window÷mpi shm": ({"LOOM_SHM": "1"}, ["-R", "1"], "shm window"),
    "tuned÷mpi shm": ({"LOOM_SHM": "1"}, [], "shm tuned"),
}
OPS = {"all-reduce": "all_reduce", "all-gather": "all_gather", "broadcast": "broadcast",
       "reduce-scatter": "reduce_scatter"}


def classify(line):
    """A line of `perf report --stdio -n --sort dso,sym`, '12.5%  1234  [kernel.kallsyms]  [k]
    _copy_from_iter' (the sample count optional) -> (value, class, symbol), value being the
    sample count where the line has one, else the percentage; None for other lines."""
    m = re.match(r"^\s*([\d.]+)%\s+(?:(\d+)\s+)?(\S+)\s+\[(.)\]\s+(.*?)\s*$", line)
    if not m:
        return None
    value = float(m.group(2)) if m.group(2) else float(m.group(1))
    dso, kind, sym = m.group(3), m.group(4), m.group(5)
    dso = "[kernel]" if kind == "k" or dso.startswith("[kernel") else os.path.basename(dso)
    # Compiler clones: "finish_task_switch.isra.0" is finish_task_switch.
    sym = re.sub(r"(\.(isra|part|constprop|cold|lto_priv)\.?\d*)+$", "", sym)
    key = f"{dso} {sym}"
    for name, pattern in COMPILED:
        if pattern.search(key):
            return value, name, sym
    return value, "other", sym


def short(symbol):
    """'void loom::comm::avx2::plainKernel<float, loom::comm::Sum>(void*, ...)' ->
    'loom::comm::avx2::plainKernel<float, Sum>': no return type, arguments or namespaces
    inside template arguments."""
    name = symbol.split("(")[0]
    if name.startswith("void ") or name.startswith("int ") or name.startswith("bool "):
        name = name.split(" ", 1)[1]
    return re.sub(r"(?<=[<, ])(\w+::)+", "", name)


def cells_to_profile(median_md):
    """The distinct (op, ranks, size, transport, series) cells below some target, with the
    targets each misses."""
    with open(median_md) as f:
        _, misses, _ = targets.evaluate(f.read().splitlines())
    cells = {}
    for target, ms in misses.items():
        shm = "shm" in target or "vader" in target
        for m in ms:
            series = m["series"] if shm else "tcp"
            key = (m["op"], m["ranks"], m["bytes"], m["size"], series)
            shown = f"{m['best']:.2f}x" if m["best"] is not None else "no figure"
            entry = cells.setdefault(key, {"below": [], "per_call": seconds_per_call(
                m["op"], m["ranks"], m["bytes"], m["cells"].get(SERIES_COLUMN.get(series)))})
            entry["below"].append(f"{target}: {shown}")
    return cells


# The table's column of each profiled series.
SERIES_COLUMN = {"tcp": "loom tcp", "loom÷mpi shm": "loom shm",
                 "window÷mpi shm": "loom shm window", "tuned÷mpi shm": "loom shm tuned"}


def seconds_per_call(op, ranks, nbytes, figure):
    """A call's time from the table's figure: µs below 64 KiB, busbw GB/s from 64 KiB
    (nccl-tests' bus factors). None when there is no figure."""
    try:
        value = float(figure.split()[0])
    except (AttributeError, ValueError, IndexError):
        return None
    if value <= 0:
        return None
    if nbytes < targets.MIN_BYTES:
        return value * 1e-6
    factor = {"all-reduce": 2 * (ranks - 1) / ranks, "broadcast": 1.0}.get(
        op, (ranks - 1) / ranks)
    return nbytes * factor / (value * 1e9)


def iterations(per_call, nbytes, seconds):
    """About `seconds` of timed calls, so that loom-bench's setup (allocating and filling the
    buffers) stays a small share; without a figure, a pessimistic 0.5 GB/s."""
    if per_call is None:
        per_call = max(50e-6, nbytes / 0.5e9)
    return max(10, min(200000, int(seconds / per_call)))


def per_call_us(output, nbytes):
    """The in-place time column of loom-bench's row for nbytes."""
    for line in output.splitlines():
        fields = line.split()
        if len(fields) > 12 and fields[0] == str(nbytes):
            try:
                return float(fields[9])
            except ValueError:
                return None
    return None


def profile(cell, per_call, args, tmp):
    op, ranks, nbytes, _, series = cell
    env = dict(os.environ)
    flags = []
    if series == "tcp":
        env["LOOM_SHM"] = "0"
    else:
        extra_env, flags, _ = SHM_SERIES.get(series, SHM_SERIES["loom÷mpi shm"])
        env.update(extra_env)
        if series == "tuned÷mpi shm":
            tuning = os.path.join(os.path.dirname(os.path.abspath(args.table)),
                                  f"tuning_n{ranks}.txt")
            if os.path.exists(tuning):
                env["LOOM_TUNING_FILE"] = tuning
    # loom-bench times the size out of place, then in place: half the time each. Two runs, the
    # second with n calls more than the first: the difference of their samples, symbol by
    # symbol, is what those n calls cost, with the setup (starting the ranks, allocating,
    # first-touching and filling the buffers) cancelled out.
    n = iterations(per_call, nbytes, args.seconds / 2)
    short_n = max(2, n // 4)
    samples = []
    output = ""
    for calls in (short_n, short_n + n):
        data = os.path.join(tmp, "perf.data")
        cmd = ["perf", "record", "-a", "-e", "cpu-clock", "-F", "999", "-q", "-o", data, "--",
               os.path.join(args.build, "bin", "loom-run"), "--nproc-per-node", str(ranks),
               os.path.join(args.build, "bin", "loom-bench"), "--op", OPS[op], "-b",
               str(nbytes), "-e", str(nbytes), "-n", str(calls), "-w", "2", "-c", "0"] + flags
        if args.dry_run:
            settings = [f"{k}={env[k]}" for k in ("LOOM_SHM", "LOOM_TUNING_FILE") if k in env]
            print(" ".join(settings + cmd))
            continue
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if run.returncode != 0:
            return {"error": f"exit {run.returncode}: {(run.stderr or run.stdout)[-300:]}"}
        output = run.stdout
        report = subprocess.run(["perf", "report", "-i", data, "--stdio", "--no-children", "-n",
                                 "--sort", "dso,sym"], capture_output=True, text=True,
                                timeout=900)
        counts = {}
        for line in report.stdout.splitlines():
            c = classify(line)
            if c:
                counts[(c[2], c[1])] = counts.get((c[2], c[1]), 0.0) + c[0]
        samples.append(counts)
    if args.dry_run:
        return None
    diff = {k: max(0.0, v - samples[0].get(k, 0.0)) for k, v in samples[1].items()}
    total = sum(diff.values()) or 1.0
    shares = {name: 0.0 for name in CLASS_NAMES}
    for (sym, name), v in diff.items():
        shares[name] += 100.0 * v / total
    symbols = sorted(((100.0 * v / total, short(sym), name) for (sym, name), v in diff.items()),
                     reverse=True)
    busy = [x for x in symbols if x[2] != "idle"]
    return {"us": per_call_us(output, nbytes), "shares": shares, "top": busy[:3]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("table", help="DIR/median.md of a scripts/peers.sh run")
    parser.add_argument("--build", default=os.environ.get("LOOM_BUILD_DIR", "build"))
    parser.add_argument("--seconds", type=float, default=3.0, help="per cell, about")
    parser.add_argument("--only", help="profile only cells whose 'op, N ranks SIZE' has this")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = parser.parse_args()
    if not args.dry_run and shutil.which("perf") is None:
        sys.exit("profile_cells.py: perf is not installed (Debian: linux-perf)")
    for tool in ("loom-run", "loom-bench"):
        if not os.access(os.path.join(args.build, "bin", tool), os.X_OK):
            sys.exit(f"profile_cells.py: {args.build}/bin/{tool} is missing: build first "
                     f"(scripts/build.sh) or pass --build")
    cells = cells_to_profile(args.table)
    if args.only:
        cells = {k: v for k, v in cells.items() if args.only in f"{k[0]}, {k[1]} ranks {k[3]}"}
    if not cells:
        print("No cell is below target.")
        return
    shown = list(CLASS_NAMES)
    if not args.dry_run:
        print("Shares of both CPUs' cpu-clock samples (`perf record -a`) that the cell's extra "
              "calls cost: a run with n more calls minus a shorter one, symbol by symbol, so "
              "that the setup cancels out. Out-of-place and in-place calls together.\n")
        print("| cell | series | below | us per call | " + " | ".join(shown) +
              " | heaviest symbols |")
        print("|---|---|---|---:|" + "---:|" * len(shown) + "---|")
    order = sorted(cells, key=lambda k: (k[4] != "tcp", k[0], k[1], k[2]))
    with tempfile.TemporaryDirectory() as tmp:
        for cell in order:
            op, ranks, _, size, series = cell
            name = "tcp" if series == "tcp" else SHM_SERIES.get(series, (0, 0, series))[2]
            result = profile(cell, cells[cell]["per_call"], args, tmp)
            if result is None:
                continue
            head = f"| {op}, {ranks} ranks {size} | {name} | {'; '.join(cells[cell]['below'])} |"
            if "error" in result:
                print(f"{head} failed: {result['error']} |" + " |" * len(shown))
                continue
            us = f"{result['us']:.1f}" if result["us"] is not None else "?"
            parts = [f"{result['shares'][c]:.0f}%" for c in shown]
            top = ", ".join(f"{s} {p:.1f}%" for p, s, _ in result["top"])
            print(f"{head} {us} | " + " | ".join(parts) + f" | {top} |", flush=True)


if __name__ == "__main__":
    main()
