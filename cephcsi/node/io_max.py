"""krbd QoS: a volume's librbd limits enforced by the kernel, as a cgroup v2 `io.max` rule in the
cgroup of the pod that publishes it.

Written at NodePublishVolume (and its retry) for the device the pod's data sits on, from the
image's `conf_rbd_qos_…` limits, only when a node-publish secret gives credentials. Limits that
cannot be read (an unusable secret, Ceph unreachable) leave the volume unthrottled with a
WARNING instead of failing the publish. Each direction is bounded on its own (cgroup v2 has no
combined limit). Why so: docs/design/node.md, "krbd QoS".
"""
from __future__ import annotations

import errno
import logging
import os
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from cephcsi.ceph.credentials import Credentials
from cephcsi.errors import CephCSIError, Internal
from cephcsi.node.exec import Runner
from cephcsi.node.image_meta import RbdImageMetadata
from cephcsi.node.stage_record import ImageSpec
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

CGROUP_ROOTS = ("/sys/fs/cgroup", "/proc/1/root/sys/fs/cgroup")
"""Where the node's cgroup hierarchy is looked for. In the plugin's container /sys/fs/cgroup is
usually its own cgroup namespace's view (the runtime mounts it over the host's /sys), which
shows no pod; with hostPID, /proc/1/root is the node's root and shows the whole hierarchy."""
SEARCH_DEPTH = 5
"""How deep below the cgroup root a pod's cgroup is looked for when it is in none of the
kubelet's default places (a --cgroup-root, a nested kubelet)."""

_CONFIG = "conf_rbd_qos_{}_limit"
_UID = r"[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}"
# kubelet's layouts: <kubelet>/pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount (Filesystem) and
# <kubelet>/plugins/kubernetes.io/csi/volumeDevices/publish/<pv>/<uid> (Block).
_MOUNT_TARGET = re.compile(rf"/pods/({_UID})/volumes/")
_BLOCK_TARGET = re.compile(rf"/volumeDevices/publish/[^/]+/({_UID})/?$")


@dataclass(frozen=True)
class IoLimits:
    """Per direction, 0 = no limit."""

    riops: int = 0
    wiops: int = 0
    rbps: int = 0
    wbps: int = 0

    @property
    def unlimited(self) -> bool:
        return not (self.riops or self.wiops or self.rbps or self.wbps)


def _limit(metadata: Mapping[str, str], short: str) -> int:
    try:
        value = int(metadata.get(_CONFIG.format(short), "0"))
    except ValueError:
        return 0  # librbd would refuse it as well; the controller never writes one
    return max(value, 0)


def _tighter(own: int, combined: int) -> int:
    if own and combined:
        return min(own, combined)
    return own or combined


def limits_from_metadata(metadata: Mapping[str, str]) -> IoLimits:
    """The io.max limits of an image's `conf_rbd_qos_…_limit` keys."""
    iops, bps = _limit(metadata, "iops"), _limit(metadata, "bps")
    return IoLimits(riops=_tighter(_limit(metadata, "read_iops"), iops),
                    wiops=_tighter(_limit(metadata, "write_iops"), iops),
                    rbps=_tighter(_limit(metadata, "read_bps"), bps),
                    wbps=_tighter(_limit(metadata, "write_bps"), bps))


def io_max_line(major: int, minor: int, limits: IoLimits) -> str:
    """The io.max rule; all four keys always, `max` where unlimited, so writing it replaces any
    earlier rule of the device (all `max` removes the rule)."""
    def value(number: int) -> str:
        return str(number) if number else "max"
    return (f"{major}:{minor} rbps={value(limits.rbps)} wbps={value(limits.wbps)} "
            f"riops={value(limits.riops)} wiops={value(limits.wiops)}")


def parse_io_max(text: str) -> dict[tuple[int, int], str]:
    """io.max's rules by device number (the kernel lists only devices with a limit)."""
    rules: dict[tuple[int, int], str] = {}
    for line in text.splitlines():
        device, _, _ = line.partition(" ")
        major, sep, minor = device.partition(":")
        if sep and major.isdigit() and minor.isdigit():
            rules[(int(major), int(minor))] = line.strip()
    return rules


