"""`cephcsi audit` on an encrypted volume whose create was killed between its image and its
passphrase: reported (never repaired: only the secret or the KMS can make the key)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from cephcsi.audit.classify import classify
from cephcsi.audit.model import Kind, RecordView, Snapshot
from tests.unit.audit.test_classify import IMG1, U1, healthy, only

pytestmark = pytest.mark.unit


def encrypted(state: str, leased: bool = False) -> Snapshot:
    return replace(healthy(), records={U1: RecordView(U1, "pvc-1", IMG1, "id1", encryption_kms="meta")},
                   encryption_states={IMG1: state},
                   leases_held=frozenset({f"csi.volume.{U1}"}) if leased else frozenset())


def test_an_encrypted_image_without_state_is_reported_not_repaired() -> None:
    finding = only(encrypted(""), Kind.KEY_MISSING)
    assert finding.fix is None and "retry" in finding.why_not and "'meta'" in finding.detail


@pytest.mark.parametrize("state", ["encryptionPrepared", "encrypted"])
def test_a_kept_key_is_no_finding(state: str) -> None:
    assert classify(encrypted(state)) == []


def test_a_create_holding_the_lease_is_in_flight_not_debris() -> None:
    assert classify(encrypted("", leased=True)) == []


def test_a_dangling_encrypted_record_is_not_removed_it_may_name_a_kept_key() -> None:
    snap = replace(healthy(), directory={}, id_objects={}, headers=frozenset(), pvs=(),
                   records={U1: RecordView(U1, "pvc-1", IMG1, "id1", encryption_kms="vault-1")})
    finding = only(snap, Kind.DANGLING_RECORD)
    assert finding.fix is None and "'vault-1'" in finding.why_not and "DeleteVolume" in finding.why_not


def test_a_dangling_record_of_the_default_kms_is_still_removed() -> None:
    snap = replace(healthy(), directory={}, id_objects={}, headers=frozenset(), pvs=(),
                   records={U1: RecordView(U1, "pvc-1", IMG1, "id1", encryption_kms="default")})
    assert only(snap, Kind.DANGLING_RECORD).fix is not None
