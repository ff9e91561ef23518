#!/usr/bin/env bash
# Multi-host test of loom-run: two or three "hosts", each a network namespace with one veth to a
# bridge in a "switch" namespace, on the private subnet 10.213.7.0/24 (which exists only inside
# these namespaces; nothing is sent anywhere else). One loom-run per host with --nnodes; the
# workers (netns_worker) check their environment, their hosts, and all-reduce, broadcast and
# all-gather across the hosts.
#
# Link conditions. The kernel has no netem, so:
#   - rate: `tc tbf` on h1's link, both directions (egress of h1's veth and of the switch port);
#   - delay: user space. A node reaches the rendezvous store through delay_proxy (a TCP
#     forwarder that holds every chunk for --delay-ms each way), via loom-run --rdzv-endpoint.
#
# Usage: netns_test.sh LOOM_RUN NETNS_WORKER DELAY_PROXY
# Exits 0 on success, 1 on failure, 77 (ctest SKIP_RETURN_CODE) with a one-line reason when
# it cannot run here (not root, no `ip netns`). Namespaces are named lnt<pid>-* and removed on
# every exit path (trap).
set -uo pipefail

LOOM_RUN=$1
WORKER=$2
PROXY=$3
SKIP=77

skip() {
  echo "SKIP: $*"
  exit $SKIP
}

[[ $(id -u) -eq 0 ]] || skip "needs root to create network namespaces"
command -v ip >/dev/null || skip "ip (iproute2) is not installed"
command -v tc >/dev/null || skip "tc (iproute2) is not installed"
command -v timeout >/dev/null || skip "timeout (coreutils) is not installed"

P="lnt$$"
SUBNET=10.213.7
TMP=$(mktemp -d)
NAMESPACES=()
BG_PIDS=()