def pod_uid(target_path: str) -> str | None:
    """The pod uid in a kubelet publish target path, None when the path is not kubelet's."""
    match = _MOUNT_TARGET.search(target_path) or _BLOCK_TARGET.search(target_path)
    return match.group(1) if match else None


def pod_cgroup_candidates(uid: str) -> list[str]:
    """Where the kubelet puts a pod's cgroup, relative to the cgroup root: the cgroupfs driver
    (`kubepods[/burstable|/besteffort]/pod<uid>`) and the systemd driver (slices, with the
    uid's dashes as underscores), for the Guaranteed, Burstable and BestEffort QoS classes."""
    slice_uid = uid.replace("-", "_")
    return [
        f"kubepods/pod{uid}",
        f"kubepods/burstable/pod{uid}",
        f"kubepods/besteffort/pod{uid}",
        f"kubepods.slice/kubepods-pod{slice_uid}.slice",
        f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{slice_uid}.slice",
        f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{slice_uid}.slice",
    ]


def _is_pod_dir(name: str, uid: str) -> bool:
    return name == f"pod{uid}" or name.endswith(f"-pod{uid.replace('-', '_')}.slice")


def find_pod_cgroup(root: str, uid: str) -> str | None:
    """The pod's cgroup directory: the kubelet's default places first, else a walk of at most
    SEARCH_DEPTH levels that only descends into kubepods directories once past the top."""
    for relative in pod_cgroup_candidates(uid):
        path = os.path.join(root, relative)
        if os.path.isdir(path):
            return path
    level = [root]
    for depth in range(SEARCH_DEPTH):
        below: list[str] = []
        for directory in level:
            try:
                entries = list(os.scandir(directory))
            except OSError:
                continue
            for entry in entries:
                if not entry.is_dir(follow_symlinks=False):
                    continue
                if _is_pod_dir(entry.name, uid):
                    return entry.path
                if depth == 0 or "kubepods" in entry.name:
                    below.append(entry.path)
        level = below
    return None


def device_numbers(device: str, stat_path: Callable[[str], os.stat_result] = os.stat) -> tuple[int, int]:
    """MAJ:MIN of a block device node."""
    try:
        info = stat_path(device)
    except OSError as error:
        raise Internal(f"cannot read the device numbers of {device}: {error.strerror}") from None
    if not stat.S_ISBLK(info.st_mode):
        raise Internal(f"{device} is not a block device; its I/O limits cannot be set")
    return os.major(info.st_rdev), os.minor(info.st_rdev)


