"""Shared pytest wiring: the real-peer fixtures live beside the scripts that start the peers."""

pytest_plugins = [
    "tests.ceph.fixtures",
    "tests.controlplane.fixtures",
]
