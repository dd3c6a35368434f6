"""What the scenarios assert on the Ceph side and on the node itself.

Ceph: a volume is its RBD image plus two journal entries (tests/e2e reads them as client.admin,
not through the driver): the directory key `csi.volume.<PV name>` in `csi.volumes.default` and the
record object `csi.volume.<uuid>`. "Gone" means all three are gone and the image is not waiting
in the trash either.

Node: a volume in use is a filesystem (or a block device bind) under the kubelet's folder, a loop
device on an rbd-fuse file under the driver's state folder, and an rbd-fuse daemon. "Nothing
left" means none of those name the volume any more.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

from tests.ceph.fixtures import CephTestCluster
from tests.e2e import host
from tests.e2e.kube import image_name, volume_uuid, wait_for
from tests.e2e.nodehost import DRIVER_STATE, KUBELET_ROOT

DIRECTORY = "csi.volumes.default"
"""The journal directory of instance `default` (deploy/ does not set --instanceid)."""


@dataclass(frozen=True)
class CephVolume:
    """The Ceph side of one PV, as client.admin sees it."""

    image: str
    uuid: str
    image_exists: bool
    directory_key: str | None
    """The uuid the directory maps the PV name to, None when the key is absent."""
    record_exists: bool
    in_trash: bool

    @property
    def complete(self) -> bool:
        return self.image_exists and self.directory_key == self.uuid and self.record_exists

    @property
    def gone(self) -> bool:
        return not (self.image_exists or self.directory_key or self.record_exists or self.in_trash)


def ceph_volume(ceph: CephTestCluster, pv: dict[str, Any]) -> CephVolume:
    name, uid = image_name(pv), volume_uuid(pv)
    directory = ceph.omap(DIRECTORY)
    objects = ceph.objects()
    return CephVolume(
        image=name,
        uuid=uid,
        image_exists=name in ceph.images(),
        directory_key=directory.get(f"csi.volume.{pv['metadata']['name']}"),
        record_exists=f"csi.volume.{uid}" in objects,
        in_trash=any(entry.get("name") == name for entry in ceph.trash()),
    )


def watchers(ceph: CephTestCluster, image: str) -> list[str]:
    """`rbd status` watchers of the image (a mapped image has one: the node's rbd-fuse)."""
    out = ceph.admin("rbd", "status", "-p", ceph.pool, image, "--format", "json")
    return [w.get("address", "") for w in json.loads(out).get("watchers", [])]


def wait_ceph_gone(ceph: CephTestCluster, pv: dict[str, Any], timeout: float = 90.0) -> None:
    """Image, journal entries and trash entry all gone (the mgr purges the trash)."""
    wait_for(f"image and journal of {pv['metadata']['name']} gone from Ceph",
             lambda: ceph_volume(ceph, pv).gone, timeout,
             explain=lambda: repr(ceph_volume(ceph, pv)))


@dataclass(frozen=True)
class NodeLeftovers:
    """What on the node still refers to one volume."""

    mounts: list[str]
    loops: list[str]
    fuse_daemons: list[int]

    def __bool__(self) -> bool:
        return bool(self.mounts or self.loops or self.fuse_daemons)


def node_leftovers(pv: dict[str, Any], image: str) -> NodeLeftovers:
    """Mounts of the volume under the kubelet folder (the staging path is named by the sha256 of
    the volume handle, publish and block paths by the PV name), loop devices on the image's
    rbd-fuse file or on the kubelet's block-device files of the PV, and rbd-fuse daemons
    serving the image (the driver passes the image name in their argv)."""
    pv_name = pv["metadata"]["name"]
    staging = hashlib.sha256(pv["spec"]["csi"]["volumeHandle"].encode()).hexdigest()
    mounts = [m.mount_point for m in host.mounts_under(str(KUBELET_ROOT))
              if pv_name in m.mount_point or staging in m.mount_point]
    loops = [dev for dev, back in host.loop_devices() if back.endswith("/" + image) or pv_name in back]
    daemons = [pid for pid, argv in host.processes()
               if os.path.basename(argv[0]) == "rbd-fuse" and image in argv]
    return NodeLeftovers(mounts, loops, daemons)


def driver_data_path() -> NodeLeftovers:
    """Every mount, loop device and rbd-fuse daemon of the driver's state folder, whatever the
    volume: empty whenever no volume is in use."""
    root = str(DRIVER_STATE)
    return NodeLeftovers([m.mount_point for m in host.mounts_under(root) if m.mount_point != root],
                         host.loops_under(root), host.fuse_daemons_under(root))


def wait_node_clean(pv: dict[str, Any], image: str, timeout: float = 60.0) -> None:
    wait_for(f"nothing of {image} left on the node", lambda: not node_leftovers(pv, image), timeout,
             explain=lambda: repr(node_leftovers(pv, image)))
