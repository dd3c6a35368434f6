"""The rotation's step order (cephcsi.node.key_rotation.rotate) over a model of a LUKS header that
refuses what cryptsetup refuses (adding to a used slot, authorising with a passphrase that opens
no slot, clearing a slot with only its own passphrase). A crash is injected after every header or
KMS write in turn: the passphrase the KMS holds must open a slot at that point, and a re-run must
end with one fresh passphrase in slot 0 and in the KMS, and every earlier passphrase gone."""
from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from cephcsi.encryption.spec import BLOCK, EncryptionSpec
from cephcsi.errors import FailedPrecondition, InvalidArgument
from cephcsi.node.key_rotation import BACKUP, PRIMARY, refuse_default, rotate

pytestmark = pytest.mark.unit


class Crash(Exception):
    pass


class Countdown:
    """Raises Crash at the n-th write (header or KMS); n = -1 never."""

    def __init__(self, n: int = -1) -> None:
        self.left = n

    def tick(self) -> None:
        if self.left == 0:
            raise Crash()
        self.left -= 1


class Header:
    def __init__(self, crash: Countdown, slots: dict[int, str] | None = None) -> None:
        self.slots = dict(slots or {PRIMARY: "p0"})
        self.crash = crash

    def active(self) -> set[int]:
        return set(self.slots)

    def opens(self, passphrase: str, slot: int | None = None) -> bool:
        if slot is None:
            return passphrase in self.slots.values()
        return self.slots.get(slot) == passphrase

    def add(self, existing: str, new: str, slot: int) -> None:
        assert slot not in self.slots, "cryptsetup refuses a used slot"
        assert self.opens(existing), "cryptsetup: no key available with this passphrase"
        self.slots[slot] = new
        self.crash.tick()

    def kill(self, existing: str, slot: int) -> None:
        assert slot in self.slots
        assert any(s != slot and k == existing for s, k in self.slots.items()), \
            "cryptsetup: the passphrase must open a slot that stays"
        del self.slots[slot]
        self.crash.tick()


class Store:
    def __init__(self, crash: Countdown, passphrase: str = "p0") -> None:
        self.value = passphrase
        self.crash = crash

    def current(self) -> str:
        return self.value

    def replace(self, passphrase: str) -> None:
        self.value = passphrase
        self.crash.tick()


def fresh() -> Callable[[], str]:
    counter = itertools.count(1)
    return lambda: f"n{next(counter)}"


def test_rotation_moves_slot_0_and_the_kms_to_a_new_passphrase() -> None:
    crash = Countdown()
    header, store = Header(crash), Store(crash)
    rotate(header, store, fresh(), "vol", reach=lambda point: None)
    assert store.value == "n1" and header.slots == {PRIMARY: "n1"}


def test_a_kms_passphrase_that_opens_nothing_changes_nothing() -> None:
    crash = Countdown()
    header, store = Header(crash), Store(crash, "other")
    with pytest.raises(FailedPrecondition, match="opens no keyslot"):
        rotate(header, store, fresh(), "vol", reach=lambda point: None)
    assert header.slots == {PRIMARY: "p0"} and store.value == "other"


def test_other_slots_holding_the_old_passphrase_are_cleared_and_a_recovery_key_is_kept() -> None:
    crash = Countdown()
    header, store = Header(crash, {PRIMARY: "p0", 2: "p0", 3: "recovery"}), Store(crash)
    rotate(header, store, fresh(), "vol", reach=lambda point: None)
    assert header.slots == {PRIMARY: "n1", 3: "recovery"}


@pytest.mark.parametrize("start", [{PRIMARY: "p0"}, {PRIMARY: "stale", BACKUP: "p0"}, {PRIMARY: "p0", BACKUP: "stale"},
                                   {BACKUP: "p0"}, {3: "p0"}])
@pytest.mark.parametrize("kill_at", range(8))
def test_a_crash_after_any_write_leaves_the_kms_key_opening_a_slot_and_a_rerun_completes(
        start: dict[int, str], kill_at: int) -> None:
    crash = Countdown(kill_at)
    header, store = Header(crash, start), Store(crash)
    keys = fresh()
    try:
        rotate(header, store, keys, "vol", reach=lambda point: None)
    except Crash:
        assert header.opens(store.value), (kill_at, header.slots, store.value)
    crash.left = -1
    rotate(header, store, keys, "vol", reach=lambda point: None)
    assert header.slots == {PRIMARY: store.value}
    assert store.value.startswith("n") and not header.opens("p0") and not header.opens("stale")


@pytest.mark.parametrize("point", ["key-rotation.after-backup", "key-rotation.after-new-slot",
                                   "key-rotation.after-kms"])
def test_the_failpoints_sit_between_the_writes_they_name(point: str) -> None:
    crash = Countdown()
    header, store = Header(crash), Store(crash)

    def reach(name: str) -> None:
        if name == point:
            raise Crash()

    with pytest.raises(Crash):
        rotate(header, store, fresh(), "vol", reach=reach)
    expected = {
        "key-rotation.after-backup": ({PRIMARY: "p0", BACKUP: "p0"}, "p0"),
        "key-rotation.after-new-slot": ({PRIMARY: "n1", BACKUP: "p0"}, "p0"),
        "key-rotation.after-kms": ({PRIMARY: "n1", BACKUP: "p0"}, "n1"),
    }[point]
    assert (header.slots, store.value) == expected


def test_the_default_kms_is_refused_with_the_reason() -> None:
    with pytest.raises(InvalidArgument, match="encryptionPassphrase, shared by every volume"):
        refuse_default(EncryptionSpec(BLOCK, "default"))
    refuse_default(EncryptionSpec(BLOCK, "meta"))


def test_a_lapsing_lock_stops_the_rotation_before_the_kms_write() -> None:
    crash = Countdown()
    header, store = Header(crash), Store(crash)

    def lapsed() -> None:
        raise Crash()

    with pytest.raises(Crash):
        rotate(header, store, fresh(), "vol", reach=lambda point: None, still_locked=lapsed)
    assert store.value == "p0" and header.opens("p0", BACKUP)
    rotate(header, store, fresh(), "vol", reach=lambda point: None)
    assert header.slots == {PRIMARY: store.value} and store.value != "p0"
