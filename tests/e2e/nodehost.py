"""The machine side of the e2e node: its slot on the machine (a lock), the leftovers of a dead
session, and what the host needs before the node starts (the node IP, shared mounts, folders).

- Node IP (10.245.0.1 by default) on a bridge of its own: pods on the CNI bridge cannot reach
  127.0.0.1, so the apiserver and the Ceph test cluster listen on the node IP. The kernel has no
  `dummy` netdev, hence a bridge with an address and no ports.
- The kubelet's root is /var/lib/kubelet because deploy/node-daemonset.yaml names that path, so
  only one e2e node can run per machine: a flock on /run/lock serialises test sessions.
- Every change goes through tests.e2e.host.HostChanges, undone when the node stops.
"""
from __future__ import annotations

import fcntl
import logging
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tests.e2e import host
from tests.e2e.host import HostChanges
from tests.e2e.nodeplane import SERVICE_IP

log = logging.getLogger(__name__)

LOCK_PATH = Path("/run/lock/cephcsi-e2e-node.lock")
KUBELET_ROOT = Path("/var/lib/kubelet")
"""Fixed: deploy/node-daemonset.yaml mounts these host paths."""
DRIVER_STATE = Path("/var/lib/cephcsi")
"""The node plugin's --state-dir hostPath (Bidirectional: must be a shared mount)."""
HOST_DIRS_FOR_DEPLOY = (Path("/lib/modules"),)
"""hostPaths of type Directory in deploy/ that any real node has but this VM lacks."""
MARKER = ".cephcsi-e2e"
"""File written into KUBELET_ROOT so a later run knows a leftover folder is ours to remove."""


class NodeError(RuntimeError):
    """The e2e node could not be built, started or reached."""


@dataclass
class NodeHost:
    """See the module docstring."""

    changes: HostChanges
    work_dir: Path
    node_ip: str
    node_bridge: str
    cni_bridge: str
    lock_timeout: float
    _lock: IO[bytes] | None = None

    def take_lock(self) -> None:
        """One e2e node per machine (the kubelet's root and the driver's paths are fixed)."""
        LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
        handle = open(LOCK_PATH, "wb")
        deadline = time.monotonic() + self.lock_timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    handle.close()
                    raise NodeError(f"another e2e node holds {LOCK_PATH} for more than "
                                    f"{self.lock_timeout}s") from None
                time.sleep(2)
        self._lock = handle

    def release_lock(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def clear_leftovers(self) -> None:
        """A session that died hard leaves its folders (KUBELET_ROOT with our marker) and maybe
        mounts; a kubelet folder without the marker belongs to a real kubelet: refuse to touch it."""
        if KUBELET_ROOT.exists() and not (KUBELET_ROOT / MARKER).exists():
            raise NodeError(f"{KUBELET_ROOT} exists and was not made by the e2e tests; is a real "
                            "kubelet installed on this machine? Remove it or use another machine.")
        if DRIVER_STATE.exists() and not KUBELET_ROOT.exists() and any(DRIVER_STATE.iterdir()):
            raise NodeError(f"{DRIVER_STATE} exists and is not empty; is cephcsi's node plugin "
                            "running on this machine? Remove it or use another machine.")
        if KUBELET_ROOT.exists() or DRIVER_STATE.exists():
            log.warning("removing the leftovers of an earlier e2e run")
            self.release_volumes()
            host.remove_tree(DRIVER_STATE)
            host.remove_tree(KUBELET_ROOT)
        for link in (self.node_bridge, self.cni_bridge):
            host.delete_link(link)

    def prepare(self) -> None:
        """The node IP, the pod network's clean-up, the fixed folders and the shared mounts."""
        # Remove the leftovers of the pod network at the end (CNI makes the bridge, containerd
        # the namespaces; /var/lib/cni holds libcni's result cache).
        self.changes.ensure_dir(Path("/var/lib/cni"))
        self.changes.remove_link_at_end(self.cni_bridge)
        self.changes.remove_new_netns()
        self.changes.remove_new_kube_chains()
        self.changes.add_address_bridge(self.node_bridge, self.node_ip)
        # With no default route a connect() to the Service IP fails before netfilter sees it.
        if not host.run(["ip", "route", "get", SERVICE_IP], check=False).strip():
            host.run(["ip", "route", "add", f"{SERVICE_IP}/32", "dev", self.node_bridge])
        self._share_netns_dir()
        for path in HOST_DIRS_FOR_DEPLOY:
            self.changes.ensure_dir(path)
        self.changes.ensure_dir(Path("/run/mount"))
        self.changes.ensure_dir(KUBELET_ROOT)
        (KUBELET_ROOT / MARKER).write_text("made by tests/e2e (cephcsi); safe to remove\n")
        self.changes.ensure_dir(DRIVER_STATE)
        self.changes.make_rshared(DRIVER_STATE)
        # After the mounts are undone and before the folders are removed (undo runs backwards).
        self.changes.on_restore("release kubelet and driver mounts", self.release_volumes)

    @staticmethod
    def _share_netns_dir() -> None:
        """Make /run/netns a shared bind mount of itself before containerd mounts pod network
        namespaces in it, as `ip netns` does. Otherwise another tool doing that later (podman
        does) covers our nsfs mounts with its bind, and containerd's unlink of them fails with
        EBUSY: pods then hang in Terminating. Left in place at the end, like iproute2 leaves
        it: removing it could strand other users' namespaces the same way."""
        netns = Path("/run/netns")
        netns.mkdir(parents=True, exist_ok=True)
        if not any(m.mount_point == str(netns) for m in host.mounts()):
            host.run(["mount", "--bind", str(netns), str(netns)])
        host.run(["mount", "--make-rshared", str(netns)])

    def release_volumes(self) -> None:
        """Whatever the kubelet and the node plugin left mounted: pod bind mounts and filesystems
        first, then loop devices (they hold rbd-fuse files open), then rbd-fuse mounts and
        daemons, then the remaining mounts (the kubelet's and our shared self-binds)."""
        roots = [str(KUBELET_ROOT), str(DRIVER_STATE)]
        for root in roots:
            for mount in sorted(host.mounts_under(root), key=lambda m: m.mount_id, reverse=True):
                if not mount.fstype.startswith("fuse") and mount.mount_point not in roots:
                    subprocess.run(["umount", mount.mount_point], capture_output=True, check=False)
        for root in roots:
            host.release_data_path(root)
        if self.work_dir.exists():
            host.unmount_tree(str(self.work_dir))
