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
# Usage: netns_test.sh LOOM_RUN NETNS_WORKER DELAY_PROXY [pg]
# ("pg": the worker was built with the ProcessGroup, so its collective checks must run too)
# Exits 0 on success, 1 on failure, 77 (ctest SKIP_RETURN_CODE) with a one-line reason when
# it cannot run here (not root, no `ip netns`). Namespaces are named lnt<pid>-* and removed on
# every exit path (trap).
set -uo pipefail

LOOM_RUN=$1
WORKER=$2
PROXY=$3
EXPECT_PG=${4:-}
source "$(dirname "$0")/netns_lib.sh"
netns_setup netns_test "lnt$$" tc
SUBNET=10.213.7
PROXY_PIDS=()

fail() {
  echo "FAIL: $*"
  exit 1
}

run() {
  "$@" || fail "command failed: $*"
}

# Switch namespace with a bridge; hosts h0..h2 each with eth0 = $SUBNET.(10+i)/24.
netns_switch_hosts 3

# h1's link: 200 Mbit/s each way.
run ip netns exec "${P}-h1" tc qdisc add dev eth0 root tbf rate 200mbit burst 256kb latency 100ms
run ip netns exec "${P}-sw" tc qdisc add dev "${P}b1" root tbf rate 200mbit burst 256kb latency 100ms

# The hosts see each other: a TCP connect from h0 to a closed port of h1/h2 must be refused
# (an answer), not time out (a bounded check, so a broken bridge fails here and says so).
for h in 1 2; do
  probe=$(ip netns exec "${P}-h0" timeout 5 bash -c "exec 3<>/dev/tcp/$SUBNET.$((10 + h))/9" 2>&1)
  [[ $probe == *"refused"* ]] ||
    fail "h0 cannot reach h$h ($SUBNET.$((10 + h))): the test network did not come up ($probe)"
done

MASTER="$SUBNET.10"
PORT=29500

