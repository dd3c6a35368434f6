"""Raw librbd steps for section 7: the floors of CreateSnapshot, restore, clone and expansion,
and the four ways a CSI snapshot could map onto RBD (#14 point 2), all without the driver.

Each timed call includes the image opens it needs (a snapshot or a resize cannot be made
without opening the image read-write; a clone opens its parent inside librbd), because the
driver has to make them too. Names are kept for the untimed clean-up.

Mapping options (one `snapshot` and one `restore` call each):
  a  clone image per snapshot (ceph-csi's and ours): temporary snapshot on the source → clone v2
     → temporary snapshot removed (it moves to the trash namespace) → restore point on the clone;
     restore = clone v2 of the restore point;
  b  bare RBD snapshot on the source; restore = clone v2 of it (no protection needed);
  c  clone v1: snapshot + protect; restore = clone v1 (needs the protected snapshot);
  d  full copy (`Image.copy` from a snapshot), restore = another full copy: no layering at all.
"""
from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import rados
import rbd

from bench.raw import RawRbd

TWO_GIB = 2 << 30
OPTIONS = ("a", "b", "c", "d")
OPTION_LABELS = {
    "a": "(a) clone image per snapshot (ours, ceph-csi)",
    "b": "(b) bare RBD snapshot on the volume, clone v2",
    "c": "(c) protected snapshot, clone v1 (older ceph-csi)",
    "d": "(d) full copy (Image.copy)",
}


MON_SETTLE_S = 0.2
"""Untimed pause before every timed call. An RBD snapshot create is a monitor proposal (a new
osdmap with the pool's snap seq), and the monitor batches proposals: one issued right after the
previous one waits out `paxos propose interval` (0.1 s on the test cluster, 1 s by default).
Measured on this cluster: 104 ms back to back, 83 / 53 / 23 ms 20 / 50 / 80 ms after the last,
52-63 ms from an idle monitor. Without the pause a call's latency would depend on what the call
before it did, which differs between the driver's sequence and the raw one; with it every call
starts from an idle monitor and pays only the waits it causes itself (the second snapshot of a
CreateSnapshot waits for the first's proposal)."""


def timed(call: Callable[[], object], settle_s: float = MON_SETTLE_S) -> float:
    """Seconds one call took (perf_counter, client side), after an untimed `settle_s` pause."""
    time.sleep(settle_s)
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def _tag() -> str:
    return uuid.uuid4().hex[:10]


@dataclass
class Made:
    """What the raw side created, for the clean-up: clones first, then the images they read."""

    children: list[str] = field(default_factory=list)
    parents: list[str] = field(default_factory=list)
    source_snaps: list[tuple[str, str, bool]] = field(default_factory=list)
    """(image, snapshot, protected) left on a source by options b and c."""


