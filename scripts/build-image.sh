#!/usr/bin/env bash
# Builds the cephcsi image from the unmodified Dockerfile with podman, without a registry or a
# Docker daemon, and writes it as a docker-archive tar that `ctr -n k8s.io images import`,
# `docker load` and `podman load` accept.
#
#   scripts/build-image.sh [--output FILE] [--image NAME:TAG] [--base-output FILE] [--dry-run]
#
# Prints the tar's path on its last line of stdout (progress goes to stderr). --dry-run
# builds nothing and prints what it would use, as shell assignments (image=, base=, suite=,
# output=, packages=, runtime=), for harnesses and tests. Defaults:
#   --image   the image deploy/kustomization.yaml deploys (images: name cephcsi → newName:newTag),
#             fully qualified as the kubelet resolves it: cephcsi:0.1.0 → docker.io/library/cephcsi:0.1.0
#   --output  $CACHE/images/<name>-<tag>.tar
#   --base-output  none; if given, the base image (e.g. docker.io/library/debian:sid-20261030-slim) is
#             written there too as a docker-archive: deploy/examples/pvc-pod.yaml runs that
#             image, and a node without a registry needs it imported as well
# Environment:
#   CEPHCSI_CACHE   cache root (default ${XDG_CACHE_HOME:-~/.cache}/cephcsi), shared with
#                   tests/controlplane and tests/e2e
#   DEBIAN_MIRROR   Debian mirror for debootstrap (default: the first .../debian URI in
#                   /etc/apt/sources.list*, else http://deb.debian.org/debian)
#
# Steps, each cached outside the repository so a rerun costs seconds:
#   1. the base image named by the Dockerfile's FROM (ARG DEBIAN_IMAGE default, e.g.
#      debian:sid-20261030-slim), which no registry can give us here: `debootstrap
#      --variant=minbase` of the matching release (~1-3 min once), kept as a rootfs tar and
#      imported into podman under exactly that name. A sid base is the mirror's sid of the day
#      it is made (the log says which), kept until the cache is cleared. A mirror that is an
#      archive snapshot serves Release files past their Valid-Until (this machine's sid is one):
#      then, and only then, the base gets `Acquire::Check-Valid-Until "false"`, or apt-get
#      update in the Dockerfile would refuse the mirror;
#   2. `podman build` of the Dockerfile as it is, OCI format (podman's default; it ignores
#      SHELL, so this also proves the RUN lines are plain sh), layer cache on. pip inside the
#      build reaches PyPI through this machine's TLS-intercepting proxy, so it needs the host's
#      CA bundle: a read-only bind mount over the build's $HOME (/root, which the base image
#      has) holds the bundle and a ~/.config/pip/pip.conf naming it. Mounting over an existing
#      directory matters: podman/buildah leave an empty mount point behind in every stage's
#      layers for a target they had to create (/etc/pip.conf, /run/x), and no RUN line may
#      set PIP_CERT (`podman build --env` does not reach RUN). Nothing of it enters a layer
#      (checked in step 3). Consequence: RUN lines must not write to /root (none does);
#   3. checks inside the built image: the bindings and stubs import, cephcsi --version,
#      modprobe, rbd-fuse; no build-time CA or pip.conf left behind. Every Debian package of
#      the image and its version is written to <output>.packages, and what changed since the
#      previous build is logged (on sid, packages move between two builds of the same tree);
#   4. `podman save --format docker-archive`, skipped when the tar already holds this image id.
# Every rebuild after a source change leaves the previous layers behind as untagged images in
# podman's store (the layer cache); `podman image prune` reclaims them.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
CACHE_ROOT="${CEPHCSI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cephcsi}"
CACHE="$CACHE_ROOT/images"
HOST_CA="${HOST_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"

