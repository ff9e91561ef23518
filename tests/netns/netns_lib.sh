# Shared by the network-namespace tests (sourced, not run): skip and the exit code ctest reads as
# "skipped", the checks that this machine can run them, and the bookkeeping that removes every
# namespace and process a test made, on every exit path.
#
#   source "$(dirname "$0")/netns_lib.sh"
#   netns_setup NAME PREFIX [TOOL...]   # root, ip, timeout and each TOOL, else exit 77 with why;
#                                       # sets P=PREFIX, TMP (a fresh directory), NAMESPACES=()
#                                       # and BG_PIDS=() and installs the cleanup traps
#   netns_switch_hosts N [ADDR]         # after the test defines run (fail on error): see below
#   netns_add_first NS                  # the first namespace, or skip with ip's reason
# Then append every namespace made to NAMESPACES and every background pid to BG_PIDS.

SKIP=77

skip() {
  echo "SKIP: $*"
  exit $SKIP
}

netns_package_of() {
  case $1 in
    ip | tc | ss) echo iproute2 ;;
    timeout) echo coreutils ;;
    *) echo "a Debian package" ;;
  esac
}

netns_cleanup() {
  local pid ns left
  for pid in "${BG_PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  # Kill everything still running inside our namespaces, until nothing is (at most ~5 s).
  for _ in $(seq 100); do
    left=""
    for ns in "${NAMESPACES[@]}"; do
      for pid in $(ip netns pids "$ns" 2>/dev/null); do
        kill -KILL "$pid" 2>/dev/null
        left+=" $pid"
      done
    done
    [[ -z $left ]] && break
    sleep 0.05
  done
  for ns in "${NAMESPACES[@]}"; do ip netns del "$ns" 2>/dev/null; done
  rm -rf "$TMP"
}

# netns_sweep_stale: a run killed outright (SIGKILL: a timeout's, or a user's) never reaches its
# EXIT trap and leaves its namespaces, and whatever ran in them, behind. Every test names its
# namespaces ln<letter><its pid>-..., so a namespace whose pid is gone, or is this shell's own
# (this run has made none yet), is such a leftover: its processes are killed and it is removed.
# Without this a later run that draws the same pid could not make its namespaces ("File
# exists"), and leftovers would pile up.
netns_sweep_stale() {
  local ns pid
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    [[ $ns =~ ^ln[a-z]([0-9]+)- ]] || continue
    pid=${BASH_REMATCH[1]}
    if [[ $pid != "$$" ]] && kill -0 "$pid" 2>/dev/null; then continue; fi
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
    if ip netns del "$ns" 2>/dev/null; then
      echo "netns: removed $ns, left by a run that was killed"
    fi
  done
}

# netns_add_first NS: the test's first namespace; if it cannot be made the test skips, saying
# what ip said (no permission, no netns support). Later namespaces use run (a failure fails).
netns_add_first() {
  local err
  err=$(ip netns add "$1" 2>&1) || skip "'ip netns add $1' failed: ${err:-no message}"
}

netns_setup() {
  local name=$1 tool
  P=$2
  shift 2
  [[ $(id -u) -eq 0 ]] || skip "needs root to create network namespaces"
  for tool in ip timeout "$@"; do
    command -v "$tool" >/dev/null || skip "$tool ($(netns_package_of "$tool")) is not installed"
  done
  netns_sweep_stale
  TMP=$(mktemp -d)
  NAMESPACES=()
  BG_PIDS=()
  trap netns_cleanup EXIT
  # shellcheck disable=SC2064  # the name is fixed now, on purpose
  trap "echo '$name: interrupted'; exit 1" INT TERM HUP
}

# netns_switch_hosts N [ADDR]: a switch namespace ${P}-sw holding a bridge br0 (with ADDR/24 on
# it when given) and hosts ${P}-h0 .. ${P}-h<N-1>, each with eth0 = $SUBNET.(10+h)/24 plugged
# into the bridge. Skips when no namespace can be made at all; any later step that fails goes
# through the test's run (its fail).
netns_switch_hosts() {
  local n=$1 addr=${2:-} h ns
  netns_add_first "${P}-sw"
  NAMESPACES+=("${P}-sw")
  run ip -n "${P}-sw" link set lo up
  run ip -n "${P}-sw" link add br0 type bridge
  if [[ -n $addr ]]; then run ip -n "${P}-sw" addr add "$addr/24" dev br0; fi
  run ip -n "${P}-sw" link set br0 up
  for ((h = 0; h < n; h++)); do
    ns="${P}-h$h"
    run ip netns add "$ns"
    NAMESPACES+=("$ns")
    attach_host "$h" eth0 br0 "$SUBNET" "${P}a$h" "${P}b$h"
    run ip -n "$ns" link set lo up
  done
}

# attach_host H IFNAME BRIDGE SUBNET VETH_HOST VETH_SWITCH: a veth pair from host H's namespace,
# named IFNAME there with address SUBNET.(10+H)/24, to BRIDGE in the switch namespace; both ends
# up.
attach_host() {
  local h=$1 ifname=$2 bridge=$3 subnet=$4 a=$5 b=$6
  run ip link add "$a" type veth peer name "$b"
  run ip link set "$a" netns "${P}-h$h"
  run ip link set "$b" netns "${P}-sw"
  run ip -n "${P}-h$h" link set "$a" name "$ifname"
  run ip -n "${P}-h$h" addr add "$subnet.$((10 + h))/24" dev "$ifname"
  run ip -n "${P}-h$h" link set "$ifname" up
  run ip -n "${P}-sw" link set "$b" master "$bridge"
  run ip -n "${P}-sw" link set "$b" up
}
