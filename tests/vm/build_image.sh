#!/usr/bin/env bash
# Builds the real-kernel VM test node (tests/vm): a Debian bookworm root filesystem image with a
# stock kernel (rbd.ko, nbd.ko, dm-crypt), Ceph's client tools, a Python venv holding the
# driver's runtime dependencies, and containerd, runc, the CNI plugins and iptables for a
# Kubernetes node (containerd.service stays masked: tests/vm/kube_node.py starts it with its own
# config; the kubelet and the images come on a second disk, tests/vm/kube_disk.py), into a
# cache outside the repository:
#
#   $CACHE/vm/bookworm-<key>/{rootfs.raw,vmlinuz,initrd.img,manifest.txt}
#
# <key> hashes this script, the guest files in tests/vm/guest/ and the driver's dependency list
# (pyproject.toml), so any change to what goes into the image builds a new one; older builds
# are removed. Prints the image folder on its last line; with --check, only prints it when the
# image is built (exit 1 otherwise: the tests skip rather than build). About 2-4 minutes and ~1 GB on disk
# the first time; a second run only checks.
#
# How: `debootstrap --variant=minbase` with the packages below from the host's own Debian
# mirror, a small initramfs (MODULES=list: under qemu's TCG a MODULES=most initramfs takes
# tens of seconds just to unpack), units a test node does not need masked, the runner and
# network units of tests/vm/guest installed, and `mkfs.ext4 -d` to turn the tree into a raw
# disk image without a loop device. The driver's Python dependencies are downloaded on the
# host (its pip has the network and certificates set up) and installed offline in the chroot
# into /opt/cephcsi/venv (--system-site-packages: Debian's rados/rbd bindings are seen). The
# driver itself is not in the image: the guest runs the working tree, shared read-only by 9p.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
CACHE_ROOT="${CEPHCSI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cephcsi}"
SUITE=bookworm
PACKAGES=(
  linux-image-amd64 initramfs-tools systemd-sysv udev kmod iproute2 procps
  ceph-common rbd-nbd rbd-fuse fuse3
  python3 python3-rados python3-rbd python3-venv
  e2fsprogs xfsprogs util-linux mount cryptsetup
  containerd runc containernetworking-plugins iptables
)
# Units a disposable test node never needs; each costs boot time under TCG.
MASK=(
  apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer
  e2scrub_reap.service fstrim.timer logrotate.timer man-db.timer systemd-tmpfiles-clean.timer
  getty-static.service getty@tty1.service serial-getty@ttyS0.service rbdmap.service
  ceph.target ceph-fuse.target systemd-networkd-wait-online.service cryptsetup.target
  remote-fs.target systemd-update-utmp.service systemd-update-utmp-runlevel.service
  systemd-journal-flush.service containerd.service
)
INITRAMFS_MODULES=(virtio_pci virtio_blk ext4 crc32c_generic 9pnet_virtio 9p)
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"