# start_proxy HOST LISTEN_PORT DELAY_MS: on HOST, 127.0.0.1:LISTEN_PORT -> MASTER:PORT.
start_proxy() {
  ip netns exec "${P}-h$1" "$PROXY" --listen "127.0.0.1:$2" --target "$MASTER:$PORT" \
    --delay-ms "$3" --max-seconds 100 >"$TMP/proxy-h$1.log" 2>&1 &
  BG_PIDS+=($!)
  PROXY_PIDS+=($!)
  disown $!  # killed by cleanup or stop_proxies; no job-control chatter
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
    # LOOM_TEST_ADDR: the address loom-run must find for this host and pass on as LOOM_HOST
    # (the hosts share one hostname, which resolves outside the namespaces).
    ip netns exec "${P}-h$h" env -u LOOM_HOST LOOM_TEST_HOST="h$h" \
      LOOM_TEST_ADDR="${ADDR_SUBNET:-$SUBNET}.$((10 + h))" ${JOB_ENV:-} \
      timeout -k 5 60 "$LOOM_RUN" --nnodes "$nnodes" --node-rank "$h" --nproc-per-node "$nproc" \
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
if [[ -n ${EXPECT_PG:-} ]]; then
  for r in 0 1 2 3; do expect_in two_hosts $((r / 2)) "[rank $r] rank $r: all-reduce, broadcast, all-gather with the ProcessGroup ok"; done
fi

# 2. Three hosts x one worker; h2 through a 40 ms proxy, h1 rate-limited.
PORT=29510
start_proxy 2 29602 40
EXTRA_h1=""
EXTRA_h2="--rdzv-endpoint 127.0.0.1:29602"
run_job three_hosts 3 1 0 0 1 2 -- -- "$WORKER" --nnodes 3 --nproc-per-node 1
for r in 0 1 2; do expect_in three_hosts "$r" "[rank $r] rank $r: hosts, all-reduce"; done
if [[ -n ${EXPECT_PG:-} ]]; then
  for r in 0 1 2; do expect_in three_hosts "$r" "[rank $r] rank $r: all-reduce, broadcast, all-gather with the ProcessGroup ok"; done
fi

# The proxies are done: stop them, so that the lost_node check below sees an empty h1.
for pid in "${PROXY_PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null; done

# 3. A node that never arrives: the others fail, naming it.
EXTRA_h2=""
PORT=29520
run_job missing_node 3 1 nonzero 0 1 -- --rdzv-timeout-s 3 -- "$WORKER" --nnodes 3 --nproc-per-node 1
expect_in missing_node 0 "node(s) 2 of 3 never arrived"
expect_in missing_node 1 "node(s) 2 of 3 never arrived"

# 4. Node 0 never arrives: the others say they could not reach its store.
PORT=29540
run_job missing_master 2 1 nonzero 1 -- --rdzv-timeout-s 2 -- "$WORKER" --nnodes 2 --nproc-per-node 1
expect_in missing_master 1 "node 0's store at $MASTER:$PORT could not be reached"

# 5. A worker failing on one host stops the job on every host, naming rank and code.
PORT=29530
run_job remote_failure 2 1 nonzero 0 1 -- --grace-period-s 2 -- \
  sh -c 'if [ "$RANK" = 1 ]; then exit 7; fi; sleep 50'
expect_in remote_failure 1 "rank 1 (local rank 0) exited with code 7"
expect_in remote_failure 0 "node 1: rank 1 (local rank 0) exited with code 7"
[[ $(cat "$TMP/remote_failure-h1.rc") == 7 ]] || fail "remote_failure: h1 should exit 7"

# 6. --max-restarts across hosts: rank 1 fails in the first attempt; every node restarts
#    into a fresh rendezvous and the second attempt succeeds everywhere.
PORT=29550
run_job restart 2 1 0 0 1 -- --max-restarts 1 --grace-period-s 2 -- \
  sh -c 'if [ "$RANK" = 1 ] && [ "$LOOM_RESTART_COUNT" = 0 ]; then exit 5; fi
         if [ "$LOOM_RESTART_COUNT" = 0 ]; then sleep 50; fi; echo "attempt $LOOM_RESTART_COUNT ok"'
for h in 0 1; do
  expect_in restart "$h" "restart 1 of 1 after: node 1: rank 1 (local rank 0) exited with code 5"
  expect_in restart "$h" "generation 1: world size 2"
  expect_in restart "$h" "[rank $h] attempt 1 ok"
done

# 7. A node's loom-run is SIGKILLed: its workers die with it, and the other node notices the
#    missing heartbeat, stops its workers and fails naming it.
PORT=29560
echo "== lost_node"
start=$SECONDS
pids=()
for h in 0 1; do
  ip netns exec "${P}-h$h" env LOOM_TEST_HOST="h$h" timeout -k 5 60 \
    "$LOOM_RUN" --nnodes 2 --node-rank "$h" --nproc-per-node 1 --master-addr "$MASTER" \
    --master-port "$PORT" --run-id lost_node --node-timeout-s 3 --grace-period-s 2 \
    sh -c 'echo "rank $RANK up"; sleep 50' >"$TMP/lost_node-h$h.log" 2>&1 &
  pids+=($!)
  BG_PIDS+=($!)
done
disown "${pids[1]}"  # it is SIGKILLed on purpose; no job-control chatter
for _ in $(seq 200); do
  grep -q "rank 1 up" "$TMP/lost_node-h1.log" && break
  sleep 0.05
done
grep -q "rank 1 up" "$TMP/lost_node-h1.log" || fail "lost_node: h1's worker never started"
for pid in $(ip netns pids "${P}-h1"); do
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) == loom-run ]] && kill -KILL "$pid"
done
wait "${pids[0]}"
rc0=$?
cat "$TMP/lost_node-h0.log" "$TMP/lost_node-h1.log"
echo "== lost_node took $((SECONDS - start)) s"
[[ $rc0 -ne 0 ]] || fail "lost_node: h0 exited 0 after losing node 1"
expect_in lost_node 0 "node 1 sent no heartbeat for"
# Nothing of h1's job is left running in its namespace (bounded wait for the shepherd's grace).
for _ in $(seq 100); do
  [[ -z $(ip netns pids "${P}-h1") ]] && break
  sleep 0.05
