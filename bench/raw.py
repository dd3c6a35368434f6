"""The floor: python-rbd calls with no driver around them, on one shared rados connection
(threads share it, as the driver's threads share its cached connection), as the same cephx user
the driver uses, so caps and auth are identical."""
from __future__ import annotations

import json
import time
import uuid

import rados
import rbd

from tests.ceph.fixtures import CephTestCluster


class RawRbd:
    def __init__(self, cluster: CephTestCluster, size_bytes: int) -> None:
        self.pool = cluster.pool
        self.size = size_bytes
        self.client = rados.Rados(rados_id=cluster.user, conf={"mon_host": cluster.mon_host, "key": cluster.key})
        self.client.connect(timeout=30)
        self.io = self.client.open_ioctx(cluster.pool)
        self.rbd = rbd.RBD()

    def close(self) -> None:
        self.io.close()
        self.client.shutdown()

    @staticmethod
    def new_name() -> str:
        return f"bench-raw-{uuid.uuid4()}"

    # The timed operations --------------------------------------------------------------------------

    def create(self, name: str) -> str:
        """RBD().create of a thin image with the driver's default features (layering)."""
        self.rbd.create(self.io, name, self.size, old_format=False, features=rbd.RBD_FEATURE_LAYERING)
        return name

    def remove(self, name: str) -> None:
        """RBD().remove: synchronous, O(image objects) — deletes every possible data object."""
        self.rbd.remove(self.io, name)

    def trash_move_remove(self, name_and_id: tuple[str, str]) -> None:
        """trash_move then trash_remove: the same purge work, routed through the trash."""
        name, image_id = name_and_id
        self.rbd.trash_move(self.io, name, 0)
        self.rbd.trash_remove(self.io, image_id, force=True)

    def trash_move_mgr_purge(self, name_and_id: tuple[str, str]) -> None:
        """trash_move then hand the purge to the mgr — the Ceph work the driver's delete does
        (minus its journal and watcher check); the purge itself happens later."""
        name, image_id = name_and_id
        self.rbd.trash_move(self.io, name, 0)
        command = json.dumps({"prefix": "rbd task add trash remove", "image_id_spec": f"{self.pool}/{image_id}"})
        ret, _, status = self.client.mgr_command(command, b"", timeout=30)
        if ret != 0:
            raise RuntimeError(f"mgr refused the trash purge: {ret} {status}")

    def open_readonly(self, name: str) -> None:
        """A read-only open + watchers_list, as the driver's delete does to check an image is
        unused (for the op count of an image open)."""
        with rbd.Image(self.io, name, read_only=True) as image:
            list(image.watchers_list())

    # Untimed helpers -------------------------------------------------------------------------------

    def ids(self, names: list[str]) -> list[tuple[str, str]]:
        """(name, image id) for each name, from one list2 call."""
        by_name = {entry["name"]: entry["id"] for entry in self.rbd.list2(self.io)}
        return [(name, by_name[name]) for name in names]

    def images(self) -> list[str]:
        return list(self.rbd.list(self.io))

    def trash_count(self) -> int:
        """Entries in the RBD trash, from the `rbd_trash` directory's omap keys: the binding's
        trash_list fails (IndexError) on a USER_PARENT entry (a deleted parent that librbd keeps
        until its clones go), which snapshot deletes leave for a moment."""
        with rados.ReadOpCtx() as op:
            keys, _ = self.io.get_omap_keys(op, "", 1 << 16)
            try:
                self.io.operate_read_op(op, "rbd_trash")
            except rados.ObjectNotFound:
                return 0
            return sum(1 for key, _ in keys if key.startswith("id_"))

    def wait_trash_empty(self, timeout_s: float) -> float:
        """Seconds until the trash is empty (the mgr finished purging); TimeoutError after timeout_s."""
        started = time.perf_counter()
        deadline = started + timeout_s
        while self.trash_count():
            if time.perf_counter() > deadline:
                raise TimeoutError(f"trash still holds {self.trash_count()} images after {timeout_s:.0f}s")
            time.sleep(0.05)
        return time.perf_counter() - started
