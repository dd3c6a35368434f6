"""ceph layer; see docs/ARCHITECTURE.md."""
