"""Start the test control plane by hand: `python -m tests.controlplane.run [--controllers a,b]`.

Prints the kubeconfig path (use it with kubectl or --kubeconfig) and runs until Ctrl-C or
SIGTERM, then stops every process. --work-dir keeps data, keys and logs in a folder you choose
(kept afterwards); otherwise a temporary folder is used and removed.
"""
from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path

from tests.controlplane.cluster import ControlPlaneSettings, start_control_plane


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work-dir", type=Path, default=None, help="folder for data, keys and logs")
    parser.add_argument("--controllers", default="", help="start kube-controller-manager with these controllers")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    plane = start_control_plane(ControlPlaneSettings(work_dir=args.work_dir))
    try:
        if args.controllers:
            plane.start_controller_manager(args.controllers.split(","))
        print(f"apiserver:  {plane.url}")
        print(f"kubeconfig: {plane.kubeconfig}")
        print(f"export KUBECONFIG={plane.kubeconfig}")
        print(f"logs:       {plane.work_dir}/*.log")
        print("Ctrl-C stops it.", flush=True)
        stop.wait()
    finally:
        plane.stop()


if __name__ == "__main__":
    main()