log() { printf '[build-image] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

output=""
image=""
base_output=""
dry_run=false
while (($#)); do
  case "$1" in
    --dry-run) dry_run=true; shift ;;
    --output) output=$2; shift 2 ;;
    --output=*) output=${1#*=}; shift ;;
    --image) image=$2; shift 2 ;;
    --image=*) image=${1#*=}; shift ;;
    --base-output) base_output=$2; shift 2 ;;
    --base-output=*) base_output=${1#*=}; shift ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done


# The name docker/containerd give an unqualified reference: cephcsi:0.1.0 → docker.io/library/cephcsi:0.1.0.
qualify() {
  local ref=$1 first=${1%%/*}
  if [[ $ref != */* ]]; then
    ref="docker.io/library/$ref"
  elif [[ $first != *.* && $first != *:* && $first != localhost ]]; then
    ref="docker.io/$ref"
  fi
  printf '%s\n' "$ref"
}

# The image deploy/ asks for: the kustomization's `images` entry for the manifests' `cephcsi`.
deploy_image() {
  awk '
    /^images:/ { inside = 1; next }
    inside && /^[^ #-]/ { inside = 0 }
    inside && /- name:/ { entry = ($3 == "cephcsi") }
    inside && entry && /newName:/ { name = $2 }
    inside && entry && /newTag:/ { tag = $2; gsub(/"/, "", tag) }
    END { if (name != "" && tag != "") print name ":" tag }
  ' "$REPO/deploy/kustomization.yaml"
}

# FROM of the unmodified Dockerfile: the default of ARG DEBIAN_IMAGE.
base_image() {
  sed -n 's/^ARG DEBIAN_IMAGE=\([^[:space:]]*\).*/\1/p' "$REPO/Dockerfile" | head -n1
}

debian_mirror() {
  if [[ -n ${DEBIAN_MIRROR:-} ]]; then printf '%s\n' "$DEBIAN_MIRROR"; return; fi
  local uri
  # deb822 "URIs:" lines and one-line "deb URI suite" entries, first .../debian archive wins.
  uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
    | awk '$1 == "URIs:" { for (i = 2; i <= NF; i++) print $i } $1 == "deb" { print ($2 ~ /^\[/ ? $3 : $2) }' \
    | grep -E '^https?://[^ ]+/debian/?$' | head -n1 || true)
  printf '%s\n' "${uri:-http://deb.debian.org/debian}"
}

security_mirror() {
  local uri
  uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
    | awk '$1 == "URIs:" { for (i = 2; i <= NF; i++) print $i } $1 == "deb" { print ($2 ~ /^\[/ ? $3 : $2) }' \
    | grep -E '^https?://[^ ]+/debian-security/?$' | head -n1 || true)
  printf '%s\n' "${uri:-http://deb.debian.org/debian-security}"
}

# Root here lacks CAP_SYS_RESOURCE, and podman's rootful defaults (nofile/nproc 1048576 and
# more) make runc fail with "error setting rlimits ... operation not permitted". Explicit
# limits no higher than this shell's avoid that; nproc is capped lower still because podman
# itself runs with a lower hard limit than its caller here.
ulimit_args() {
  local nofile nproc
  nofile=$(ulimit -Hn); [[ $nofile == unlimited ]] && nofile=1048576
  nproc=$(ulimit -Hu); [[ $nproc == unlimited || $nproc -gt 32768 ]] && nproc=32768
  printf '%s\n' --ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc"
}

# runc, not podman's default crun: crun 1.8 (bookworm) refuses hosts with cgroups in hybrid mode
# (v1 controllers plus a v2 mount, as here: "cgroups in hybrid mode not supported"), and runc is
# the runtime the node's containerd uses anyway. Any other runtime on the PATH is a fallback.
oci_runtime() {
  local name
  for name in runc crun; do
    command -v "$name" >/dev/null && { printf '%s\n' "$name"; return; }
  done
  die "neither runc nor crun is installed (scripts/setup.sh installs runc: scripts/packages.sh test)"
}

[[ -n $image ]] || image=$(deploy_image)
[[ -n $image ]] || die "cannot find the cephcsi image in deploy/kustomization.yaml; pass --image"
image=$(qualify "$image")
base=$(base_image)
[[ -n $base ]] || die "no 'ARG DEBIAN_IMAGE=' default in the Dockerfile"
base_q=$(qualify "$base")
case "$base" in
  debian:12*|debian:bookworm*) suite=bookworm ;;
  debian:13*|debian:trixie*) suite=trixie ;;
  debian:sid*|debian:unstable*) suite=sid ;;
  *) die "the Dockerfile's base $base is not a Debian 12/13/sid image this script can debootstrap" ;;
