#!/bin/sh
# The Debian packages of cephcsi, in one place for scripts/setup.sh (development and test
# machines) and the Dockerfile (the image), so the two cannot drift.
#
#   scripts/packages.sh [--release CODENAME] LIST...
#
# prints the packages of each LIST, one per line. LIST is one of
#   runtime  what cephcsi runs with: Ceph client and Python bindings, the three mappers
#            (krbd needs only kmod's modprobe; rbd-nbd; rbd-fuse with losetup), mkfs/fsck,
#            mount. The image's final stage installs exactly this list.
#   builder  the image's builder stage: Debian's python3 and venv (the venv must use the
#            same interpreter the bindings are built for).
#   test     development/test machines only: a one-node Ceph cluster for the test suite and
#            benchmarks, and podman + debootstrap for scripts/build-image.sh.
# CODENAME defaults to this machine's (VERSION_CODENAME in /etc/os-release, or sid where its
# PRETTY_NAME ends in /sid); the Dockerfile runs it inside the base image, so the image gets
# the list of the image's release.
#
# Plain POSIX sh on purpose: the Dockerfile's RUN lines are run by /bin/sh (dash) when podman
# or buildah build OCI-format images, which ignore SHELL. An unknown release or list is an
# error (exit 2), never an empty list: `x=$(scripts/packages.sh runtime) && apt-get install $x`
# must not succeed with nothing installed.
#
# Releases:
#   bookworm (12): Ceph Pacific 16.2.15 (end of life), Python 3.11 — development machines and
#                  the test cluster.
#   trixie   (13): Ceph Reef 18.2.7, Python 3.13 — the image's fallback variant (its client
#                  cannot read the aes256k keys of a fresh Tentacle >= 20.2.4 cluster).
#   sid          : Ceph Tentacle 20.2.4, Python 3.14 — the image (docs/ARCHITECTURE.md,
#                  "The image's Ceph client").
# The names are the same on all three today; a release whose packages differ gets its own
# case below. The code supports every one of these clients (the e2e tests run the sid image's
# Tentacle client against the bookworm Pacific test cluster).
set -eu

release=""
if [ "${1:-}" = "--release" ]; then
  [ $# -ge 2 ] || { echo "packages.sh: --release needs a codename" >&2; exit 2; }
  release=$2
  shift 2
fi
if [ -z "$release" ]; then
  # sid's os-release names the next stable release (VERSION_CODENAME=forky, PRETTY_NAME
  # "Debian GNU/Linux forky/sid"), exactly as testing's does; the "/sid" says which it is.
  # shellcheck disable=SC1091
  release=$(. /etc/os-release && case "${PRETTY_NAME:-}" in
    */sid) printf 'sid' ;;
    *) printf '%s' "${VERSION_CODENAME:-}" ;;
  esac)
fi
[ $# -ge 1 ] || { echo "usage: packages.sh [--release CODENAME] runtime|builder|test..." >&2; exit 2; }

case "$release" in
  bookworm|trixie|sid) ;;
  *)
    echo "packages.sh: Debian release '${release:-unknown}' is not supported (bookworm, trixie, sid)" >&2
    exit 2
    ;;
esac

for list in "$@"; do
  case "$list" in
    runtime)
      # ceph-common: the rbd CLI (krbd and rbd-nbd are driven by `rbd device map`).
      # kmod: modprobe for --mounter=auto's probe and for krbd/nbd on nodes where the
      #   module exists but is not loaded (the DaemonSet mounts the host's /lib/modules).
      # mount: mount, umount, losetup (rbd-fuse volumes go through a loop device).
      # util-linux: blkid, findmnt. e2fsprogs, xfsprogs: mkfs/fsck/resize of ext4 and xfs.
      # cryptsetup-bin: cryptsetup alone (LUKS2 of encrypted volumes), without the cryptsetup
      #   package's initramfs and boot-time unlocking, which a container never uses.
      printf '%s\n' ceph-common python3-rados python3-rbd rbd-nbd rbd-fuse \
        kmod e2fsprogs xfsprogs util-linux mount cryptsetup-bin
      ;;
    builder)
      printf '%s\n' python3 python3-venv
      ;;
    test)
      # A one-node Ceph cluster (tests/ceph/cluster.sh); podman, runc and debootstrap build
      # the image without a registry or a Docker daemon (scripts/build-image.sh; runc because
      # podman's default crun refuses hosts with hybrid v1/v2 cgroups). qemu-system-x86 (and
      # debootstrap for its disk image, tests/vm/build_image.sh) runs the real-kernel VM node
      # of tests/vm: krbd and rbd-nbd, which this kind of host cannot load. fscrypt: google's
      # tool, to prove file-encrypted volumes open both ways (tests/integration/node/test_fscrypt*).
      printf '%s\n' ceph-mon ceph-mgr ceph-osd uuid-runtime procps podman runc debootstrap qemu-system-x86 \
        fscrypt
      ;;
    *)
      echo "packages.sh: unknown list '$list' (runtime, builder, test)" >&2
      exit 2
      ;;
  esac
done