cleanup() {
  local pid ns
  for pid in "${BG_PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  for ns in "${NAMESPACES[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'echo "netns_test: interrupted"; exit 1' INT TERM HUP

ip netns add "${P}-sw" 2>/dev/null || skip "'ip netns add' failed (no permission or no netns support)"
NAMESPACES+=("${P}-sw")

fail() {
  echo "FAIL: $*"
  exit 1
}

run() {
  "$@" || fail "command failed: $*"
}

# Switch namespace with a bridge; hosts h0..h2 each with eth0 = $SUBNET.(10+i)/24.
run ip -n "${P}-sw" link set lo up
run ip -n "${P}-sw" link add br0 type bridge
run ip -n "${P}-sw" link set br0 up
for h in 0 1 2; do
  ns="${P}-h$h"
  run ip netns add "$ns"
  NAMESPACES+=("$ns")
  run ip link add "${P}a$h" type veth peer name "${P}b$h"
  run ip link set "${P}a$h" netns "$ns"
  run ip link set "${P}b$h" netns "${P}-sw"
  run ip -n "$ns" link set "${P}a$h" name eth0
  run ip -n "$ns" addr add "$SUBNET.$((10 + h))/24" dev eth0
  run ip -n "$ns" link set eth0 up
  run ip -n "$ns" link set lo up
  run ip -n "${P}-sw" link set "${P}b$h" master br0
  run ip -n "${P}-sw" link set "${P}b$h" up
done

# h1's link: 200 Mbit/s each way.
run ip netns exec "${P}-h1" tc qdisc add dev eth0 root tbf rate 200mbit burst 256kb latency 100ms
run ip netns exec "${P}-sw" tc qdisc add dev "${P}b1" root tbf rate 200mbit burst 256kb latency 100ms

# The hosts see each other (a bounded check, so a broken bridge fails here and says so).
for h in 1 2; do
  ip netns exec "${P}-h0" ping -c 1 -W 2 "$SUBNET.$((10 + h))" >/dev/null 2>&1 ||
    fail "h0 cannot ping h$h ($SUBNET.$((10 + h))): the test network did not come up"
done

MASTER="$SUBNET.10"
PORT=29500

# start_proxy HOST LISTEN_PORT DELAY_MS: on HOST, 127.0.0.1:LISTEN_PORT -> MASTER:PORT.
start_proxy() {
  ip netns exec "${P}-h$1" "$PROXY" --listen "127.0.0.1:$2" --target "$MASTER:$PORT" \
    --delay-ms "$3" --max-seconds 100 >"$TMP/proxy-h$1.log" 2>&1 &
  BG_PIDS+=($!)
}

# run_job NAME NNODES NPROC EXPECT HOSTS... -- LOOM_RUN_FLAGS... -- PROGRAM...
# Per-host extra loom-run flags come from EXTRA_h<i>. Starts one loom-run per listed host,
# waits for all (each bounded by `timeout`), and checks each exit code against EXPECT
# ("0" or "nonzero").
run_job() {
  local name=$1 nnodes=$2 nproc=$3 expect=$4
  shift 4
  local hosts=()
  while [[ $1 != -- ]]; do hosts+=("$1"); shift; done
  shift
  local flags=()
  while [[ $1 != -- ]]; do flags+=("$1"); shift; done
  shift
  local program=("$@")
  echo "== $name"
  local start=$SECONDS pids=() h extra
  for h in "${hosts[@]}"; do
    extra="EXTRA_h$h"
    # shellcheck disable=SC2086
    ip netns exec "${P}-h$h" env LOOM_TEST_HOST="h$h" timeout -k 5 60 \
      "$LOOM_RUN" --nnodes "$nnodes" --node-rank "$h" --nproc-per-node "$nproc" \
      --master-addr "$MASTER" --master-port "$PORT" --run-id "$name" --redirect-prefix \
      "${flags[@]}" ${!extra:-} "${program[@]}" >"$TMP/$name-h$h.log" 2>&1 &
    pids+=($!)
    BG_PIDS+=($!)
  done
  local ok=1 i rc
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    rc=$?
    h=${hosts[$i]}
    if [[ $expect == 0 && $rc -ne 0 ]] || [[ $expect == nonzero && $rc -eq 0 ]]; then
      echo "host h$h: loom-run exited $rc, expected $expect"
      ok=0
    fi
    echo "$rc" >"$TMP/$name-h$h.rc"
  done
  for h in "${hosts[@]}"; do
    echo "--- h$h (exit $(cat "$TMP/$name-h$h.rc"))"
    cat "$TMP/$name-h$h.log"
  done
  echo "== $name took $((SECONDS - start)) s"
  [[ $ok == 1 ]] || fail "$name"
}

expect_in() {  # expect_in NAME HOST TEXT
  grep -qF -- "$3" "$TMP/$1-h$2.log" || fail "$1: h$2's output lacks '$3'"
}

# 1. Two hosts x two workers; h1 is rate-limited and reaches the store through a 20 ms proxy.
start_proxy 1 29601 20
EXTRA_h1="--rdzv-endpoint 127.0.0.1:29601"
run_job two_hosts 2 2 0 0 1 -- -- "$WORKER" --nnodes 2 --nproc-per-node 2
for r in 0 1 2 3; do expect_in two_hosts $((r / 2)) "[rank $r] rank $r: hosts, all-reduce"; done

# 2. Three hosts x one worker; h2 through a 40 ms proxy, h1 rate-limited.
start_proxy 2 29602 40
EXTRA_h1=""
EXTRA_h2="--rdzv-endpoint 127.0.0.1:29602"
PORT=29510
run_job three_hosts 3 1 0 0 1 2 -- -- "$WORKER" --nnodes 3 --nproc-per-node 1
for r in 0 1 2; do expect_in three_hosts "$r" "[rank $r] rank $r: hosts, all-reduce"; done

# 3. A node that never arrives: the others fail, naming it.
EXTRA_h2=""
PORT=29520
run_job missing_node 3 1 nonzero 0 1 -- --rdzv-timeout-s 3 -- "$WORKER" --nnodes 3 --nproc-per-node 1
expect_in missing_node 0 "node(s) 2 of 3 never arrived"
expect_in missing_node 1 "node(s) 2 of 3 never arrived"

# 4. A worker failing on one host stops the job on every host, naming rank and code.
PORT=29530
run_job remote_failure 2 1 nonzero 0 1 -- --grace-period-s 2 -- \
  sh -c 'if [ "$RANK" = 1 ]; then exit 7; fi; sleep 50'
expect_in remote_failure 1 "rank 1 (local rank 0) exited with code 7"
expect_in remote_failure 0 "node 1: rank 1 (local rank 0) exited with code 7"
[[ $(cat "$TMP/remote_failure-h1.rc") == 7 ]] || fail "remote_failure: h1 should exit 7"

echo "PASS: netns multi-host tests"