done
[[ -z $(ip netns pids "${P}-h1") ]] || fail "lost_node: processes left on h1: $(ip netns pids "${P}-h1")"

# 8. Node 0's loom-run is SIGKILLed: the other node loses the store, stops its workers and
#    fails saying so.
PORT=29570
echo "== lost_master"
start=$SECONDS
pids=()
for h in 0 1; do
  ip netns exec "${P}-h$h" env LOOM_TEST_HOST="h$h" timeout -k 5 60 \
    "$LOOM_RUN" --nnodes 2 --node-rank "$h" --nproc-per-node 1 --master-addr "$MASTER" \
    --master-port "$PORT" --run-id lost_master --node-timeout-s 3 --grace-period-s 2 \
    sh -c 'echo "rank $RANK up"; sleep 50' >"$TMP/lost_master-h$h.log" 2>&1 &
  pids+=($!)
  BG_PIDS+=($!)
done
disown "${pids[0]}"
for _ in $(seq 200); do
  grep -q "rank 0 up" "$TMP/lost_master-h0.log" && grep -q "rank 1 up" "$TMP/lost_master-h1.log" && break
  sleep 0.05
done
for pid in $(ip netns pids "${P}-h0"); do
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) == loom-run ]] && kill -KILL "$pid"
done
wait "${pids[1]}"
rc1=$?
cat "$TMP/lost_master-h0.log" "$TMP/lost_master-h1.log"
echo "== lost_master took $((SECONDS - start)) s"
[[ $rc1 -ne 0 ]] || fail "lost_master: h1 exited 0 after losing node 0"
expect_in lost_master 1 "lost the rendezvous store at $MASTER:$PORT"

# 9. A second network (the "fabric"): each of h0 and h1 also has eth1 on 10.213.8.0/24, a bridge
# of its own. The store stays on eth0 (MASTER); LOOM_SOCKET_IFNAME=eth1 makes loom-run pass each
# host's eth1 address on as LOOM_HOST (the worker checks it against LOOM_TEST_ADDR), so the
# workers' transports listen and connect there, and the collectives run over eth1.
FABRIC=10.213.8
run ip -n "${P}-sw" link add br1 type bridge
run ip -n "${P}-sw" link set br1 up
for h in 0 1; do
  attach_host "$h" eth1 br1 "$FABRIC" "${P}c$h" "${P}d$h"
done
rx_before=$(ip netns exec "${P}-h1" cat /sys/class/net/eth1/statistics/rx_bytes)
ADDR_SUBNET=$FABRIC JOB_ENV="LOOM_SOCKET_IFNAME=eth1" \
  run_job fabric 2 1 0 0 1 -- -- "$WORKER" --nnodes 2 --nproc-per-node 1
for r in 0 1; do expect_in fabric "$r" "[rank $r] rank $r: hosts, all-reduce"; done
rx_after=$(ip netns exec "${P}-h1" cat /sys/class/net/eth1/statistics/rx_bytes)
# The collectives' bytes crossed eth1 (the worker's all-reduces move far more than this).
((rx_after - rx_before > 100000)) ||
  fail "fabric: h1's eth1 received only $((rx_after - rx_before)) bytes: the collectives did not use it"
# A spec that selects nothing is an error naming what the host has, on every node.
JOB_ENV="LOOM_SOCKET_IFNAME==eth9" \
  run_job fabric_bad 2 1 nonzero 0 1 -- --rdzv-timeout-s 5 -- "$WORKER" --nnodes 2 --nproc-per-node 1
expect_in fabric_bad 1 "LOOM_SOCKET_IFNAME='=eth9' selects no interface"

echo "PASS: netns multi-host tests"
