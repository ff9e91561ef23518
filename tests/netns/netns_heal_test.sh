#!/usr/bin/env bash
# Connections that heal, across hosts: two "hosts", each a network namespace, joined by one
# veth pair (10.213.9.1 and 10.213.9.2), two loom-train ranks on each (shared memory within a
# host, tcp between the hosts). Every run trains the same MLP from the same seed and logs its
# per-step losses (loom-train --log); each must finish with the losses of the undisturbed run:
#   1. undisturbed;
#   2. link_down: h0's end of the link goes down for 3 s mid-training, then up again (TCP may
#      not even see a reset: the transfers stall, and nothing of Loom's may kill the job);
#   3. kill: mid-training, h1's tcp connections to h0's transport listeners (ephemeral ports;
#      the stores listen below that range) are destroyed for real (`ss -K`: a reset on both
#      ends): the transport re-establishes them and resends (the log says "re-established");
#   4. kill_no_heal: the same with LOOM_TCP_RECONNECT_MS=0 must fail the job: the kill does
#      reach the transport's connections (a control for 3).
#
# Usage: netns_heal_test.sh LOOM_RUN LOOM_TRAIN
# Exits 0 on success, 1 on failure, 77 (ctest SKIP_RETURN_CODE) with a one-line reason when it
# cannot run here (not root, no `ip netns`). `ss -K` needs the kernel's CONFIG_INET_DIAG_DESTROY
# (step 3 fails saying it killed nothing without it). Namespaces are named lnh<pid>-* and
# removed on every exit path.
set -uo pipefail

LOOM_RUN=$1
LOOM_TRAIN=$2
source "$(dirname "$0")/netns_lib.sh"
netns_setup netns_heal_test "lnh$$" ss
SUBNET=10.213.9

fail() {
  echo "FAIL: $*"
  exit 1
}

run() {
  "$@" || fail "command failed: $*"
}

netns_add_first "${P}-h0"
NAMESPACES+=("${P}-h0")
run ip netns add "${P}-h1"
NAMESPACES+=("${P}-h1")
run ip link add "${P}a" type veth peer name "${P}b"
run ip link set "${P}a" netns "${P}-h0"
run ip link set "${P}b" netns "${P}-h1"
for h in 0 1; do
  ns="${P}-h$h"
  dev="${P}a"
  [[ $h == 1 ]] && dev="${P}b"
  run ip -n "$ns" link set "$dev" name eth0
  run ip -n "$ns" addr add "$SUBNET.$((1 + h))/24" dev eth0
  run ip -n "$ns" link set eth0 up
  run ip -n "$ns" link set lo up
done
probe=$(ip netns exec "${P}-h1" timeout 5 bash -c "exec 3<>/dev/tcp/$SUBNET.1/9" 2>&1)
[[ $probe == *"refused"* ]] || fail "h1 cannot reach h0: the test network did not come up ($probe)"

MASTER="$SUBNET.1"
STEPS=3000
TRAIN=("$LOOM_TRAIN" --steps "$STEPS" --in 32 --hidden 256,256 --classes 10 --batch 64
  --samples 4096 --seed 7)

# Each job's bound: 150 s, times LOOM_TEST_TIMEOUT_SCALE in a sanitizer build (ctest sets it).
JOB_LIMIT_S=$((150 * ${LOOM_TEST_TIMEOUT_SCALE:-1}))

# start_job NAME PORT [VAR=VALUE...]: one loom-run per host in the background; the losses go to
# $TMP/NAME.csv (rank 0, on h0), the output of host h to $TMP/NAME-h<h>.log.
JOB_PIDS=()
start_job() {
  local name=$1 port=$2 h
  shift 2
  JOB_PIDS=()
  for h in 0 1; do
    ip netns exec "${P}-h$h" env -u LOOM_HOST "$@" timeout -k 5 "$JOB_LIMIT_S" \
      "$LOOM_RUN" --nnodes 2 --node-rank "$h" --nproc-per-node 2 --master-addr "$MASTER" \
      --master-port "$port" --run-id "$name" --redirect-prefix \
      "${TRAIN[@]}" --log "$TMP/$name.csv" >"$TMP/$name-h$h.log" 2>&1 &
    JOB_PIDS+=($!)
    BG_PIDS+=($!)
  done
}

