#!/usr/bin/env bash
# Fake multi-node cluster for tests and benchmarks: N network namespaces act as N "nodes".
#
#   ci/netns-cluster.sh up N [RATE]   create nodes n1..nN (10.200.0.i/24) on one bridge; RATE (e.g. 1gbit)
#                                     caps every node's link in both directions with tbf
#   ci/netns-cluster.sh down [N]      remove them (all nodes with the prefix when N is omitted); also kills
#                                     processes still running inside them
#   ci/netns-cluster.sh status        list nodes, addresses, qdiscs and byte counters
#
# Why namespaces: one kernel, but each node has its own IP stack, so MPI traffic between "nodes" crosses a real
# TCP link (veth -> bridge -> veth) that we can count and shape. The bridge lives in its own namespace
# ("<prefix>fabric") so the host's root namespace, routing and firewall are never touched.
# Each node resolves the others by name through /etc/netns/<node>/hosts (bind-mounted by `ip netns exec`).
# Run commands on a node with ci/on-node; MPI launchers reach remote nodes through ci/netns-rsh.
#
# Environment:
#   HPCRING_NETNS_PREFIX  node-name prefix (default "n"): a second cluster with another prefix can coexist.
#   HPCRING_NETNS_SUBNET  first three octets of the node addresses (default 10.200.0).
# The kernel on CI has no netem: only tbf/htb shape traffic, so RATE is a tbf rate with a short latency (5 ms)
# so that ACKs do not queue behind bulk data when both directions are busy.
set -euo pipefail

PREFIX=${HPCRING_NETNS_PREFIX:-n}
SUBNET=${HPCRING_NETNS_SUBNET:-10.200.0}
FABRIC="${PREFIX}fabric"

usage() {
  echo "usage: $0 up N [RATE] | down [N] | status" >&2
  echo "  N: number of nodes (1..250); RATE: a tc rate such as 1gbit or 500mbit" >&2
  exit 2
}

need_root() {
  if [ "$(id -u)" != 0 ]; then
    echo "$0: needs root (network namespaces); current uid is $(id -u)" >&2
    exit 1
  fi
  command -v ip >/dev/null || { echo "$0: 'ip' (iproute2) not found" >&2; exit 1; }
}

check_count() {
  case "$1" in
    '' | *[!0-9]*) echo "$0: N must be a number, got '$1'" >&2; usage ;;
  esac
  if [ "$1" -lt 1 ] || [ "$1" -gt 250 ]; then
    echo "$0: N must be between 1 and 250, got $1" >&2
    usage
  fi
}

ns_exists() { ip netns list | awk '{print $1}' | grep -qx "$1"; }

# Kill whatever still runs inside a namespace: `ip netns del` only drops the name, and a leftover mpiexec
# would keep the node's addresses alive (and its ports bound) into the next `up`.
kill_ns_pids() {
  local pids
  pids=$(ip netns pids "$1" 2>/dev/null || true)
  [ -z "$pids" ] && return 0
  # shellcheck disable=SC2086  # word splitting of the pid list is intended
  kill -TERM $pids 2>/dev/null || true
  sleep 0.2
  pids=$(ip netns pids "$1" 2>/dev/null || true)
  # shellcheck disable=SC2086
  [ -n "$pids" ] && kill -KILL $pids 2>/dev/null || true
}

# Node namespaces of this prefix that exist now.
nodes() { ip netns list | awk '{print $1}' | grep -E "^${PREFIX}[0-9]+$" | sort -V || true; }

down() {
  local n=${1:-} i node list
  if [ -n "$n" ]; then
    list=$(for ((i = 1; i <= n; i++)); do echo "${PREFIX}${i}"; done)
  else
    list=$(nodes)
  fi
  for node in $list; do
    if ns_exists "$node"; then
      kill_ns_pids "$node"
      ip netns del "$node"
    fi
    rm -rf "/etc/netns/${node}"
  done
  if ns_exists "$FABRIC"; then
    ip netns del "$FABRIC"
  fi
}

# tbf needs a burst of at least rate/HZ; 256 KiB covers 1 Gbit/s at HZ=100 and a 64 KiB GSO packet.
shape() {
  local ns=$1 dev=$2 rate=$3
  ip netns exec "$ns" tc qdisc replace dev "$dev" root tbf rate "$rate" burst 256kb latency 5ms
}

hosts_file() {
  local n=$1 i
  printf '127.0.0.1 localhost\n'
  for ((i = 1; i <= n; i++)); do
    printf '%s.%d %s%d\n' "$SUBNET" "$i" "$PREFIX" "$i"
  done
}

up() {
  local n=$1 rate=${2:-} i node port hosts
  # Idempotent: whatever a previous (possibly crashed) run left behind is removed first.
  down "$n"
  # A failure half-way must not leave namespaces behind.
  trap 'echo "$0: up failed, tearing down" >&2; down "$n"' ERR
  ip netns add "$FABRIC"
  ip -n "$FABRIC" link add br0 type bridge
  ip -n "$FABRIC" link set br0 up
  hosts=$(hosts_file "$n")
  for ((i = 1; i <= n; i++)); do
    node="${PREFIX}${i}"
    port="p${i}"
    # /etc/netns/<node>/hosts must exist before the first `ip netns exec`, which bind-mounts it over /etc/hosts.
    mkdir -p "/etc/netns/${node}"
    printf '%s\n' "$hosts" >"/etc/netns/${node}/hosts"
    ip netns add "$node"
    ip link add eth0 netns "$node" type veth peer name "$port" netns "$FABRIC"
    ip -n "$FABRIC" link set "$port" master br0 up
    ip -n "$node" addr add "${SUBNET}.${i}/24" dev eth0
    ip -n "$node" link set lo up
    ip -n "$node" link set eth0 up
    if [ -n "$rate" ]; then
      shape "$node" eth0 "$rate"     # node -> fabric (what the node sends)
      shape "$FABRIC" "$port" "$rate" # fabric -> node (what the node receives)
    fi
  done
  trap - ERR
  echo "up: ${n} nodes ${PREFIX}1..${PREFIX}${n} on ${SUBNET}.0/24${rate:+, ${rate} each way}"
}

status() {
  local node
  if ! ns_exists "$FABRIC"; then
    echo "no cluster (namespace ${FABRIC} absent)"
    return 0
  fi
  for node in $(nodes); do
    echo "== ${node}: $(ip -n "$node" -br addr show dev eth0 2>/dev/null)"
    ip -n "$node" -s link show dev eth0 | sed -n '/RX:/,$p'
    ip netns exec "$node" tc qdisc show dev eth0
  done
}

main() {
  [ $# -ge 1 ] || usage
  case "$1" in
    up)
      [ $# -ge 2 ] && [ $# -le 3 ] || usage
      check_count "$2"
      need_root
      up "$2" "${3:-}"
      ;;
    down)
      [ $# -le 2 ] || usage
      [ $# -eq 1 ] || check_count "$2"
      need_root
      down "${2:-}"
      ;;
    status)
      need_root
      status
      ;;
    *) usage ;;
  esac
}

main "$@"
