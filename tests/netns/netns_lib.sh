# Shared by the network-namespace tests (sourced, not run): skip and the exit code ctest reads as
# "skipped", the checks that this machine can run them, and the bookkeeping that removes every
# namespace and process a test made, on every exit path.
#
#   source "$(dirname "$0")/netns_lib.sh"
#   netns_setup NAME PREFIX [TOOL...]   # root, ip, timeout and each TOOL, else exit 77 with why;
#                                       # sets P=PREFIX, TMP (a fresh directory), NAMESPACES=()
#                                       # and BG_PIDS=() and installs the cleanup traps
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

netns_setup() {
  local name=$1 tool
  P=$2
  shift 2
  [[ $(id -u) -eq 0 ]] || skip "needs root to create network namespaces"
  for tool in ip timeout "$@"; do
    command -v "$tool" >/dev/null || skip "$tool ($(netns_package_of "$tool")) is not installed"
  done
  TMP=$(mktemp -d)
  NAMESPACES=()
  BG_PIDS=()
  trap netns_cleanup EXIT
  # shellcheck disable=SC2064  # the name is fixed now, on purpose
  trap "echo '$name: interrupted'; exit 1" INT TERM HUP
}
