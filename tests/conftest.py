"""Shared pytest wiring: the real-peer fixtures live beside the scripts that start the peers."""
import logging

# pytest captures DEBUG (pyproject's log_level) and prints it for a failed test; the kubernetes
# client logs whole response bodies at DEBUG, Secrets' data included. The tests' own clients are
# kept at INFO, as the driver keeps its own (cephcsi.observability.logging).
logging.getLogger("kubernetes.client.rest").setLevel(logging.INFO)

pytest_plugins = [
    "tests.ceph.fixtures",
    "tests.controlplane.fixtures",
]
