"""Start the e2e environment by hand and keep it up until Ctrl-C:

    .venv/bin/python -m tests.e2e.run            # from the repository root, as root

It builds what is missing (node binaries, the image: cached), starts the node, Ceph on the node
IP and the driver installed from deploy/ (exactly what the `e2e` fixture does), prints how to
reach them, and tears everything down on Ctrl-C or SIGTERM. Set CEPHCSI_E2E_IMAGE_TAR to use
an image archive built elsewhere instead of scripts/build-image.sh.

With `--demo` (what scripts/demo.sh runs) it also installs the snapshot add-on and runs the demo
(tests/e2e/demo.py) before waiting; `--ready-file F` creates F once everything is up, so a caller
that started this in the background knows when to stop following its output.

Run the scenarios instead with `scripts/test.sh -m e2e` (or `tests/e2e`).
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from tests.e2e.demo import Demo
from tests.e2e.env import STORAGE_CLASS, XFS_CLASS, E2EEnv, start_env
from tests.e2e.snapshot_addon import SnapshotAddon, start_snapshot_addon


def run_demo(env: E2EEnv, addon: SnapshotAddon) -> None:
    """The demo in namespace `default`, as the examples are written."""
    result = Demo(env, sys.stdout, snapshot_class=addon.class_name).run()
    total = sum(result.steps.values())
    print(f"\ndemo done in {total:.0f} s: mapper {result.mounter}, {result.fstype}, "
          f"{result.size_before >> 20} MiB → {result.size_after >> 20} MiB, "
          f"restored {'matches' if result.restored == result.written else 'DIFFERS'}", flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log every step")
    parser.add_argument("--demo", action="store_true", help="run the demo once the node is up")
    parser.add_argument("--ready-file", type=Path, help="created once everything (and the demo) is up")
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
    addon: SnapshotAddon | None = None
    try:
        if args.demo:
            # The add-on outlives the demo: it serves the user's snapshots until teardown.
            started = time.monotonic()
            addon = start_snapshot_addon(env, env.work_dir / "snapshot-controller.log")
            print(f"snapshot add-on (CRDs, snapshot-controller, VolumeSnapshotClass) up in "
                  f"{time.monotonic() - started:.1f} s", flush=True)
            run_demo(env, addon)
        kubectl = env.node.bin_dir / "kubectl"
        print(f"""e2e node {env.node.name} is up ({env.timings.steps})
  export KUBECONFIG={env.node.kubeconfig}
  alias kubectl={kubectl}
  kubectl get pods -A            # the driver in namespace ceph-csi-rbd
  StorageClasses: {STORAGE_CLASS} (ext4), {XFS_CLASS}; image for pods: docker.io/library/cephcsi:0.1.0
  Ceph: ceph -c {env.ceph.conf} status    (pool {env.ceph.pool}, clusterID {env.ceph.cluster_id})
  logs: {env.node.logs} and {env.node.work_dir}/cp
Ctrl-C (or scripts/demo.sh --down) tears everything down.""", flush=True)
        if args.ready_file:
            args.ready_file.touch()
        stop.wait()
    finally:
        print("tearing down...", flush=True)
        if addon is not None:
            # What the demo (or the user) made in `default` goes while the driver runs: snapshots
            # first (the add-on's controller removes their finalizers), then pods and claims.
            env.kube.kubectl("delete", "volumesnapshots", "--all", "-A", "--wait=false")
            env.kube.kubectl("-n", "default", "delete", "pods,pvc", "--all", "--wait=false")
            addon.stop()
        failed = env.stop()
        if failed:
            print("teardown problems:\n  " + "\n  ".join(failed), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
