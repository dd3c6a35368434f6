"""Start the e2e environment by hand and keep it up until Ctrl-C:

    .venv/bin/python -m tests.e2e.run            # from the repository root, as root

It builds what is missing (node binaries, the image: cached), starts the node, Ceph on the node
IP and the driver installed from deploy/ (exactly what the `e2e` fixture does), prints how to
reach them, and tears everything down on Ctrl-C or SIGTERM. Set CEPHCSI_E2E_IMAGE_TAR to use
an image archive built elsewhere instead of scripts/build-image.sh.

With `--demo` (what scripts/demo.sh runs) it also installs the snapshot add-on and runs the demo
(tests/e2e/demo.py) before waiting; `--ready-file F` creates F once everything is up, so a caller
that started this in the background knows when to stop following its output.

`--node=vm` also joins the real-kernel VM node (tests/e2e/vm_node.py) and pins the demo's pods
to it, where the node plugin maps with krbd; `--node=host` keeps them on the host node (rbd-fuse
where its kernel has neither rbd nor nbd). `--node=auto`, the default with `--demo`, takes the VM
node where the VM tier can run (qemu, root, the VM image built) and says which it took and why.

Run the scenarios instead with `scripts/test.sh -m e2e` (or `tests/e2e`).
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from tests.e2e.demo import Demo
from tests.e2e.env import STORAGE_CLASS, XFS_CLASS, E2EEnv, start_env
from tests.e2e.snapshot_addon import SnapshotAddon, start_snapshot_addon
from tests.e2e.vm_node import joined_vm_node, patience, vm_image, wait_plugin
from tests.vm.kube_node import VmKubelet
from tests.vm.machine import VmImage


class NodeUnavailable(Exception):
    """--node=vm where the VM node cannot run; the message says why."""


def host_mapper() -> str:
    """What the host node plugin's --mounter=auto will find in this kernel (the image brings the
    rbd-nbd and rbd-fuse binaries); the demo's transcript then shows what it did choose."""
    def module(name: str, present: str) -> bool:
        return os.path.exists(present) or subprocess.run(["modprobe", "-n", "-q", name], check=False).returncode == 0

    if module("rbd", "/sys/bus/rbd"):
        return "krbd"
    return "rbd-nbd" if module("nbd", "/sys/module/nbd") else "rbd-fuse"


def choose_node(requested: str, because: str) -> tuple[VmImage | None, str]:
    """The VM image when the demo takes the VM node (None: the host node), and the sentence
    saying which node and mapper and why."""
    host = f"host node ({host_mapper()})"
    if requested == "host":
        return None, f"{host}: {because}"
    image, reason = vm_image()
    if image is None:
        if requested == "vm":
            raise NodeUnavailable(f"--node=vm: {reason}")
        return None, f"{host}: no real-kernel VM node here: {reason}"
    return image, f"real-kernel VM node (krbd): qemu, root and the VM image cached at {image.folder}"


def run_demo(env: E2EEnv, addon: SnapshotAddon, vm: VmKubelet | None) -> None:
    """The demo in namespace `default`, as the examples are written; its pods on `vm` if given."""
    if vm is None:
        demo = Demo(env, sys.stdout, snapshot_class=addon.class_name)
    else:
        # The guest's root has every capability: ext4 grows online there, unlike on this host.
        demo = Demo(env, sys.stdout, snapshot_class=addon.class_name, node=vm.name, fstype="ext4",
                    patience=patience())
    result = demo.run()
    total = sum(result.steps.values())
    print(f"\ndemo done in {total:.0f} s: mapper {result.mounter} ({result.device}), {result.fstype}, "
          f"{result.size_before >> 20} MiB → {result.size_after >> 20} MiB, "
          f"restored {'matches' if result.restored == result.written else 'DIFFERS'}", flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log every step")
    parser.add_argument("--demo", action="store_true", help="run the demo once the node is up")
    parser.add_argument("--ready-file", type=Path, help="created once everything (and the demo) is up")
    parser.add_argument("--node", choices=("auto", "host", "vm"),
                        help="where the demo's pods run (default: auto with --demo, else host)")
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
    try:
        image, why = choose_node(args.node or ("auto" if args.demo else "host"),
                                 "--node=host" if args.node else "without --demo the default is the host node")
    except NodeUnavailable as error:
        print(error, file=sys.stderr)
        return 2
    print(f"node: {why}", flush=True)
    env = start_env()
    addon: SnapshotAddon | None = None
    try:
        if args.demo:
            # The add-on outlives the demo: it serves the user's snapshots until teardown.
            started = time.monotonic()
            addon = start_snapshot_addon(env, env.work_dir / "snapshot-controller.log")
            print(f"snapshot add-on (CRDs, snapshot-controller, VolumeSnapshotClass) up in "
                  f"{time.monotonic() - started:.1f} s", flush=True)
        if image is None:
            return serve(args, env, addon, None, stop)
        started = time.monotonic()
        print("booting the VM node and joining it to the cluster (minutes under TCG)...", flush=True)
        with joined_vm_node(env, image, lambda: ["default"]) as vm:
            if vm is None:
                print("no free VM node index on this machine (other sessions run VM nodes)", file=sys.stderr)
                return 1
            wait_plugin(env, vm)
            print(f"VM node {vm.name} ({vm.vm.address}, {vm.vm.accel}) Ready with the node plugin in "
                  f"{time.monotonic() - started:.0f} s", flush=True)
            return serve(args, env, addon, vm, stop)
    finally:
        print("tearing down...", flush=True)
        if addon is not None:
            addon.stop()
        failed = env.stop()
        if failed:
            print("teardown problems:\n  " + "\n  ".join(failed), file=sys.stderr)
            return 1


def vm_lines(vm: VmKubelet | None) -> str:
    if vm is None:
        return ""
    return (f"\n  VM node {vm.name} ({vm.vm.address}, stock Debian kernel): pods with nodeSelector "
            f"kubernetes.io/hostname: {vm.name} get krbd devices; its kubelet and containerd logs are in "
            f"{vm.vm.host_path('')}")


def serve(args: argparse.Namespace, env: E2EEnv, addon: SnapshotAddon | None, vm: VmKubelet | None,
          stop: threading.Event) -> int:
    """The demo (with --demo), then how to reach everything, until `stop`; then what the demo
    or the user made in `default` goes while the driver and the node holding it still run."""
    try:
        if addon is not None:
            run_demo(env, addon, vm)
        kubectl = env.node.bin_dir / "kubectl"
        print(f"""e2e node {env.node.name} is up ({env.timings.steps})
  export KUBECONFIG={env.node.kubeconfig}
  alias kubectl={kubectl}
  kubectl get pods -A            # the driver in namespace ceph-csi-rbd
  StorageClasses: {STORAGE_CLASS} (ext4), {XFS_CLASS}; image for pods: docker.io/library/cephcsi:0.1.0
  Ceph: ceph -c {env.ceph.conf} status    (pool {env.ceph.pool}, clusterID {env.ceph.cluster_id})
  logs: {env.node.logs} and {env.node.work_dir}/cp{vm_lines(vm)}
Ctrl-C (or scripts/demo.sh --down) tears everything down.""", flush=True)
        if args.ready_file:
            args.ready_file.touch()
        stop.wait()
    finally:
        if addon is not None:
            # Snapshots first (the add-on's controller removes their finalizers), then pods and
            # claims; the VM node's exit then waits until their volumes are detached from it.
            env.kube.kubectl("delete", "volumesnapshots", "--all", "-A", "--wait=false")
            env.kube.kubectl("-n", "default", "delete", "pods,pvc", "--all", "--wait=false")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