class RawSnapshots:
    """The raw steps on one connection (`raw`, clone format 2) and one clone-format-1
    connection for option c."""

    def __init__(self, raw: RawRbd, v1: RawRbd) -> None:
        self.raw, self.v1 = raw, v1
        self.made = Made()

    # ---- the floors of the driver's calls ----------------------------------------------------------

    def snapshot_image(self, source: str) -> str:
        """Option a's snapshot, the floor of CreateSnapshot: the snapshot image's name."""
        tag = _tag()
        name, temp = f"bench-rs-{tag}", f"t-{tag}"
        io, api = self.raw.io, self.raw.rbd
        with rbd.Image(io, source) as image:
            image.create_snap(temp)
            api.clone(io, source, temp, io, name, features=rbd.RBD_FEATURE_LAYERING | rbd.RBD_FEATURE_DEEP_FLATTEN)
            image.remove_snap(temp)
        self.made.parents.append(name)
        with rbd.Image(io, name) as image:
            image.create_snap(name)
        return name

    def restore(self, snapshot_image: str) -> str:
        """The floor of a restore: one clone v2 of the snapshot image's restore point."""
        name = f"bench-rr-{_tag()}"
        self.raw.rbd.clone(self.raw.io, snapshot_image, snapshot_image, self.raw.io, name,
                           features=rbd.RBD_FEATURE_LAYERING)
        self.made.children.append(name)
        return name

    def clone_volume(self, source: str) -> str:
        """The floor of a volume clone: temporary snapshot → clone v2 → snapshot removed."""
        tag = _tag()
        name, temp = f"bench-rc-{tag}", f"c-{tag}"
        io = self.raw.io
        with rbd.Image(io, source) as image:
            image.create_snap(temp)
            self.raw.rbd.clone(io, source, temp, io, name, features=rbd.RBD_FEATURE_LAYERING)
            image.remove_snap(temp)
        self.made.children.append(name)
        return name

    def resize(self, name: str) -> None:
        """The floor of ControllerExpandVolume 1 → 2 GiB: open read-write + `Image.resize`."""
        with rbd.Image(self.raw.io, name) as image:
            image.resize(TWO_GIB)

    # ---- the mapping options -----------------------------------------------------------------------

    def snapshot_as(self, option: str, source: str) -> str:
        """A snapshot of `source` the way `option` maps it; what a restore clones from."""
        if option == "a":
            return self.snapshot_image(source)
        tag = _tag()
        snap = f"s-{tag}"
        if option == "b":
            with rbd.Image(self.raw.io, source) as image:
                image.create_snap(snap)
            self.made.source_snaps.append((source, snap, False))
            return snap
        if option == "c":
            with rbd.Image(self.v1.io, source) as image:
                image.create_snap(snap)
                image.protect_snap(snap)
            self.made.source_snaps.append((source, snap, True))
            return snap
        if option == "d":
            name = f"bench-rd-{tag}"
            with rbd.Image(self.raw.io, source) as image:
                image.create_snap(snap)
                try:
                    image.set_snap(snap)
                    image.copy(self.raw.io, name)
                finally:
                    image.set_snap(None)
                    image.remove_snap(snap)
            self.made.parents.append(name)
            return name
        raise ValueError(f"unknown mapping option {option!r}")

    def restore_as(self, option: str, source: str, snapshot: str) -> str:
        """A volume restored from `snapshot` (what snapshot_as returned) the way `option` does."""
        name = f"bench-rv-{_tag()}"
        if option == "a":
            return self.restore(snapshot)
        if option == "b":
            self.raw.rbd.clone(self.raw.io, source, snapshot, self.raw.io, name, features=rbd.RBD_FEATURE_LAYERING)
        elif option == "c":
            self.v1.rbd.clone(self.v1.io, source, snapshot, self.v1.io, name, features=rbd.RBD_FEATURE_LAYERING)
        elif option == "d":
            with rbd.Image(self.raw.io, snapshot, read_only=True) as image:
                image.copy(self.raw.io, name)
        else:
            raise ValueError(f"unknown mapping option {option!r}")
        self.made.children.append(name)
        return name

    # ---- clean-up ----------------------------------------------------------------------------------

    def cleanup(self) -> None:
        """Remove everything made so far, children before the images and snapshots they read."""
        io, api = self.raw.io, self.raw.rbd
        for name in self.made.children:
            api.remove(io, name)
        for source, taken, protected in self.made.source_snaps:
            with rbd.Image(io, source) as image:
                if protected:
                    image.unprotect_snap(taken)
                image.remove_snap(taken)
        for name in self.made.parents:
            with rbd.Image(io, name) as image:
                for point in list(image.list_snaps()):
                    if point.get("namespace", 0) == 0:
                        image.remove_snap(point["name"])
            api.remove(io, name)
        self.made = Made()


def footprint(raw: RawRbd, source: str) -> tuple[set[str], int]:
    """(images in the pool, snapshots of every namespace on `source`): what an option leaves."""
    with rbd.Image(raw.io, source, read_only=True) as image:
        snaps = len(list(image.list_snaps()))
    return set(raw.images()), snaps


