"""Make each inconsistency the audit knows on purpose, as client.admin, in a fresh rados
namespace (so other tests' images in the shared pool are not seen).

States librbd leaves when killed inside a call are written as the exact objects/omap values
librbd writes (see cephcsi/ceph/imagestate.py; the trash encoding is checked against an entry
librbd itself wrote, in `Seeder.check_trash_encoding`).
"""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
import uuid as uuidlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import rados
import rbd

from cephcsi.ceph import encoding, image_create
from cephcsi.volumes.journal import PLANNED_IMAGE_ID, VOLUMES, JournalKind
from tests.ceph.fixtures import CephTestCluster

NORMAL, MOVING, REMOVING = 0, 1, 2
MIB = 1 << 20


def trash_spec(name: str, state: int, deleted: float, deferred: float) -> bytes:
    """cls_rbd TrashImageSpec v2: source USER, name, deletion and deferment time, state."""
    body = bytes([0]) + encoding.string(name)
    for moment in (deleted, deferred):
        body += struct.pack("<II", int(moment), int((moment % 1) * 1e9))
    body += bytes([state])
    return encoding.versioned(body, version=2)


def new_uuid() -> str:
    return str(uuidlib.uuid4())


@dataclass
class Seeder:
    io: Any
    instance: str = "default"
    prefix: str = "csi-vol-"
    kind: JournalKind = VOLUMES
    """The journal key, record and the methods built on them write: SNAPSHOTS with prefix csi-snap-."""

    def image_name(self, uuid: str) -> str:
        return f"{self.prefix}{uuid}"

    # --- the journal -------------------------------------------------------------------
    def set_omap(self, obj: str, values: Mapping[str, str | bytes]) -> None:
        with rados.WriteOpCtx() as op:
            raw = tuple(v if isinstance(v, bytes) else v.encode() for v in values.values())
            self.io.set_omap(op, tuple(values), raw)
            self.io.operate_write_op(op, obj)

    def remove_omap(self, obj: str, keys: tuple[str, ...]) -> None:
        with rados.WriteOpCtx() as op:
            self.io.remove_omap_keys(op, keys)
            self.io.operate_write_op(op, obj)

    def key(self, name: str, uuid: str) -> None:
        self.set_omap(f"{self.kind.directory_prefix}{self.instance}", {f"{self.kind.name_key_prefix}{name}": uuid})

    def record(self, uuid: str, name: str, image_id: str = "") -> None:
        values = {self.kind.name_field: name, "csi.imagename": self.image_name(uuid)}
        if image_id:
            values["csi.imageid"] = image_id
        self.set_omap(f"{self.kind.record_prefix}{uuid}", values)

    def empty_record(self, uuid: str) -> None:
        """What Journal.locked leaves when its holder is killed before writing the record."""
        self.io.lock_exclusive(f"{self.kind.record_prefix}{uuid}", "cephcsi.journal", "seed", duration=1)
        self.io.unlock(f"{self.kind.record_prefix}{uuid}", "cephcsi.journal", "seed")

    # --- images ------------------------------------------------------------------------
    def image(self, name: str) -> str:
        rbd.RBD().create(self.io, name, 4 * MIB, old_format=False, features=rbd.RBD_FEATURE_LAYERING)
        with rbd.Image(self.io, name) as image:
            image.write(b"data" * 1024, 0)
            return str(image.id())

    def volume(self, name: str) -> tuple[str, str]:
        """A complete, healthy volume: key → record → image. Returns (uuid, image id)."""
        uuid = new_uuid()
        self.key(name, uuid)
        self.record(uuid, name)
        image_id = self.image(self.image_name(uuid))
        self.record(uuid, name, image_id)
        return uuid, image_id

    def snapshot(self, name: str) -> tuple[str, str]:
        """A complete snapshot (kind SNAPSHOTS): key → record → image with its restore point, the
        RBD snapshot CreateSnapshot cuts on it under the image's own name. Returns (uuid, image id)."""
        uuid, image_id = self.volume(name)
        with rbd.Image(self.io, self.image_name(uuid)) as image:
            image.create_snap(self.image_name(uuid))
        return uuid, image_id

    def partial_create(self, name: str, with_id_object: bool) -> str:
        """The directory entry (and id object) of a create killed before the header."""
        image_id = self.image(name)
        self.io.remove_object(f"rbd_header.{image_id}")
        self.io.remove_object(f"rbd_data.{image_id}.0000000000000000")
        if not with_id_object:
            self.io.remove_object(f"rbd_id.{name}")
        return image_id

    def planned_header(self, uuid: str, name: str) -> str:
        """A record planning an image id, and of that image only the header: what a create that
        writes the image itself (cephcsi.ceph.image_create) leaves when killed between its
        writes. Returns the id."""
        image_id = image_create.new_image_id()
        self.set_omap(f"{self.kind.record_prefix}{uuid}", {self.kind.name_field: name,
                                                           "csi.imagename": self.image_name(uuid),
                                                           PLANNED_IMAGE_ID: image_id})
        image_create.write(self.io, image_create.NewImage(self.image_name(uuid), image_id, 4 * MIB,
                                                          rbd.RBD_FEATURE_LAYERING, 22))
        self.io.remove_object(f"rbd_id.{self.image_name(uuid)}")
        self.io.execute("rbd_directory", "rbd", "dir_remove_image",
                        encoding.string(self.image_name(uuid)) + encoding.string(image_id))
        return image_id

    def owned(self, name: str, pvc_namespace: str, pvc_name: str, pv_name: str) -> None:
        """The owner metadata CreateVolume stores with --extra-create-metadata (ceph-csi's keys)."""
        with rbd.Image(self.io, name) as image:
            image.metadata_set("csi.storage.k8s.io/pvc/name", pvc_name)
            image.metadata_set("csi.storage.k8s.io/pvc/namespace", pvc_namespace)
            image.metadata_set("csi.storage.k8s.io/pv/name", pv_name)

    def trashed(self, name: str, state: int, owner: tuple[str, str, str] | None = None) -> str:
        """An image in the trash (moved by librbd), then set to `state` as a kill leaves it."""
        image_id = self.image(name)
        if owner is not None:
            self.owned(name, *owner)
        rbd.RBD().trash_move(self.io, name, 0)
        if state != NORMAL:
            now = time.time()
            self.set_omap("rbd_trash", {f"id_{image_id}": trash_spec(name, state, now, now)})
        return image_id

    def half_moved_with_name(self, name: str) -> str:
        """The MOVING shape seen most often: directory entry, id object and header still
        there, and a MOVING trash entry (trash_move killed after its first step)."""
        image_id = self.image(name)
        now = time.time()
        self.set_omap("rbd_trash", {f"id_{image_id}": trash_spec(name, MOVING, now, now)})
        return image_id

    def check_trash_encoding(self) -> None:
        """The encoder above writes byte for byte what librbd writes."""
        name = f"enc-{uuidlib.uuid4().hex[:8]}"
        image_id = self.image(name)
        rbd.RBD().trash_move(self.io, name, 0)
        with rados.ReadOpCtx() as op:
            items, _ = self.io.get_omap_vals_by_keys(op, (f"id_{image_id}",))
            self.io.operate_read_op(op, "rbd_trash")
            raw = dict(items)[f"id_{image_id}"]
        deleted = struct.unpack_from("<II", raw, 11 + len(name))
        moment = deleted[0] + deleted[1] / 1e9
        expected = trash_spec(name, NORMAL, moment, moment)
        assert raw[:-17] == expected[:-17] and raw[-1] == 0 and len(raw) == len(expected), (raw.hex(), expected.hex())
        rbd.RBD().trash_remove(self.io, image_id, force=True)