# wait_job NAME EXPECT: waits for both hosts; EXPECT is 0 or nonzero (per host).
wait_job() {
  local name=$1 expect=$2 i rc ok=1
  for i in 0 1; do
    wait "${JOB_PIDS[$i]}"
    rc=$?
    echo "$rc" >"$TMP/$name-h$i.rc"
    if [[ $expect == 0 && $rc -ne 0 ]] || [[ $expect == nonzero && $rc -eq 0 ]]; then
      echo "host h$i: loom-run exited $rc, expected $expect"
      ok=0
    fi
  done
  for i in 0 1; do
    echo "--- $name h$i (exit $(cat "$TMP/$name-h$i.rc"))"
    grep -v '^\[rank [0-9]\] step ' "$TMP/$name-h$i.log" | tail -n 40
  done
  [[ $ok == 1 ]] || fail "$name"
}

# Waits (bounded) until rank 0 printed a step line: training is under way.
wait_training() {
  local name=$1
  for _ in $(seq 1200); do
    grep -q '^\[rank 0\] step ' "$TMP/$name-h0.log" 2>/dev/null && return 0
    sleep 0.05
  done
  fail "$name: training did not start within 60 s"
}

same_losses() {
  local name=$1
  [[ -s $TMP/$name.csv ]] || fail "$name: no loss log"
  [[ $(wc -l <"$TMP/$name.csv") -eq $((STEPS + 1)) ]] ||
    fail "$name: $(wc -l <"$TMP/$name.csv") lines in the loss log, expected $((STEPS + 1))"
  cmp -s "$TMP/undisturbed.csv" "$TMP/$name.csv" || {
    diff "$TMP/undisturbed.csv" "$TMP/$name.csv" | head -n 10
    fail "$name: the losses differ from the undisturbed run's"
  }
  echo "$name: the same $STEPS losses as the undisturbed run"
}

# Destroys the tcp connections of h1's ranks to h0's transport listeners (ephemeral ports, but
# not the workers' store, which loom-run also puts on one: h0's log names it); prints how many.
kill_transport_connections() {
  local name=$1 store
  store=$(grep -o "workers' MASTER_PORT [0-9]*" "$TMP/$name-h0.log" | grep -o '[0-9]*$')
  [[ -n $store ]] || fail "$name: h0's loom-run did not say the workers' MASTER_PORT"
  ip netns exec "${P}-h1" ss -K -t -n state established dst "$MASTER" \
    "( dport >= :32768 and dport != :$store )" | tail -n +2 | wc -l
}

# Fails unless rank 0 is still training (its last step line is not the last step).
still_training() {
  local name=$1 what=$2
  if grep -q "^\[rank 0\] step $STEPS/$STEPS " "$TMP/$name-h0.log"; then
    fail "$name: training had finished before $what (raise STEPS)"
  fi
}

# 1. Undisturbed.
echo "== undisturbed"
start=$SECONDS
start_job undisturbed 29701
wait_job undisturbed 0
echo "== undisturbed took $((SECONDS - start)) s"

# 2. The link goes down for 3 s mid-training.
echo "== link_down"
start=$SECONDS
start_job link_down 29711
wait_training link_down
still_training link_down "the link went down"
run ip -n "${P}-h0" link set eth0 down
echo "link down at $((SECONDS - start)) s"
sleep 3
run ip -n "${P}-h0" link set eth0 up
echo "link up at $((SECONDS - start)) s"
wait_job link_down 0
same_losses link_down
echo "== link_down took $((SECONDS - start)) s"

# 3. The cross-host transport connections are killed mid-training.
echo "== kill"
start=$SECONDS
start_job kill 29721
wait_training kill
still_training kill "the connections were killed"
killed=$(kill_transport_connections kill)
echo "killed $killed connection(s) at $((SECONDS - start)) s"
[[ $killed -ge 1 ]] || fail "kill: no transport connection to kill (ss -K found none)"
wait_job kill 0
same_losses kill
grep -q "re-established" "$TMP/kill-h0.log" "$TMP/kill-h1.log" ||
  fail "kill: no rank says it re-established a connection"
echo "== kill took $((SECONDS - start)) s"

# 4. The same kill with healing off fails the job (the kill reaches the transport).
echo "== kill_no_heal"
start=$SECONDS
start_job kill_no_heal 29731 LOOM_TCP_RECONNECT_MS=0
wait_training kill_no_heal
still_training kill_no_heal "the connections were killed"
killed=$(kill_transport_connections kill_no_heal)
echo "killed $killed connection(s) at $((SECONDS - start)) s"
wait_job kill_no_heal nonzero
echo "== kill_no_heal took $((SECONDS - start)) s"

echo "PASS: netns heal tests"
