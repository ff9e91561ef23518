#!/usr/bin/env bash
# Elastic training across "hosts" (issue 22): three network namespaces h0..h2, each with one veth
# to a bridge in a "switch" namespace, on the private subnet 10.213.9.0/24 (it exists only inside
# these namespaces). The switch namespace holds the bridge's address and runs loom-store with
# --data-dir, so the store belongs to no host. One `loom-run --nnodes 2:3 --rdzv-endpoint` per
# host trains loom-train (DDP, checkpoints every 25 steps, --resume).
#   1. The three hosts form a round of world size 3.
#   2. Every process of h2 (its agent and its workers) is SIGKILLed. h0 and h1 form a new round
#      of world size 2 and loom-train goes on from the last checkpoint.
#   3. A new agent started in h2 is taken into the next round: its worker starts with world
#      size 3, and the three hosts train to the last step and exit 0.
# The workers run through a wrapper that appends "host=.. round=.. rank=.. world=.." to a file
# before it execs loom-train: the test reads the rounds from there. loom-train sleeps 10 ms after
# every step (--test-step-delay-ms, a test-only flag), so the job is still running when the new
# agent arrives, however fast the machine is.
#
# Usage: elastic_netns_test.sh LOOM_RUN LOOM_STORE LOOM_TRAIN
# Exits 0 on success, 1 on failure, 77 (ctest SKIP_RETURN_CODE) with a one-line reason when it
# cannot run here (not root, no `ip netns`). Namespaces are named lne<pid>-* and removed on every
# exit path (trap).
set -uo pipefail

LOOM_RUN=$1
STORE=$2
TRAIN=$3
source "$(dirname "$0")/netns_lib.sh"
netns_setup elastic_netns_test "lne$$"
STEPS=1200
SUBNET=10.213.9


show_logs() {
  local f
  for f in "$TMP"/store.log "$TMP"/agent-*.log "$TMP"/starts; do
    [[ -f $f ]] || continue
    echo "--- $(basename "$f")"
    cat "$f"
  done
}

fail() {
  echo "FAIL: $*"
  show_logs
  exit 1
}

run() {
  "$@" || fail "command failed: $*"
}

# The switch: a bridge with the store's address. Hosts h0..h2: eth0 = $SUBNET.(10+i)/24.
STORE_ADDR="$SUBNET.1"
STORE_PORT=29400
netns_switch_hosts 3 "$STORE_ADDR"

ip netns exec "${P}-sw" "$STORE" --host "$STORE_ADDR" --port "$STORE_PORT" \
  --data-dir "$TMP/store" >"$TMP/store.log" 2>&1 &
BG_PIDS+=($!)
# Every host reaches the store (bounded: a broken bridge fails here and says so).
for h in 0 1 2; do
  ok=0
  for _ in $(seq 100); do
    if ip netns exec "${P}-h$h" timeout 2 bash -c "exec 3<>/dev/tcp/$STORE_ADDR/$STORE_PORT" 2>/dev/null; then
      ok=1
      break
    fi
    sleep 0.1
  done
  [[ $ok == 1 ]] || fail "h$h cannot reach the store at $STORE_ADDR:$STORE_PORT"
done

cat >"$TMP/worker.sh" <<EOF
#!/bin/sh
echo "host=\$LOOM_TEST_HOST round=\$LOOM_RESTART_COUNT rank=\$RANK world=\$WORLD_SIZE" >>"$TMP/starts"
exec "$TRAIN" "\$@"
EOF
chmod +x "$TMP/worker.sh"
touch "$TMP/starts"

declare -A AGENT
# start_agent HOST TAG: one elastic loom-run in namespace h<HOST>, output in agent-TAG.log.
start_agent() {
  ip netns exec "${P}-h$1" env -u LOOM_HOST LOOM_TEST_HOST="h$1" LOOM_AUTOGRAD_THREADS=1 \
    timeout -k 5 240 "$LOOM_RUN" --nnodes 2:3 --nproc-per-node 1 \
    --rdzv-endpoint "$STORE_ADDR:$STORE_PORT" --run-id elastic --node-timeout-s 5 \
    --rdzv-last-call-s 1 --rdzv-timeout-s 60 --grace-period-s 2 --max-restarts 0 \
    --redirect-prefix -- "$TMP/worker.sh" --in 8 --hidden 16 --classes 4 --batch 4 \
    --samples 1200 --steps "$STEPS" --checkpoint-dir "$TMP/ckpt" --checkpoint-every 25 --resume \
    --log "$TMP/loss.csv" --test-step-delay-ms 10 >"$TMP/agent-$2.log" 2>&1 &
  AGENT[$2]=$!
  BG_PIDS+=($!)
}