@contextmanager
def admin_namespace(cluster: CephTestCluster, namespace: str) -> Iterator[Any]:
    client = rados.Rados(rados_id="admin", conf={"mon_host": cluster.mon_host, "key": cluster.admin_key})
    client.connect(timeout=30)
    io = client.open_ioctx(cluster.pool)
    try:
        rbd.RBD().namespace_create(io, namespace)
        io.set_namespace(namespace)
        yield io
    finally:
        io.close()
        client.shutdown()


def write_config(cluster: CephTestCluster, path: str, namespace: str, cluster_id: str = "") -> str:
    """config.json mapping `cluster_id` (default: the fixture's) to the namespace, as ceph-csi
    maps one clusterID to one rados namespace."""
    doc = [{"clusterID": cluster_id or cluster.cluster_id, "monitors": [cluster.mon_host],
            "rbd": {"radosNamespace": namespace}}]
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(doc, handle)
    return path


def run_audit(cluster: CephTestCluster, config: str, *args: str, cluster_id: str = "",
              timeout: float = 180) -> tuple[int, dict[str, Any], str]:
    """`cephcsi audit --json` as an operator runs it: a separate process, key in the environment."""
    argv = [sys.executable, "-m", "cephcsi", "audit", "--config-file", config,
            "--cluster-id", cluster_id or cluster.cluster_id,
            "--pool", cluster.pool, "--user", cluster.user, "--json", *args]
    env = {**os.environ, "CEPHCSI_AUDIT_KEY": cluster.key}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    assert cluster.key not in done.stdout + done.stderr, "the cephx key was printed"
    assert done.returncode in (0, 1), (done.returncode, done.stderr)
    return done.returncode, json.loads(done.stdout), done.stderr