def is_clone_v1(v1: RawRbd, source: str) -> bool:
    """True when the v1 connection really makes format-1 clones: it must refuse to clone an
    unprotected snapshot (format 2 would accept it)."""
    snap, name = f"v1check-{_tag()}", f"bench-v1check-{_tag()}"
    with rbd.Image(v1.io, source) as image:
        image.create_snap(snap)
        try:
            try:
                v1.rbd.clone(v1.io, source, snap, v1.io, name, features=rbd.RBD_FEATURE_LAYERING)
            except rbd.InvalidArgument:
                return True
            v1.rbd.remove(v1.io, name)
            return False
        finally:
            image.remove_snap(snap)


@dataclass
class DeleteOutcome:
    """What one snapshot leaves, and what deleting the source volume does to it, per option."""

    option: str
    images_per_snapshot: int
    """Images a snapshot adds to the pool."""
    source_snaps_per_snapshot: int
    """Snapshots (any namespace) a snapshot adds to its source, while it exists."""
    remove_result: str
    restore_after: str
    left_after_cleanup: str


def _result(call: Callable[[], object]) -> tuple[float, str]:
    started = time.perf_counter()
    try:
        call()
    except rbd.Error as error:
        return (time.perf_counter() - started) * 1000, f"refused: {type(error).__name__}"
    return (time.perf_counter() - started) * 1000, "ok"


def _in_trash(raw: RawRbd, image_id: str) -> bool:
    """Whether the RBD trash holds the image, from the `rbd_trash` directory's omap key (the
    binding's trash_list cannot name a USER_PARENT entry's source on Ceph 16 and fails)."""
    with rados.ReadOpCtx() as op:
        values, _ = raw.io.get_omap_vals_by_keys(op, (f"id_{image_id}",))
        try:
            raw.io.operate_read_op(op, "rbd_trash")
        except rados.ObjectNotFound:
            return False
        return bool(list(values))


def delete_source(snaps: RawSnapshots, option: str, settle_s: float = 5.0) -> DeleteOutcome:
    """On a fresh empty source: one snapshot the option's way (counting what it adds) and one
    volume restored from it; then `RBD.remove` of the source with
    rbd_move_parent_to_trash_on_remove (as the driver's connections set it); then whether a
    new restore from the snapshot still works; then the snapshot and restores are removed and
    whatever of the source stays behind (after `settle_s`) is counted, and then cleaned up."""
    raw = snaps.raw
    raw.client.conf_set("rbd_move_parent_to_trash_on_remove", "true")
    source = raw.create(f"bench-del-{option}-{_tag()}")
    (_, source_id), = raw.ids([source])
    images0, snaps0 = footprint(raw, source)
    snapshot = snaps.snapshot_as(option, source)
    images1, snaps1 = footprint(raw, source)
    snaps.restore_as(option, source, snapshot)
    remove_ms, removed = _result(lambda: raw.rbd.remove(raw.io, source))
    trashed = _in_trash(raw, source_id)
    if removed == "ok":
        remove_text = f"ok, {'moved to the RBD trash' if trashed else 'removed'} ({remove_ms:.1f} ms)"
        restore_ms, restored = _result(lambda: snaps.restore_as(option, source, snapshot))
        restore_text = f"ok ({restore_ms:.1f} ms)" if restored == "ok" else restored
        snaps.made.source_snaps = [s for s in snaps.made.source_snaps if s[0] != source]
    else:
        remove_text = f"{removed} ({remove_ms:.1f} ms)"
        restore_text = "— (the source is still there)"
    snaps.cleanup()
    if removed != "ok":
        raw.rbd.remove(raw.io, source)
    deadline = time.monotonic() + settle_s
    while _in_trash(raw, source_id) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _in_trash(raw, source_id)
    if left:  # e.g. a source kept in the trash by a user snapshot nobody can name any more
        raw.rbd.trash_restore(raw.io, source_id, source)
        with rbd.Image(raw.io, source) as image:
            for snap in list(image.list_snaps()):
                if snap.get("namespace", 0) == 0:
                    if image.is_protected_snap(snap["name"]):
                        image.unprotect_snap(snap["name"])
                    image.remove_snap(snap["name"])
        raw.rbd.remove(raw.io, source)
    return DeleteOutcome(option, len(images1 - images0), snaps1 - snaps0, remove_text, restore_text,
                         "nothing" if not left else f"the source, in the RBD trash (kept by {option}'s snapshot)")
