#!/usr/bin/env bash
# Build containers/Dockerfile.cpu and singularity/hpcring.def with podman, and run them.
#
#   ci/build-image.sh build       install podman if missing, make the base image, build localhost/hpcring:cpu
#   ci/build-image.sh build-def   convert singularity/hpcring.def (ci/def2oci.py) and build it FROM that image
#                                 as localhost/hpcring:sif (entry point = the .def's %runscript, like a .sif)
#   ci/build-image.sh build-mpijob  build containers/Dockerfile.mpijob FROM that image (adds sshd) as
#                                 localhost/hpcring:mpijob, the image of the MPIJob pods (Kubernetes)
#   ci/build-image.sh smoke       a 2-rank allreduce in the image and the .def's %test (no network)
#   ci/build-image.sh all         build + build-def + build-mpijob + smoke (default)
#   ci/build-image.sh podman ARGS...   podman with this script's storage and settings, e.g.
#                                 ci/build-image.sh podman run --rm --network none localhost/hpcring:cpu hpcring doctor
#   ci/build-image.sh reset       delete the podman storage this script uses
#
# Made for CI machines without a Docker engine or registry access (root, Debian, network only to the Debian
# mirror and PyPI): the base image is bootstrapped from the Debian mirror with mmdebstrap (the same bookworm
# and python3 3.11 as debian:bookworm-slim; faster than debootstrap, as apt downloads in parallel: timings in
# docs/dev/containers.md) and passed in with --build-arg BASE; pip inside the build uses the host's pip configuration (its
# local wheel directories and indexes are mounted read-only, its CA bundle too, for TLS-intercepting proxies).
# Nothing is baked into the image that the build did not install.
#
# Environment:
#   HPCRING_PODMAN_DIR   podman storage + config (default /var/tmp/hpcring-podman; `reset` deletes it)
#   HPCRING_IMAGE        image tag (default localhost/hpcring:cpu)
#   HPCRING_DEF_IMAGE    tag of the image built from the .def (default localhost/hpcring:sif)
#   HPCRING_MPIJOB_MPI   build-mpijob: MPI wheel of the MPIJob image (default: the CPU image's Open MPI; mpich)
#   HPCRING_MPIJOB_IMAGE tag of the MPIJob image (default localhost/hpcring:mpijob, or ...:mpijob-mpich)
#   HPCRING_DEBIAN_MIRROR  Debian mirror for the base (default: the first URI in /etc/apt/sources.list.d/debian.sources)
#   HPCRING_IMAGE_TORCH_INDEX  extra index for torch (default: the Dockerfile's, or the host's first local index)
#   HPCRING_BUILD_OPTS   extra `podman build` options for the image, e.g. --no-cache (split on spaces)
set -euo pipefail

cd "$(dirname "$0")/.."
DIR=${HPCRING_PODMAN_DIR:-/var/tmp/hpcring-podman}
IMAGE=${HPCRING_IMAGE:-localhost/hpcring:cpu}
DEF_IMAGE=${HPCRING_DEF_IMAGE:-localhost/hpcring:sif}
BASE=localhost/debian:bookworm
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3

log() { printf '[build-image %(%T)T] %s\n' -1 "$*" >&2; }

# podman with storage under $DIR. Only --root/--runroot: naming a storage driver explicitly makes every
# `podman run` wait for conmon on this kind of host (docs/dev/containers.md). runc, not crun: crun refuses hybrid cgroup v1/v2 hosts;
# rlimits at or below the caller's hard limits (root here lacks CAP_SYS_RESOURCE).
pm() { CONTAINERS_CONF="$DIR/containers.conf" podman --root "$DIR/storage" --runroot "$DIR/runroot" "$@"; }