class IoMaxWriter:
    """Writes a device's rule into a pod's io.max. A node or pod where that is not possible
    (cgroup v1, no io controller, a pod cgroup in no known place) is logged, never an error:
    the volume works, only unthrottled, which is what krbd did before (docs/qos.md)."""

    def __init__(self, roots: tuple[str, ...] = CGROUP_ROOTS,
                 stat_path: Callable[[str], os.stat_result] = os.stat) -> None:
        self.roots = roots
        self.stat_path = stat_path
        self._said: set[str] = set()

    def _once(self, key: str, message: str, **extra: object) -> None:
        if key not in self._said:
            self._said.add(key)
            log.info(message, extra=fields(**extra))

    def apply(self, volume_id: str, target_path: str, device: str, limits: IoLimits) -> bool:
        """Make the pod's rule for `device` say `limits` (no rule when unlimited); True when
        io.max now says so."""
        uid = pod_uid(target_path)
        if uid is None:
            if not limits.unlimited:
                log.warning("krbd QoS not enforced: the target path names no pod",
                            extra=fields(volume_id=volume_id, target=target_path))
            return False
        roots = [root for root in self.roots if os.path.exists(os.path.join(root, "cgroup.controllers"))]
        if not roots:
            self._once("v1", "krbd QoS not enforced on this node: no cgroup v2 hierarchy",
                       cgroup_roots=list(self.roots))
            return False
        cgroup = next((found for found in (find_pod_cgroup(root, uid) for root in roots) if found), None)
        if cgroup is None:
            if not limits.unlimited:
                log.warning("krbd QoS not enforced: the pod's cgroup was not found",
                            extra=fields(volume_id=volume_id, pod_uid=uid, cgroup_roots=roots))
            return False
        path = os.path.join(cgroup, "io.max")
        try:
            with open(path, encoding="ascii") as handle:
                current = parse_io_max(handle.read())
        except FileNotFoundError:
            self._once("io", "krbd QoS not enforced on this node: the io controller is not enabled "
                             "for pod cgroups", cgroup=cgroup)
            return False
        except OSError as error:
            raise Internal(f"cannot read {path}: {error.strerror}") from None
        if limits.unlimited and not current:
            return True  # no rule to remove: the device is not even looked at
        major, minor = device_numbers(device, self.stat_path)
        if limits.unlimited and (major, minor) not in current:
            return True
        line = io_max_line(major, minor, limits)
        try:
            with open(path, "w", encoding="ascii") as handle:
                handle.write(line + "\n")
        except OSError as error:
            if error.errno == errno.ENODEV and limits.unlimited:
                return True  # the device is gone, and its rule with it
            raise Internal(f"cannot set the I/O limits of {device} for pod {uid} ({path}: "
                           f"{error.strerror}); the volume is published but not throttled") from None
        log.info("pod I/O limits set", extra=fields(volume_id=volume_id, pod_uid=uid, rule=line))
        return True


class KrbdQos:
    """Publish's step for krbd volumes: the image's limits into the pod's io.max.

    Reading never fails a publish that the volume could serve: a node-publish secret without a
    usable cephx user, an unknown cluster or a failed read of the image (a mon election, a user
    not allowed to read it) leaves the volume unthrottled with a WARNING, as a missing cgroup
    does; the image may well have no limits at all. Only a rule that must be written and cannot
    be (the device or the pod's io.max refusing it) fails the publish, which the kubelet retries."""

    def __init__(self, runner: Runner, timeout: float, writer: IoMaxWriter | None = None) -> None:
        self.runner = runner
        self.timeout = timeout
        self.writer = writer or IoMaxWriter()
        self._said_no_secret = False

    def read_limits(self, image: ImageSpec, monitors: str, credentials: Credentials) -> IoLimits:
        metadata = RbdImageMetadata(self.runner, self.timeout, image, monitors, credentials).read()
        return limits_from_metadata(metadata)

    def apply(self, volume_id: str, target_path: str, device: str, image: ImageSpec, cluster_id: str,
              secrets: Mapping[str, str], cluster_monitors: Callable[[str], str] | None) -> None:
        if not secrets or cluster_monitors is None:
            if not self._said_no_secret:
                self._said_no_secret = True
                log.info("krbd QoS limits are not read or enforced for volumes published without a "
                         "node-publish secret (csi.storage.k8s.io/node-publish-secret-name/-namespace "
                         "in the StorageClass)", extra=fields(volume_id=volume_id))
            return
        try:
            # The messages of these errors name what is wrong, never a secret's value.
            credentials = Credentials.from_secrets(secrets)
            monitors = cluster_monitors(cluster_id)
        except CephCSIError as error:
            log.warning("krbd QoS not enforced: the node-publish secret or the volume's cluster cannot "
                        "be used to read the image's limits; fix the secret (userID, userKey) or "
                        "config.json", extra=fields(volume_id=volume_id, cluster_id=cluster_id, error=str(error)))
            return
        try:
            limits = self.read_limits(image, monitors, credentials)
        except (CephCSIError, OSError) as error:  # OSError: the 0600 key file could not be written
            log.warning("krbd QoS not enforced: the image's limits could not be read; check that the "
                        "monitors are reachable and that the node-publish secret's user may read the "
                        "image's metadata (rbd image-meta list)",
                        extra=fields(volume_id=volume_id, image=str(image), error=str(error)))
            return
        self.writer.apply(volume_id, target_path, device, limits)
