"""VolumeKeys with a KMS that keeps passphrases itself (as vault does), on an in-memory fake of
that contract: a key before the image, never a second one, removal after the delete, and a KMS
that is down stops the call with UNAVAILABLE naming it."""
from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator

import grpc
import pytest

from cephcsi.encryption.kms import registry
from cephcsi.encryption.kms.base import Kms, KmsArgs, KmsUnavailable
from cephcsi.encryption.spec import EncryptionSpec
from cephcsi.encryption.volume_keys import VolumeKeys

pytestmark = pytest.mark.unit

KEPT: dict[str, str] = {}
DOWN: list[bool] = [False]


class MemoryKms(Kms):
    kms_type = "unit-memory"

    def __init__(self, args: KmsArgs) -> None:
        super().__init__(args.kms_id)

    @property
    def dek_in_image(self) -> bool:
        return False

    def _up(self) -> None:
        if DOWN[0]:
            raise KmsUnavailable(self.kms_id, self.kms_type, "connection refused")

    def store(self, volume_id: str, passphrase: str) -> None:
        self._up()
        KEPT[volume_id] = passphrase

    def fetch(self, volume_id: str) -> str | None:
        self._up()
        return KEPT.get(volume_id)

    def remove(self, volume_id: str) -> None:
        self._up()
        KEPT.pop(volume_id, None)


@pytest.fixture
def keys(tmp_path: pathlib.Path) -> Iterator[VolumeKeys]:
    if "unit-memory" not in registry.known_types():
        registry.register("unit-memory", MemoryKms)
    KEPT.clear()
    DOWN[0] = False
    path = tmp_path / "kms.json"
    path.write_text(json.dumps({"mem": {"encryptionKMSType": "unit-memory"}}))
    yield VolumeKeys(str(path))


SPEC = EncryptionSpec("block", "mem")


def test_the_key_is_kept_once_and_removed(keys: VolumeKeys) -> None:
    keys.check(SPEC, {}, "")
    keys.prepare_key("vol-1", SPEC, {})
    first = KEPT["vol-1"]
    keys.prepare_key("vol-1", SPEC, {})  # a retry
    assert KEPT["vol-1"] == first and len(first) == 28
    keys.remove_key("vol-1", SPEC, {})
    keys.remove_key("vol-1", SPEC, {})  # a retried delete
    assert KEPT == {}


def test_a_kms_that_is_down_is_unavailable_and_named(keys: VolumeKeys) -> None:
    DOWN[0] = True
    with pytest.raises(KmsUnavailable) as caught:
        keys.prepare_key("vol-2", SPEC, {})
    assert caught.value.code == grpc.StatusCode.UNAVAILABLE
    assert "KMS 'mem' (type unit-memory)" in str(caught.value)
    assert KEPT == {}
