"""Owner metadata written straight to a new image's header (cephcsi.ceph.image_metadata
`set_on_header`) against a real OSD: librbd reads it back as the image's metadata, and a write
that comes after the image is gone fails instead of creating a stray header object."""
from __future__ import annotations

import uuid

import pytest
import rados
import rbd

from cephcsi.ceph import image_metadata
from cephcsi.errors import NotFound

pytestmark = [pytest.mark.integration, pytest.mark.ceph]

OWNER = {"csi.storage.k8s.io/pvc/name": "data", "csi.storage.k8s.io/pvc/namespace": "shop"}


def test_metadata_written_to_the_header_is_what_librbd_lists(io: rados.Ioctx) -> None:
    name = f"meta-{uuid.uuid4().hex[:12]}"
    rbd.RBD().create(io, name, 64 << 20, features=rbd.RBD_FEATURE_LAYERING)
    try:
        with rbd.Image(io, name, read_only=True) as opened:
            image_id = opened.id()
        image_metadata.set_on_header(io, name, image_id, OWNER)
        assert image_metadata.read(io, name) == OWNER
        with rbd.Image(io, name, read_only=True) as opened:
            assert {key: opened.metadata_get(key) for key in OWNER} == OWNER
    finally:
        rbd.RBD().remove(io, name)


def test_read_keeps_empty_values_and_every_pairing(io: rados.Ioctx) -> None:
    """librbd's Python metadata_list() drops an empty value and shifts every later value onto
    the previous key; ControllerPublish writes empty values (ceph-csi's clientaddress keys), and
    an encrypted volume's wrapped passphrase sorts after them."""
    name = f"meta-{uuid.uuid4().hex[:12]}"
    wanted = {".rbd.csi.ceph.com/clientaddress/vol/node-a": "", "rbd.csi.ceph.com/dek": '{"dek":"x","nonce":"y"}',
              "rbd.csi.ceph.com/encrypted": "encryptionPrepared", "z-last": "kept"}
    rbd.RBD().create(io, name, 64 << 20, features=rbd.RBD_FEATURE_LAYERING)
    try:
        with rbd.Image(io, name) as opened:
            for key, value in wanted.items():
                opened.metadata_set(key, value)
            image_id = opened.id()
        assert image_metadata.read(io, name) == wanted
        with rbd.Image(io, name, read_only=True) as opened:
            assert {key: opened.metadata_get(key) for key in wanted} == wanted
        rbd.RBD().trash_move(io, name, 0)
        assert image_metadata.read(io, name, image_id=image_id) == wanted  # in the trash, by id
        assert image_metadata.read(io, name) == {}  # no name any more
        rbd.RBD().trash_remove(io, image_id, force=True)
        assert image_metadata.read(io, name, image_id=image_id) == {}
    except BaseException:
        try:
            rbd.RBD().remove(io, name)
        except rbd.ImageNotFound:
            pass
        raise


def test_a_write_after_the_image_is_gone_creates_no_header(io: rados.Ioctx) -> None:
    name = f"meta-{uuid.uuid4().hex[:12]}"
    rbd.RBD().create(io, name, 64 << 20, features=rbd.RBD_FEATURE_LAYERING)
    with rbd.Image(io, name, read_only=True) as opened:
        image_id = opened.id()
    rbd.RBD().remove(io, name)
    with pytest.raises(NotFound):
        image_metadata.set_on_header(io, name, image_id, OWNER)
    with pytest.raises(rados.ObjectNotFound):
        io.stat(f"rbd_header.{image_id}")
