"""Read, set and remove RBD image metadata keys on the image header directly, one RADOS operation
each, atomically for several keys (for the publish records; keys outside librbd's `conf_`
namespace only). Design: docs/design/ceph-access.md.
"""
from __future__ import annotations

import errno
from collections.abc import Iterable, Mapping

import rados

from cephcsi.ceph import encoding, image_metadata, images, omap
from cephcsi.ceph.errors import ceph_call, error_number
from cephcsi.errors import NotFound

_PREFIX = image_metadata.METADATA_PREFIX


def image_id(io: rados.Ioctx, name: str) -> str:
    found = images.lookup_id(io, name)
    if not found:
        raise NotFound(f"image {name!r} does not exist")
    return found


def read(io: rados.Ioctx, name: str, header_id: str) -> dict[str, str]:
    """Every metadata key of the image; NotFound when its header is gone."""
    found = image_metadata.read_header(io, name, header_id)
    if found is None:
        raise NotFound(f"image {name!r} does not exist")
    return found


def set_keys(io: rados.Ioctx, name: str, header_id: str, values: Mapping[str, str]) -> None:
    """Set every key in one class call; NotFound when the header is gone."""
    image_metadata.set_on_header(io, name, header_id, values)


def remove_keys(io: rados.Ioctx, name: str, header_id: str, keys: Iterable[str]) -> None:
    """Remove the keys in one operation (absent keys are no error); NotFound when the header is gone."""
    wanted = tuple(_PREFIX + key for key in keys)
    if wanted:
        omap.remove_keys(io, f"rbd_header.{header_id}", wanted)


def read_guarded(io: rados.Ioctx, name: str, header_id: str, guard_key: str) -> tuple[dict[str, str], str]:
    """Every metadata key of the image, and the value of the header's own omap key `guard_key`
    ('' when absent), read in one operation so the pair is one state of the header (for
    `set_keys_if`); NotFound when the header is gone."""
    with ceph_call("read image metadata", f"image {name!r}"):
        try:
            with rados.ReadOpCtx() as op:
                items, _ = io.get_omap_vals(op, "", _PREFIX, -1)
                guard, _ = io.get_omap_vals_by_keys(op, (guard_key,))
                io.operate_read_op(op, f"rbd_header.{header_id}")
                raw = [(key, bytes(value or b"")) for key, value in items]
                token = {key: bytes(value or b"") for key, value in guard}.get(guard_key, b"")
        except rados.ObjectNotFound:
            raise NotFound(f"image {name!r} does not exist") from None
    return {key[len(_PREFIX):]: value.decode() for key, value in raw}, token.decode()


def set_keys_if(io: rados.Ioctx, name: str, header_id: str, values: Mapping[str, str], guard_key: str,
                expected: str, new: str) -> bool:
    """Set the metadata `values` and the header's omap key `guard_key` to `new`, in one
    operation that first asserts `guard_key` still holds `expected` (as `read_guarded` saw it;
    '' for absent). False, writing nothing, when another writer changed it since; NotFound when
    the header is gone (comparing a missing object's key fails with ENOENT: nothing is created)."""
    image_metadata.check_settable(values)
    with ceph_call("set image metadata", f"image {name!r}"):
        with rados.WriteOpCtx() as op:
            op.omap_cmp(guard_key, expected, rados.LIBRADOS_CMPXATTR_OP_EQ)
            op.execute("rbd", "metadata_set", encoding.string_map(dict(values)))
            io.set_omap(op, (guard_key,), (new.encode(),))
            try:
                io.operate_write_op(op, f"rbd_header.{header_id}")
            except rados.Error as error:
                if error_number(error) == errno.ECANCELED:
                    return False
                raise
    return True