# round_of HOSTS WORLD AFTER: the first round after AFTER in which exactly HOSTS (e.g. "h0 h1")
# started workers, all with WORLD_SIZE=WORLD; empty when none yet.
round_of() {
  awk -v hosts="$1" -v world="$2" -v after="$3" '
    { for (i = 1; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
      r = f["round"] + 0
      if (r <= after) next
      seen[r] = 1; hs[r, f["host"]] = 1; n[r]++
      if (f["world"] != world) bad[r] = 1 }
    END {
      want = split(hosts, h, " ")
      best = -1
      for (r in seen) {
        ok = !(r in bad) && n[r] == want
        for (i = 1; i <= want; i++) ok = ok && ((r, h[i]) in hs)
        if (ok && (best < 0 || r + 0 < best)) best = r + 0
      }
      if (best >= 0) print best
    }' "$TMP/starts"
}

# wait_round HOSTS WORLD AFTER SECONDS: prints the round (see round_of), or fails.
wait_round() {
  local r
  for _ in $(seq $((${4} * 10))); do
    r=$(round_of "$1" "$2" "$3")
    if [[ -n $r ]]; then
      echo "$r"
      return 0
    fi
    sleep 0.1
  done
  return 1
}

echo "== three hosts"
start=$SECONDS
for h in 0 1 2; do start_agent "$h" "h$h"; done
first=$(wait_round "h0 h1 h2" 3 -1 90) || fail "the three hosts never formed a round of world size 3"
echo "round $first: h0, h1, h2, world size 3"
# A checkpoint exists before the host goes (bounded wait).
for _ in $(seq 600); do
  [[ -f $TMP/ckpt/checkpoint.safetensors ]] && break
  sleep 0.1
done
[[ -f $TMP/ckpt/checkpoint.safetensors ]] || fail "no checkpoint within 60 s"

echo "== h2 is killed (its agent and its workers)"
for _ in $(seq 100); do
  pids=$(ip netns pids "${P}-h2")
  [[ -z $pids ]] && break
  # shellcheck disable=SC2086
  kill -KILL $pids 2>/dev/null
  sleep 0.05
done
[[ -z $(ip netns pids "${P}-h2") ]] || fail "processes left in h2: $(ip netns pids "${P}-h2")"
wait "${AGENT[h2]}" 2>/dev/null
second=$(wait_round "h0 h1" 2 "$first" 90) ||
  fail "h0 and h1 never formed a round of world size 2 after h2 was killed"
echo "round $second: h0, h1, world size 2"
# They go on from the last checkpoint: round $second's rank 0 says where it resumed (round 0
# started fresh, so the first such line of h0 and h1 is this round's), and its loss log grows two
# checkpoints past that step (bounded wait).
resumed_at() {  # resumed_at LOG...: every "resumed from ... at step N" step, in order
  cat "$@" 2>/dev/null | grep -o "resumed from $TMP/ckpt/checkpoint.safetensors at step [0-9]*" |
    awk '{print $NF}'
}
resume2=""
for _ in $(seq 600); do
  resume2=$(resumed_at "$TMP/agent-h0.log" "$TMP/agent-h1.log" | head -n 1)
  [[ -n $resume2 ]] && break
  sleep 0.1
done
[[ -n $resume2 && $resume2 -gt 0 ]] || fail "round $second did not resume from a checkpoint past step 0"
for _ in $(seq 600); do
  logged=$(tail -n 1 "$TMP/loss.csv" | cut -d, -f1)
  [[ $logged =~ ^[0-9]+$ && $logged -ge $((resume2 + 50)) ]] && break
  sleep 0.1
done
[[ $logged =~ ^[0-9]+$ && $logged -ge $((resume2 + 50)) ]] ||
  fail "round $second resumed at step $resume2 but did not get 50 steps further within 60 s"
echo "round $second resumed at step $resume2 and trained on (step $logged logged)"

echo "== a new agent in h2"
start_agent 2 h2-rejoin
third=$(wait_round "h0 h1 h2" 3 "$second" 90) ||
  fail "the rejoining agent in h2 was not taken into a round of world size 3 after round $second"
echo "round $third: h0, h1, h2 again, world size 3"

rc_all=0
for tag in h0 h1 h2-rejoin; do
  wait "${AGENT[$tag]}"
  rc=$?
  echo "agent $tag exited $rc"
  [[ $rc == 0 ]] || rc_all=1
done
echo "== took $((SECONDS - start)) s"
[[ $rc_all == 0 ]] || fail "an agent of the last round did not exit 0"

# loom-train resumed from a checkpoint in the round after the kill and in the one after the
# rejoin; the last round went on from a checkpoint of the two-host round (past its resume step).
count=0
latest=0
for s in $(resumed_at "$TMP"/agent-*.log); do
  [[ $s -gt 0 && $((s % 25)) == 0 ]] || fail "resumed at step $s: expected a checkpoint step > 0"
  count=$((count + 1))
  [[ $s -gt $latest ]] && latest=$s
done
[[ $count -ge 2 ]] || fail "loom-train resumed $count time(s); expected at least 2 (after the kill, after the rejoin)"
[[ $latest -ge $((resume2 + 50)) ]] ||
  fail "the last round resumed at step $latest, not from the two-host round's checkpoints (>= $((resume2 + 50)))"
# The loss log holds every step once (the rows past each resume step were dropped and trained
# again) and reaches the last step.
[[ $(tail -n +2 "$TMP/loss.csv" | cut -d, -f1 | tr '\n' ' ') == "$(seq -s ' ' 1 "$STEPS") " ]] ||
  fail "the loss log does not hold steps 1..$STEPS once each: $(tail -n +2 "$TMP/loss.csv" | cut -d, -f1 | uniq -c | awk '$1 != 1' | head -n 5 | tr '\n' ' ')"
grep -q "loom-train: world 3, " "$TMP"/agent-*.log || fail "the last round's rank 0 did not report world 3"
# No round after the rejoin lost a host: the job ended in round $third or later with 3 hosts.
last_round=$(awk '{ split($2, kv, "="); if (kv[2] + 0 > m) m = kv[2] + 0 } END { print m }' "$TMP/starts")
[[ -n $(round_of "h0 h1 h2" 3 $((last_round - 1))) ]] ||
  fail "the last round ($last_round) was not h0, h1, h2 with world size 3"

show_logs | tail -n 40
echo "PASS: elastic loom-run across namespaces: a host lost, the others went on from round $second, the new host joined in round $third"