esac
name_tag=${image##*/}
[[ -n $output ]] || output="$CACHE/${name_tag/:/-}.tar"
mapfile -t ulimits < <(ulimit_args)

runtime=$(oci_runtime)
if $dry_run; then
  printf 'image=%q\nbase=%q\nsuite=%q\noutput=%q\npackages=%q\nruntime=%q\n' \
    "$image" "$base_q" "$suite" "$output" "$output.packages" "$runtime"
  exit 0
fi
for tool in podman debootstrap tar flock; do
  command -v "$tool" >/dev/null || die "$tool is not installed (scripts/setup.sh installs it: scripts/packages.sh test)"
done

mkdir -p "$CACHE" "$(dirname "$output")"
# One build at a time per cache (the e2e fixture and a developer may both run this).
exec 9>"$CACHE/.lock"
flock 9

started=$SECONDS
# ---- 1. base image ----------------------------------------------------------------------------
rootfs_tar="$CACHE/base-${base//[:\/@]/-}.tar"
if podman image exists "$base_q"; then
  log "base image $base_q: present"
else
  if [[ ! -s $rootfs_tar ]]; then
    mirror=$(debian_mirror)
    log "base image $base_q: debootstrap --variant=minbase $suite from $mirror (once, ~1-3 min)"
    t=$SECONDS
    rootfs=$(mktemp -d "$CACHE/rootfs.XXXXXX")
    trap 'rm -rf "$rootfs"' EXIT
    debootstrap --variant=minbase "$suite" "$rootfs" "$mirror" >"$CACHE/debootstrap.log" 2>&1 \
      || die "debootstrap $suite from $mirror failed (is the mirror reachable?): see $CACHE/debootstrap.log"
    # Sources as the official image has them (deb822: release, -updates, -security; sid has
    # neither of the last two), so `apt-get update` in the Dockerfile sees security fixes;
    # nothing downloaded stays.
    rm -f "$rootfs/etc/apt/sources.list"
    suites="$suite $suite-updates"
    [[ $suite != sid ]] || suites=sid
    cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $suites
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.pgp
EOF
    [[ $suite == sid ]] || cat >>"$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF

Types: deb
URIs: $(security_mirror)
Suites: $suite-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.pgp
EOF
    # debootstrap keeps the suite's Release file: its date says which sid this base is, and
    # its Valid-Until whether the mirror is a snapshot whose signatures apt would refuse.
    release_file=$(find "$rootfs/var/lib/apt/lists" -maxdepth 1 -name "*_dists_${suite}_*Release" | head -n1)
    [[ -n $release_file ]] || die "debootstrap left no Release file of $suite under $rootfs/var/lib/apt/lists"
    log "base image $base_q: the mirror's $suite of $(sed -n 's/^Date: //p' "$release_file" | head -n1)"
    valid_until=$(sed -n 's/^Valid-Until: //p' "$release_file" | head -n1)
    if [[ -n $valid_until ]] && (( $(date -d "$valid_until" +%s) < $(date +%s) )); then
      log "the mirror's $suite Release expired on $valid_until (an archive snapshot): the base skips apt's Valid-Until check"
      printf 'Acquire::Check-Valid-Until "false";\n' >"$rootfs/etc/apt/apt.conf.d/90cephcsi-snapshot-mirror"
    fi
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/tmp/*
    tar --numeric-owner -C "$rootfs" -cf "$rootfs_tar.tmp" .
    mv "$rootfs_tar.tmp" "$rootfs_tar"
    rm -rf "$rootfs"
    trap - EXIT
    log "debootstrap: $((SECONDS - t)) s"
  fi
  log "importing $rootfs_tar as $base_q"
  podman import --change 'CMD ["/bin/bash"]' "$rootfs_tar" "$base_q" >/dev/null
fi

# ---- 2. build --------------------------------------------------------------------------------
[[ -r $HOST_CA ]] || die "no CA bundle at $HOST_CA (set HOST_CA_BUNDLE)"
build_tmp=$(mktemp -d)
trap 'rm -rf "$build_tmp"' EXIT
mkdir -p "$build_tmp/home/.config/pip"
cp "$HOST_CA" "$build_tmp/home/cephcsi-build-ca.crt"
printf '[global]\ncert = /root/cephcsi-build-ca.crt\n' >"$build_tmp/home/.config/pip/pip.conf"
chmod -R a+rX "$build_tmp"
log "podman build -t $image (base $base_q, OCI format)"
t=$SECONDS
podman --runtime "$runtime" build \
  --file "$REPO/Dockerfile" \
  --tag "$image" \
  --format oci \
  --layers \
  --pull=never \
  --network host \
  "${ulimits[@]}" \
  --volume "$build_tmp/home:/root:ro" \
  "$REPO" >&2
log "build: $((SECONDS - t)) s"

# ---- 3. checks inside the image ----------------------------------------------------------------
podman --runtime "$runtime" run --rm --network none "${ulimits[@]}" --user 0 --entrypoint /bin/sh "$image" -c '
  set -e
  python -c "import rados, rbd, cephcsi._generated.csi_pb2; print(\"rados\", rados.Rados().version())"
  cephcsi --version
  modprobe --version | head -n1
  command -v rbd-fuse
  rbd --version
  python --version
  if [ -e /root/cephcsi-build-ca.crt ] || [ -e /root/.config/pip ] || [ -e /etc/pip.conf ]; then
    echo "the build-time CA bundle or pip.conf was left in the image" >&2; exit 1
  fi
' >&2 || die "the built image failed its checks"

# What the image holds, package by package, and what moved since the previous build.
packages="$output.packages"
podman --runtime "$runtime" run --rm --network none "${ulimits[@]}" --user 0 --entrypoint /bin/sh "$image" \
  -c 'dpkg-query --show --showformat="\${Package} \${Version}\n" | sort' >"$packages.tmp" \
  || die "cannot list the image's Debian packages"
if [[ -s $packages ]] && ! cmp -s "$packages" "$packages.tmp"; then
  log "Debian packages changed since the previous build (< before, > now):"
  diff "$packages" "$packages.tmp" | grep '^[<>]' >&2 || true
fi
mv "$packages.tmp" "$packages"
log "$(wc -l <"$packages") Debian packages, listed in $packages; Ceph client:" \
  "$(grep -E '^(ceph-common|librados2|librbd1|python3-rbd)[: ]' "$packages" | tr '\n' ' ')"

# ---- 4. docker-archive --------------------------------------------------------------------------
# Writes `ref` to `file` unless `file.id` says it already holds this image id.
save_archive() {
  local ref=$1 file=$2 id t
  id=$(podman image inspect --format '{{.Id}}' "$ref")
  if [[ -s $file && -f $file.id && $(cat "$file.id") == "$id" ]]; then
    log "$file already holds $ref ($id)"
    return
  fi
  log "podman save --format docker-archive $ref → $file"
  t=$SECONDS
  mkdir -p "$(dirname "$file")"
  rm -f "$file.tmp"
  podman save --format docker-archive --output "$file.tmp" "$ref"
  mv "$file.tmp" "$file"
  printf '%s\n' "$id" >"$file.id"
  log "save: $((SECONDS - t)) s"
}
save_archive "$image" "$output"
[[ -z $base_output ]] || save_archive "$base_q" "$base_output"
log "done in $((SECONDS - started)) s: $image"
printf '%s\n' "$output"
