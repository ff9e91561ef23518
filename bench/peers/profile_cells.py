#!/usr/bin/env python3
"""Profiles every cell of a peers table that misses one of issue 19's targets: where the time
of Loom's series in that cell goes.

For each cell below target (targets.py's evaluate(): tcp below 1.5x Gloo or 1.2x Open MPI,
shared memory below 1.5x vader, the 8-byte all-reduce slower than Open MPI) it runs Loom's
series of that cell alone (loom-run + loom-bench at that one size, about --seconds long,
results not checked) under `perf record -a` (cpu-clock samples of both CPUs, kernel included),
and sorts the samples into classes by symbol:

  socket copies   the kernel's copies between user memory and socket buffers
  tcp/ip          the rest of the TCP/IP stack, loopback delivery, socket locks and accounting
  syscalls, poll  syscall entry and exit, poll/epoll/futex, the file table
  scheduler       context switches, wake-ups, yields, timers
  page faults     faults and the zeroing of fresh pages
  user copies     memcpy/memmove in user space (Loom's staging, Open MPI's and Gloo's own)
  reduction       Loom's reduction kernels
  waiting         Loom's spin and wait loops (shared-memory flags, the progress loop)
  loom other      everything else in Loom (the issue path, bookkeeping)
  kernel other    kernel code in none of the classes above
  idle            no task ran on the CPU (every rank blocked)
  other           the rest (listed by the top symbol column)

The shared-memory cells profile the series that came closest (staged, window or tuned); the
tcp cells the built-in series. Prints a Markdown table: one row per cell, the per-call time
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
                  r"native_write_msr|native_apic\w*|x2apic\w*|kvm_\w+|pvclock\w*)$"),
    ("syscalls, poll", r"\[kernel\] (entry_SYSCALL\w*|\w*syscall\w*|__x64_sys_\w+|"
                       r"do_syscall_64|__fget\w*|fget\w*|__fdget\w*|fput\w*|do_poll\w*|"
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
    ("user copies", r"^\S+ (__)?(memmove|memcpy|mempcpy)\w*"),
    ("reduction", r"(plainKernel|halfKernel|bf16\w*Kernel|divideLoop|divideHalf|"
                  r"loom::comm::\w+::\w*[Kk]ernel\b)"),
    ("waiting", r"(waitFor|waitCounter|spinWait|Backoff|backoff|cpuRelax|_mm_pause|"
                r"Request::wait|"
                r"loom::comm::\w*Engine::poll|waitAny|waitUntil|Event::wait)"),
    ("loom other", r"^(loom-bench|libloom\S*) "),
]
COMPILED = [(name, re.compile(pattern)) for name, pattern in CLASSES]
CLASS_NAMES = [name for name, _ in CLASSES] + ["other"]

SHM_SERIES = {
    # targets.py's column -> (environment, extra loom-bench flags, name in the output)
    "loom÷mpi shm": ({"LOOM_SHM": "1"}, [], "shm staged"),
    "window÷mpi shm": ({"LOOM_SHM": "1"}, ["-R", "1"], "shm window"),
    "tuned÷mpi shm": ({"LOOM_SHM": "1"}, [], "shm tuned"),
}
OPS = {"all-reduce": "all_reduce", "all-gather": "all_gather", "broadcast": "broadcast",
       "reduce-scatter": "reduce_scatter"}


def classify(line):
    """'12.5%  [kernel.kallsyms]  [k] _copy_from_iter' -> (12.5, class, symbol), or None."""
    m = re.match(r"^\s*([\d.]+)%\s+(\S+)\s+\[(.)\]\s+(.*?)\s*$", line)
    if not m:
        return None
    share, dso, kind, sym = float(m.group(1)), m.group(2), m.group(3), m.group(4)
    dso = "[kernel]" if kind == "k" or dso.startswith("[kernel") else os.path.basename(dso)
    key = f"{dso} {sym}"
    for name, pattern in COMPILED:
        if pattern.search(key):
            return share, name, sym
    return share, "other", sym


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
            cells.setdefault(key, []).append(f"{target}: {shown}")
    return cells


def iterations(nbytes, seconds):
    """About `seconds` of calls at a pessimistic 0.5 GB/s (or 50 us per call when small)."""
    per_call = max(50e-6, nbytes / 0.5e9)
    return max(5, min(100000, int(seconds / per_call)))


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


def profile(cell, args, tmp):
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
    n = iterations(nbytes, args.seconds)
    data = os.path.join(tmp, "perf.data")
    cmd = ["perf", "record", "-a", "-e", "cpu-clock", "-F", "999", "-q", "-o", data, "--",
           os.path.join(args.build, "bin", "loom-run"), "--nproc-per-node", str(ranks),
           os.path.join(args.build, "bin", "loom-bench"), "--op", OPS[op], "-b", str(nbytes),
           "-e", str(nbytes), "-n", str(n), "-w", str(max(2, n // 20)), "-c", "0"] + flags
    if args.dry_run:
        settings = [f"{k}={env[k]}" for k in ("LOOM_SHM", "LOOM_TUNING_FILE") if k in env]
        print(" ".join(settings + cmd))
        return None
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if run.returncode != 0:
        return {"error": f"exit {run.returncode}: {(run.stderr or run.stdout)[-300:]}"}
    report = subprocess.run(["perf", "report", "-i", data, "--stdio", "--no-children",
                             "--sort", "dso,sym", "--percent-limit", "0.05"],
                            capture_output=True, text=True, timeout=600)
    shares = {name: 0.0 for name in CLASS_NAMES}
    symbols = []
    for line in report.stdout.splitlines():
        c = classify(line)
        if c:
            shares[c[1]] += c[0]
            symbols.append((c[0], c[2], c[1]))
    symbols = [(p, short(sym), c) for p, sym, c in symbols]
    symbols.sort(reverse=True)
    busy = [s for s in symbols if s[2] != "idle"]
    return {"us": per_call_us(run.stdout, nbytes), "shares": shares, "top": busy[:3]}


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
        print("Shares of all cpu-clock samples of both CPUs while the cell ran alone under "
              "`perf record -a`.\n")
        print("| cell | series | below | us per call | " + " | ".join(shown) +
              " | heaviest symbols |")
        print("|---|---|---|---:|" + "---:|" * len(shown) + "---|")
    order = sorted(cells, key=lambda k: (k[4] != "tcp", k[0], k[1], k[2]))
    with tempfile.TemporaryDirectory() as tmp:
        for cell in order:
            op, ranks, _, size, series = cell
            name = "tcp" if series == "tcp" else SHM_SERIES.get(series, (0, 0, series))[2]
            result = profile(cell, args, tmp)
            if result is None:
                continue
            head = f"| {op}, {ranks} ranks {size} | {name} | {'; '.join(cells[cell])} |"
            if "error" in result:
                print(f"{head} failed: {result['error']} |" + " |" * len(shown))
                continue
            us = f"{result['us']:.1f}" if result["us"] is not None else "?"
            parts = [f"{result['shares'][c]:.0f}%" for c in shown]
            top = ", ".join(f"{s} {p:.1f}%" for p, s, _ in result["top"])
            print(f"{head} {us} | " + " | ".join(parts) + f" | {top} |", flush=True)


if __name__ == "__main__":
    main()
