"""Which mapper maps a volume.

`--mounter=auto` picks krbd, else rbd-nbd, else fuse, once at start (`resolve_at_start`: logged
with its reason, gauge `cephcsi_node_mapper_info`); a `mounter` in the volume context overrides
it, and a mapper the node lacks is then an error. docs/design/node.md, "Choosing one".
"""
from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass

from cephcsi.errors import CephCSIError, FailedPrecondition, InvalidArgument
from cephcsi.node.exec import Runner
from cephcsi.node.mappers.base import FUSE, KRBD, NBD
from cephcsi.observability.logging import fields
from cephcsi.observability.metrics import NODE_MAPPER

log = logging.getLogger(__name__)

AUTO = "auto"
# Mappers whose mappings are processes inside the node plugin's container: they end when it
# restarts (DaemonSet update, crash, liveness kill), and I/O on their volumes fails until the
# pods using them are restarted.
USERSPACE = frozenset({NBD, FUSE})
# Spellings users write in StorageClasses (ceph-csi documents "rbd-nbd"; krbd is its default).
ALIASES = {"krbd": KRBD, "rbd": KRBD, "rbd-nbd": NBD, "nbd": NBD, "fuse": FUSE, "rbd-fuse": FUSE}


@dataclass
class NodeProbe:
    """The facts auto-selection looks at; injectable so the rules are unit-testable."""

    exists: Callable[[str], bool] = os.path.exists
    which: Callable[[str], str | None] = shutil.which
    modprobe: Callable[[str], bool] = lambda module: False

    def has_krbd(self) -> bool:
        return self.exists("/sys/bus/rbd") or self.modprobe("rbd")

    def has_nbd(self) -> bool:
        kernel = self.exists("/sys/module/nbd") or self.exists("/dev/nbd0") or self.modprobe("nbd")
        return kernel and self.which("rbd-nbd") is not None

    def has_fuse(self) -> bool:
        return (
            self.exists("/dev/fuse")
            and self.exists("/dev/loop-control")
            and self.which("rbd-fuse") is not None
            and self.which("losetup") is not None
        )


def runner_modprobe(runner: Runner, timeout: float = 10.0) -> Callable[[str], bool]:
    def modprobe(module: str) -> bool:
        try:
            runner(["modprobe", module], what=f"load kernel module {module}", timeout=timeout)
        except CephCSIError:
            return False
        return True

    return modprobe


def choose_auto(probe: NodeProbe) -> tuple[str, list[str]]:
    """The mapper auto-selection picks, and the mappers it passed over (for the log)."""
    skipped: list[str] = []
    if probe.has_krbd():
        return KRBD, skipped
    skipped.append("krbd (no /sys/bus/rbd and modprobe rbd failed)")
    if probe.has_nbd():
        return NBD, skipped
    skipped.append("rbd-nbd (no nbd kernel module or no rbd-nbd binary)")
    if probe.has_fuse():
        return FUSE, skipped
    raise FailedPrecondition(
        "this node can map RBD images with none of krbd (no rbd kernel module), rbd-nbd (no nbd module "
        "or rbd-nbd binary) or fuse (needs /dev/fuse, /dev/loop-control, rbd-fuse and losetup)"
    )


def normalize(name: str, source: str) -> str:
    mapper = ALIASES.get(name.strip().lower())
    if mapper is None:
        raise InvalidArgument(f"{source}: unknown mounter {name!r} (use krbd, rbd-nbd or fuse)")
    return mapper


class MapperChoice:
    """The node default, resolved lazily once (auto probing may run modprobe)."""

    def __init__(self, configured: str, probe: NodeProbe) -> None:
        self.configured = configured
        self.probe = probe
        self._default: str | None = None
        self._lock = threading.Lock()

    def default(self) -> str:
        with self._lock:  # held only for the one-time probe (a few stat calls, maybe modprobe)
            if self._default is None:
                if self.configured == AUTO:
                    mapper, skipped = choose_auto(self.probe)
                    reason = "unavailable: " + "; ".join(skipped) if skipped else "the rbd kernel module is available"
                    announce(mapper, "auto", reason)
                else:
                    mapper = normalize(self.configured, "--mounter")
                    announce(mapper, "configured", f"--mounter={self.configured}")
                self._default = mapper
            return self._default

    def for_volume(self, requested: str) -> str:
        if requested.strip():
            return normalize(requested, "volume context mounter")
        return self.default()


def announce(mapper: str, selection: str, reason: str) -> None:
    """Log the node's default mapper with why it was chosen, and publish it as a metric."""
    NODE_MAPPER.labels(mapper=mapper, selection=selection).set(1)
    log.info("node default mapper", extra=fields(mounter=mapper, selection=selection, reason=reason))
    if mapper in USERSPACE:
        log.warning(
            "volumes without a StorageClass 'mounter' will use a userspace mapper: their mappings run inside "
            "this plugin and end when it restarts (update, crash), failing I/O until their pods are restarted "
            "(except rbd-nbd devices mapped with mapOptions 'nbd:try-netlink', which the restarted plugin "
            "re-attaches within reattach-timeout); "
            "keep the DaemonSet's updateStrategy OnDelete and drain a node before replacing its plugin "
            "(docs/quickstart.md, Upgrading), or load the rbd kernel module for krbd",
            extra=fields(mounter=mapper, selection=selection),
        )


def resolve_at_start(choice: MapperChoice) -> str | None:
    """Make the node default now rather than at the first NodeStageVolume, so the log and
    the metric show it from start-up. A node that can map with nothing is logged as an error
    but keeps serving: StorageClasses may still name a mapper, and the next stage request
    probes again (a module loaded meanwhile is picked up)."""
    try:
        return choice.default()
    except CephCSIError as error:
        log.error("no usable default mapper on this node", extra=fields(error=str(error)))
        return None
