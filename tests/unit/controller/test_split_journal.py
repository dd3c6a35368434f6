"""ceph-csi's journal values for volumes journaled in another pool than their image
(cephcsi.volumes.split_journal): the pool id prefix, and malformed values as clear errors."""
from __future__ import annotations

import pytest

from cephcsi.errors import CephCSIError, FailedPrecondition
from cephcsi.volumes.journal import VOLUMES
from cephcsi.volumes.split_journal import (
    JOURNAL_POOL,
    NameValue,
    encode_pool_id,
    parse_name_value,
    parse_pool_id,
    record_of,
)

pytestmark = pytest.mark.unit

UUID = "8f0da8c2-ec58-4d67-9cf6-8ab296c1115d"


def test_a_plain_uuid_is_a_volume_in_the_name_keys_own_pool() -> None:
    value = parse_name_value(UUID, "key")
    assert value == NameValue(UUID) and value.encode() == UUID
    assert not value.elsewhere(3)


def test_the_pool_prefix_is_sixteen_hex_digits_of_the_image_pool_id() -> None:
    # What ceph-csi's ReserveName writes for image pool id 7 (8 big-endian bytes, hex).
    raw = f"0000000000000007/{UUID}"
    value = parse_name_value(raw, "key")
    assert value == NameValue(UUID, 7)
    assert value.encode() == raw
    assert value.elsewhere(1) and not value.elsewhere(7)


def test_upper_case_hex_is_read_as_go_reads_it() -> None:
    assert parse_name_value(f"00000000000000FF/{UUID}", "key").image_pool_id == 255


@pytest.mark.parametrize("pool_id", [0, 1, 255, 2**32, 2**63 - 1])
def test_pool_ids_round_trip(pool_id: int) -> None:
    text = encode_pool_id(pool_id)
    assert len(text) == 16 and parse_pool_id(text, "csi.journalpool") == pool_id


@pytest.mark.parametrize("raw, why", [
    ("", "neither a uuid"),
    ("not-a-uuid", "neither a uuid"),
    ("x" * 36, "not a uuid"),
    (f"7/{UUID}", "16 hex digits"),
    (f"000000000000000g/{UUID}", "16 hex digits"),
    (f"00000000000000007/{UUID}", "16 hex digits"),
    (f"8000000000000000/{UUID}", "negative"),
    ("0000000000000007/not-a-uuid", "not a uuid"),
    (f"0000000000000007/{UUID}/extra", "not a uuid"),
])
def test_malformed_values_are_a_clear_failed_precondition(raw: str, why: str) -> None:
    with pytest.raises(FailedPrecondition) as raised:
        parse_name_value(raw, "csi.volumes.default/csi.volume.pvc-1")
    message = str(raised.value)
    assert why in message and "csi.volumes.default/csi.volume.pvc-1" in message and "cephcsi audit" in message
    assert isinstance(raised.value, CephCSIError)  # mapped to a gRPC code, never a traceback


def test_negative_pool_ids_are_never_encoded() -> None:
    with pytest.raises(ValueError):
        encode_pool_id(-1)


def test_a_record_reads_like_journal_read_and_keeps_the_journal_pool() -> None:
    record = record_of({"csi.volname": "pvc-1", "csi.imageid": "abc", JOURNAL_POOL: "0000000000000002",
                        "csi.volume.owner": "team-a"}, UUID, VOLUMES)
    assert record is not None
    assert (record.name, record.image_name, record.image_id) == ("pvc-1", f"csi-vol-{UUID}", "abc")
    assert record.get(JOURNAL_POOL) == "0000000000000002" and record.get("csi.volume.owner") == "team-a"
    # ceph-csi's image-pool object of such a volume: empty, or only csi.imageid: no record.
    assert record_of({}, UUID, VOLUMES) is None
    assert record_of({"csi.imageid": "abc"}, UUID, VOLUMES) is None