# Dependencies from pyproject.toml, so the image follows the project's pins.
deps=$(python3 -c '
import sys, tomllib
with open(sys.argv[1], "rb") as handle:
    print("\n".join(tomllib.load(handle)["project"]["dependencies"]))' "$REPO/pyproject.toml")

key=$({
  cat "$0"
  for file in "$HERE"/guest/*; do echo "== $(basename "$file")"; cat "$file"; done
  echo "$deps"
} | sha256sum | cut -c1-16)
OUT="$CACHE_ROOT/vm/$SUITE-$key"

complete() { [[ -f "$OUT/rootfs.raw" && -f "$OUT/vmlinuz" && -f "$OUT/initrd.img" && -f "$OUT/manifest.txt" ]]; }
if complete; then echo "$OUT"; exit 0; fi
if [[ ${1:-} == --check ]]; then
  echo "build_image.sh: no image for the current script, guest files and dependencies at $OUT" >&2
  exit 1
fi

mkdir -p "$CACHE_ROOT/vm"
exec 9>"$CACHE_ROOT/vm/.lock"
flock 9
if complete; then echo "$OUT"; exit 0; fi

for tool in debootstrap mkfs.ext4; do
  command -v "$tool" >/dev/null || { echo "build_image.sh: $tool is missing (scripts/setup.sh installs it)" >&2; exit 1; }
done
[[ $(id -u) == 0 ]] || { echo "build_image.sh: debootstrap needs root" >&2; exit 1; }

work="$CACHE_ROOT/vm/.build-$key"
root="$work/root"
unmount_chroot() {
  local mount_point
  for mount_point in "$root/proc" "$root/sys" "$root/dev"; do
    if mountpoint -q "$mount_point" 2>/dev/null; then umount "$mount_point" 2>/dev/null || umount -l "$mount_point"; fi
  done
}
cleanup() {
  unmount_chroot
  # Never delete through a bind mount of the host's /dev (or anything else still mounted).
  if grep -q " $work/" /proc/self/mounts; then
    echo "build_image.sh: not removing $work: something is still mounted under it" >&2
    return
  fi
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT
cleanup
mkdir -p "$work"

# The mirror the host's apt uses (these machines reach no other).
mirror=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 2>/dev/null \
  | awk -v s="$SUITE" '$2 == s && $1 !~ /security/ {print $1; exit}')
mirror="${mirror:-http://deb.debian.org/debian/}"
security=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 2>/dev/null \
  | awk -v s="$SUITE-security" '$2 == s {print $1; exit}')

echo "[vm] debootstrap $SUITE from $mirror" >&2
# Kernel packages later: the initramfs configuration must be in place before its first build.
without_kernel=()
for pkg in "${PACKAGES[@]}"; do [[ $pkg == linux-image-amd64 ]] || without_kernel+=("$pkg"); done
debootstrap --variant=minbase --include="$(IFS=,; echo "${without_kernel[*]}")" \
  "$SUITE" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 \
  || { tail -30 "$work/debootstrap.log" >&2; exit 1; }

# Same suites as the host (point-release and security updates: the host's Ceph and kernel
# versions); the archive snapshot behind the mirror may have expired Release files.
{
  echo "deb $mirror $SUITE main"
  echo "deb $mirror $SUITE-updates main"
  [[ -n $security ]] && echo "deb $security $SUITE-security main"
} >"$root/etc/apt/sources.list"
echo 'Acquire::Check-Valid-Until "false";' >"$root/etc/apt/apt.conf.d/99cephcsi-vm"

cat >"$root/etc/initramfs-tools/conf.d/cephcsi-vm.conf" <<'CONF'
MODULES=list
COMPRESS=gzip
RESUME=none
CONF
printf '%s\n' "${INITRAMFS_MODULES[@]}" >>"$root/etc/initramfs-tools/modules"

mount -t proc proc "$root/proc"
mount -t sysfs sysfs "$root/sys"
mount --bind /dev "$root/dev"
cp /etc/resolv.conf "$root/etc/resolv.conf"
in_root() { chroot "$root" env DEBIAN_FRONTEND=noninteractive LC_ALL=C "$@"; }
echo "[vm] apt-get install (updates, kernel)" >&2
{
  in_root apt-get update -qq
  in_root apt-get -y -qq --no-install-recommends dist-upgrade
  in_root apt-get install -y -qq --no-install-recommends linux-image-amd64
  in_root apt-get clean
} >"$work/apt.log" 2>&1 || { tail -30 "$work/apt.log" >&2; exit 1; }

echo "[vm] venv with the driver's dependencies" >&2
mkdir -p "$root/tmp/wheels"
mapfile -t dep_list <<<"$deps"
"$PYTHON" -m pip download -q -d "$root/tmp/wheels" --only-binary=:all: "${dep_list[@]}" >"$work/pip.log" 2>&1 \
  || { tail -30 "$work/pip.log" >&2; exit 1; }
{
  in_root python3 -m venv --system-site-packages /opt/cephcsi/venv
  in_root /opt/cephcsi/venv/bin/pip install -q --no-index --find-links /tmp/wheels "${dep_list[@]}"
  in_root /opt/cephcsi/venv/bin/python -c 'import grpc, google.protobuf, pyudev, yaml, prometheus_client, rados, rbd'
} >>"$work/pip.log" 2>&1 || { tail -30 "$work/pip.log" >&2; exit 1; }
rm -rf "$root/tmp/wheels"

echo "[vm] configuring the guest" >&2
install -m 0755 "$HERE/guest/runner.py" "$root/usr/local/sbin/cephcsi-vm-runner"
install -m 0755 "$HERE/guest/net.sh" "$root/usr/local/sbin/cephcsi-vm-net"
install -m 0644 "$HERE/guest/cephcsi-vm-net.service" "$HERE/guest/cephcsi-vm-runner.service" "$root/etc/systemd/system/"
in_root systemctl enable -q cephcsi-vm-net.service cephcsi-vm-runner.service
in_root systemctl mask -q "${MASK[@]}"
echo cephcsi-vm >"$root/etc/hostname"
printf '127.0.0.1 localhost\n' >"$root/etc/hosts"
printf '/dev/vda / ext4 rw,noatime,errors=remount-ro 0 1\n' >"$root/etc/fstab"
# A volatile journal: nothing to flush at boot, nothing to keep after a test session.
mkdir -p "$root/etc/systemd/journald.conf.d"
printf '[Journal]\nStorage=volatile\nRuntimeMaxUse=32M\n' >"$root/etc/systemd/journald.conf.d/cephcsi-vm.conf"
mkdir -p "$root/etc/ceph"
: >"$root/etc/resolv.conf"

in_root dpkg-query -W -f '${Package} ${Version}\n' >"$work/manifest.txt"
kernel=$(ls "$root"/boot/vmlinuz-* | sort -V | tail -1)
initrd="$root/boot/initrd.img-${kernel##*/vmlinuz-}"
[[ -f $initrd ]] || { echo "build_image.sh: no initramfs for $kernel" >&2; exit 1; }

unmount_chroot
mkdir -p "$work/out"
cp "$kernel" "$work/out/vmlinuz"
cp "$initrd" "$work/out/initrd.img"
mv "$work/manifest.txt" "$work/out/manifest.txt"
echo "[vm] mkfs.ext4 -d (root filesystem image)" >&2
mkfs.ext4 -q -F -L cephcsi-vm -E lazy_itable_init=1 -d "$root" "$work/out/rootfs.raw" 4G

in_use() {  # a process's command line names $1 (read here: a grep for it would match itself)
  local cmdline
  for cmdline in /proc/[0-9]*/cmdline; do
    [[ $(tr '\0' ' ' <"$cmdline" 2>/dev/null) == *"$1"* ]] && return 0
  done
  return 1
}
# Publish atomically, then drop older builds (a changed script or dependency list) that no
# qemu on this machine still boots from (another test session may run on the old image).
rm -rf "$OUT"
mv "$work/out" "$OUT"
for old in "$CACHE_ROOT"/vm/"$SUITE"-*; do
  [[ $old == "$OUT" ]] && continue
  if in_use "$old/"; then
    echo "build_image.sh: keeping $old (a running VM uses it)" >&2
    continue
  fi
  rm -rf "$old"
done
echo "$OUT"
