"""Start the e2e environment by hand and keep it up until Ctrl-C:

    .venv/bin/python -m tests.e2e.run            # from the repository root, as root

It builds what is missing (node binaries, the image: cached), starts the node, Ceph on the node
IP and the driver installed from deploy/ (exactly what the `e2e` fixture does), prints how to
reach them, and tears everything down on Ctrl-C or SIGTERM. Set CEPHCSI_E2E_IMAGE_TAR to use
an image archive built elsewhere instead of scripts/build-image.sh.

Run the scenarios instead with `scripts/test.sh -m e2e` (or `tests/e2e`).
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from types import FrameType

from tests.e2e.env import STORAGE_CLASS, XFS_CLASS, start_env


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log every step")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    if os.geteuid() != 0:
        print("run as root: the node changes mounts, links, iptables and sysctls", file=sys.stderr)
        return 2

    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    env = start_env()
    try:
        kubectl = env.node.bin_dir / "kubectl"
        print(f"""e2e node {env.node.name} is up ({env.timings.steps})
  export KUBECONFIG={env.node.kubeconfig}
  alias kubectl={kubectl}
  kubectl get pods -A            # the driver in namespace ceph-csi-rbd
  StorageClasses: {STORAGE_CLASS} (ext4), {XFS_CLASS}; image for pods: docker.io/library/cephcsi:0.1.0
  Ceph: ceph -c {env.ceph.conf} status    (pool {env.ceph.pool}, clusterID {env.ceph.cluster_id})
  logs: {env.node.logs} and {env.node.work_dir}/cp
Ctrl-C tears everything down.""", flush=True)
        stop.wait()
    finally:
        print("tearing down...", flush=True)
        failed = env.stop()
        if failed:
            print("teardown problems:\n  " + "\n  ".join(failed), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