setup() {
  if [ "$(id -u)" != 0 ]; then
    echo "$0: needs root (apt-get, rootful podman); uid is $(id -u)" >&2
    exit 1
  fi
  local missing=()
  for tool in podman runc mmdebstrap; do command -v "$tool" >/dev/null || missing+=("$tool"); done
  # netavark + aardvark-dns: podman networks with DNS for container names and aliases (the MPIJob pod test);
  # netavark sets a network's NAT and forwarding rules with iptables, which a minimal Debian lacks.
  [ -x /usr/lib/podman/netavark ] || missing+=(netavark aardvark-dns)
  command -v iptables >/dev/null || missing+=(iptables)
  if [ ${#missing[@]} -gt 0 ]; then
    log "apt-get install ${missing[*]}"
    local t0=$SECONDS
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends podman runc mmdebstrap \
      uidmap fuse-overlayfs netavark aardvark-dns iptables >/dev/null
    log "installed podman $(podman --version | awk '{print $3}') in $((SECONDS - t0)) s"
  fi
  mkdir -p "$DIR"
  local nofile
  nofile=$(ulimit -Hn)
  [ "$nofile" = unlimited ] && nofile=65536
  [ "$nofile" -gt 65536 ] && nofile=65536
  cat >"$DIR/containers.conf" <<EOF
# written by ci/build-image.sh
[containers]
default_ulimits = ["nofile=${nofile}:${nofile}", "nproc=32768:32768"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
[network]
network_backend = "netavark"
EOF
}

mirror() {
  if [ -n "${HPCRING_DEBIAN_MIRROR:-}" ]; then
    echo "$HPCRING_DEBIAN_MIRROR"
    return
  fi
  local uri
  uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

base_image() {
  if pm image exists "$BASE"; then
    log "base $BASE present"
    return
  fi
  local tarball="$DIR/bookworm.tar" t0=$SECONDS
  log "mmdebstrap bookworm from $(mirror)"
  mmdebstrap --variant=minbase bookworm "$tarball" "$(mirror)" >"$DIR/mmdebstrap.log" 2>&1 ||
    { tail -20 "$DIR/mmdebstrap.log" >&2; rm -f "$tarball"; exit 1; }
  pm import "$tarball" "$BASE" >/dev/null
  rm -f "$tarball"
  log "base $BASE made in $((SECONDS - t0)) s"
}

# pip options and read-only mounts that give the build the host's pip sources (local wheel dirs, file://
# indexes, the CA bundle). Printed as NUL-separated words: --opt value ... then a lone "--" then mounts.
pip_sources() {
  "$PY" - <<'EOF'
import os, subprocess, sys
out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
conf = {}
for line in out.splitlines():
    key, _, value = line.partition("=")
    conf[key.split(".", 1)[-1]] = value.strip().strip("'")
args, mounts = [], set()
def local(path):
    path = path[len("file://"):] if path.startswith("file://") else path
    if os.path.isabs(path) and os.path.exists(path):
        mounts.add(path.rstrip("/").rsplit("/simple", 1)[0] if path.rstrip("/").endswith("/simple") else path)
        return True
    return False
for key, opt in (("index-url", "--index-url"), ("extra-index-url", "--extra-index-url"), ("find-links", "--find-links")):
    for value in conf.get(key, "").split():
        if value.startswith("http") or local(value):
            args += [opt, value]
if conf.get("cert") and os.path.exists(conf["cert"]):
    args += ["--cert", "/run/host-ca.crt"]
    mounts.add(conf["cert"] + ":/run/host-ca.crt")
print(" ".join(args))
for m in sorted(mounts):
    print(m if ":" in m else f"{m}:{m}")
EOF
}

build() {
  setup
  base_image
  local sources pip_args torch_index
  sources=$(pip_sources)
  pip_args=$(head -1 <<<"$sources")
  local vols=()
  while read -r m; do [ -n "$m" ] && vols+=(-v "$m:ro"); done < <(tail -n +2 <<<"$sources")
  # A local index that serves torch keeps pip away from download.pytorch.org (unreachable on CI).
  torch_index=${HPCRING_IMAGE_TORCH_INDEX:-$(grep -o 'file://[^ ]*' <<<"$pip_args" | head -1 || true)}
  local targs=()
  [ -n "$torch_index" ] && targs=(--build-arg "TORCH_INDEX=$torch_index")
  log "podman build $IMAGE (pip: ${pip_args:-defaults})"
  local t0=$SECONDS
  # docker format: OCI image config has no SHELL, and podman would drop ours (pipefail).
  local opts=()
  read -r -a opts <<<"${HPCRING_BUILD_OPTS:-}"
  pm build --format docker --network host "${opts[@]}" "${vols[@]}" --build-arg "BASE=$BASE" --build-arg "HPCRING_PIP_ARGS=$pip_args" \
    "${targs[@]}" --ignorefile containers/.dockerignore -f containers/Dockerfile.cpu -t "$IMAGE" .
  log "built $IMAGE in $((SECONDS - t0)) s: $(pm image inspect --format '{{.Size}}' "$IMAGE" | numfmt --to=iec) "
}

# The .def as podman sees it: ci/def2oci.py lays out /.singularity.d as apptainer would, FROM the Docker image.
# Final user 1000 (the image's `hpc`): apptainer runs as the calling user, never as root.
build_def() {
  setup
  local ctx="$DIR/def-context" t0=$SECONDS
  pm image exists "$IMAGE" || { echo "$0: $IMAGE not built yet: run '$0 build' first" >&2; exit 1; }
  "$PY" ci/def2oci.py --arg "IMAGE=$IMAGE" --run-as 1000:1000 singularity/hpcring.def "$ctx" >/dev/null
  # %post installs nothing, so the build needs no network.
  pm build --format docker --network none -f "$ctx/Containerfile" -t "$DEF_IMAGE" "$ctx"
  log "built $DEF_IMAGE from singularity/hpcring.def in $((SECONDS - t0)) s"
}

# The MPIJob pods' image: the CPU image plus sshd (apt from the base's Debian mirror, hence the host network);
# HPCRING_MPIJOB_MPI=mpich swaps its MPI wheel (pip with the host's sources, as in build). Its context is
# containers/ alone: the Dockerfile copies nothing.
build_mpijob() {
  setup
  local t0=$SECONDS mpi=${HPCRING_MPIJOB_MPI:-}
  local tag=${HPCRING_MPIJOB_IMAGE:-localhost/hpcring:mpijob${mpi:+-$mpi}}
  pm image exists "$IMAGE" || { echo "$0: $IMAGE not built yet: run '$0 build' first" >&2; exit 1; }
  local sources vols=()
  sources=$(pip_sources)
  while read -r m; do [ -n "$m" ] && vols+=(-v "$m:ro"); done < <(tail -n +2 <<<"$sources")
  pm build --format docker --network host "${vols[@]}" --build-arg "BASE_IMAGE=$IMAGE" --build-arg "MPI=$mpi" \
    --build-arg "HPCRING_PIP_ARGS=$(head -1 <<<"$sources")" -f containers/Dockerfile.mpijob -t "$tag" containers
  log "built $tag from containers/Dockerfile.mpijob in $((SECONDS - t0)) s"
}

smoke() {
  setup
  local t0=$SECONDS
  # 2 ranks, no network: Open MPI wires up over loopback and shared memory, as on one node.
  pm run --rm --network none "$IMAGE" hpcring run -np 2 -- python -c '
import numpy as np, hpcring
hpcring.init()
x = hpcring.allreduce(np.full(1000, hpcring.rank() + 1.0), algorithm="ring")
assert (x == 3.0).all(), x[:4]
print(f"rank {hpcring.rank()}/{hpcring.size()} allreduce ok in the image", flush=True)
'
  if pm image exists "$DEF_IMAGE"; then
    pm run --rm --network none --entrypoint /.singularity.d/actions/test "$DEF_IMAGE"
  fi
  log "smoke run in $((SECONDS - t0)) s"
}

case "${1:-all}" in
  build) build ;;
  build-def) build_def ;;
  build-mpijob) build_mpijob ;;
  smoke) smoke ;;
  all) build; build_def; build_mpijob; smoke ;;
  podman) shift; setup; pm "$@" ;;
  reset)
    if [ -d "$DIR" ]; then pm system reset -f >/dev/null 2>&1 || true; rm -rf "$DIR"; fi ;;
  *) echo "usage: $0 [build|build-def|build-mpijob|smoke|all|reset|podman ARGS...]" >&2; exit 2 ;;
esac
