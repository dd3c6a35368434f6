"""The StorageClass keys of encryption, read as ceph-csi reads them, and the KMS configuration."""
from __future__ import annotations

import json
import pathlib

import pytest

from cephcsi.encryption import kms_config, spec
from cephcsi.encryption.kms import registry
from cephcsi.encryption.volume_keys import VolumeKeys, mapper_name, record_values, spec_of_record
from cephcsi.errors import ConfigError, InvalidArgument
from cephcsi.volumes.parameters import VolumeParameters

pytestmark = pytest.mark.unit

BASE = {"clusterID": "c", "pool": "rbd"}


@pytest.mark.parametrize("value", ["true", "True", "TRUE", "t", "1"])
def test_encrypted_spellings_go_accepts(value: str) -> None:
    assert spec.from_parameters({"encrypted": value}) == spec.EncryptionSpec("block", "default")


@pytest.mark.parametrize("params", [{}, {"encrypted": "false"}, {"encrypted": "0", "encryptionKMSID": "x"}])
def test_not_encrypted(params: dict[str, str]) -> None:
    assert spec.from_parameters(params) is None


@pytest.mark.parametrize("params, message", [
    ({"encrypted": "yes"}, "not a boolean"),
    ({"encrypted": "true", "encryptionType": ""}, "encryptionType=''"),
    ({"encrypted": "true", "encryptionType": "disk"}, "encryptionType='disk'"),
])
def test_bad_values(params: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        spec.from_parameters(params)


def test_volume_context_round_trips() -> None:
    wanted = spec.EncryptionSpec("block", "vault-1")
    assert wanted.volume_context() == {"encrypted": "true", "encryptionType": "block", "encryptionKMSID": "vault-1"}
    assert spec.from_volume_context(wanted.volume_context()) == wanted
    assert "encryptionKMSID" not in spec.EncryptionSpec("block", "default").volume_context()


def test_parameters_carry_encryption_to_the_node() -> None:
    params = VolumeParameters.parse({**BASE, "encrypted": "true", "encryptionKMSID": "kms",
                                     "csi.storage.k8s.io/pvc/namespace": "team"})
    assert params.encryption == spec.EncryptionSpec("block", "kms") and params.tenant == "team"
    context = params.volume_context("csi-vol-1", "")
    assert context["encrypted"] == "true" and context["encryptionKMSID"] == "kms"
    assert "encrypted" not in VolumeParameters.parse(BASE).volume_context("csi-vol-1", "")


def test_file_encryption_is_accepted_and_passed_to_the_node() -> None:
    params = VolumeParameters.parse({**BASE, "encrypted": "true", "encryptionType": "file"})
    assert params.encryption == spec.EncryptionSpec("file", "default")
    assert params.volume_context("csi-vol-1", "")["encryptionType"] == "file"


def test_record_keys_are_ceph_csis() -> None:
    wanted = spec.EncryptionSpec("block", "kms")
    values = record_values(wanted)
    assert values == {"csi.volume.encryptKMS": "kms", "csi.volume.encryptionType": "block"}
    assert spec_of_record(values) == wanted and spec_of_record({}) is None
    assert mapper_name("0001-abc") == "luks-rbd-0001-abc"


def write(tmp_path: pathlib.Path, doc: object) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_unknown_kms_id_names_it_and_the_configured_ones(tmp_path: pathlib.Path) -> None:
    keys = VolumeKeys(write(tmp_path, {"m1": {"encryptionKMSType": "metadata"}}))
    keys.check(spec.EncryptionSpec("block", "m1"))
    keys.check(spec.EncryptionSpec("block", "default"))
    with pytest.raises(InvalidArgument, match=r"'nope' is not configured .*configured: m1"):
        keys.check(spec.EncryptionSpec("block", "nope"))


def test_unsupported_and_unknown_types_are_named(tmp_path: pathlib.Path) -> None:
    keys = VolumeKeys(write(tmp_path, {"k": {"encryptionKMSType": "kmip"}, "z": {"KMS_PROVIDER": "zzz"}}))
    with pytest.raises(InvalidArgument, match=r"type 'kmip', which cephcsi does not support.*metadata"):
        keys.check(spec.EncryptionSpec("block", "k"))
    with pytest.raises(InvalidArgument, match=r"unknown type 'zzz'"):
        keys.check(spec.EncryptionSpec("block", "z"))
    assert {"default", "metadata"} <= set(registry.known_types())


def test_config_file_errors(tmp_path: pathlib.Path) -> None:
    assert kms_config.load(tmp_path / "absent.json") == {}
    with pytest.raises(ConfigError, match="not valid JSON"):
        (tmp_path / "bad.json").write_text("{")
        kms_config.load(tmp_path / "bad.json")
    with pytest.raises(ConfigError, match="must be a JSON object"):
        kms_config.load(write(tmp_path, {"a": 1}))
