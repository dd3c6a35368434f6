"""Which mapper maps a volume.

`--mounter=auto` (the default) picks the best mapper this node supports, once, and logs why:
  1. krbd    if /sys/bus/rbd exists or `modprobe rbd` succeeds (kernel client: fastest, and
             the mapping survives plugin restarts);
  2. rbd-nbd if the nbd driver is there (/sys/module/nbd, /dev/nbd0, or `modprobe nbd`) and
             rbd-nbd is installed;
  3. fuse    if /dev/fuse, rbd-fuse, losetup and /dev/loop-control are there.
A node with none of them cannot map RBD images; the error says what to install.
A `mounter` in the volume context (StorageClass parameter) overrides the node default; then
a mapper the node lacks is an error, not a silent fallback — the StorageClass asked for it.
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

log = logging.getLogger(__name__)

AUTO = "auto"
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
                    self._default, skipped = choose_auto(self.probe)
                    log.info("mounter chosen automatically", extra=fields(mounter=self._default, unavailable=skipped))
                else:
                    self._default = normalize(self.configured, "--mounter")
            return self._default

    def for_volume(self, requested: str) -> str:
        if requested.strip():
            return normalize(requested, "volume context mounter")
        return self.default()
