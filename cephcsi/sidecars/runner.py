"""Stops the embedded sidecar loops in order (the reverse of their start).

The composition root (`cephcsi.cli.sidecar_wiring.start_sidecars`) builds and starts the loops
chosen with --sidecars and adds them here. Controller mode: provisioner and attacher run only
while this replica holds the Lease (informers run everywhere so a standby's caches are warm).
Node mode: the registrar.
"""
from __future__ import annotations

import logging
from typing import Protocol

log = logging.getLogger(__name__)


class Loop(Protocol):
    def stop(self) -> None: ...


class SidecarRunner:
    def __init__(self) -> None:
        self._loops: list[Loop] = []

    def add(self, loop: Loop) -> None:
        self._loops.append(loop)

    def stop(self) -> None:
        for loop in reversed(self._loops):
            try:
                loop.stop()
            except Exception:  # noqa: BLE001 - keep stopping the others
                log.exception("stopping a sidecar loop failed")
