# Debian packages, shared by scripts/setup.sh and the Dockerfile so both install the same set.
# shellcheck disable=SC2034
RUNTIME_DEB_PACKAGES=(
  ceph-common python3-rados python3-rbd rbd-nbd rbd-fuse
  e2fsprogs xfsprogs util-linux mount
)
# A one-node Ceph cluster for the test suite and benchmarks.
TEST_DEB_PACKAGES=(ceph-mon ceph-mgr ceph-osd uuid-runtime procps)
