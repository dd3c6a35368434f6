"""The wrapped passphrase a key rotation stores (issue 33) on the real Ceph cluster: written into
the image metadata from stdin, never in any command's argv nor in any log record, and read back
by what NodeStage runs (`rbd image-meta list`) and by `rbd image-meta get` — so the header omap
key the node writes is the one librbd keeps the metadata under, with or without a RADOS namespace."""
from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence

import pytest

from cephcsi.ceph.credentials import Credentials
from cephcsi.encryption.kms.base import KmsArgs
from cephcsi.encryption.kms.secrets import PASSPHRASE_KEY, SecretsMetadataKms
from cephcsi.encryption.volume_keys import DEK_KEY
from cephcsi.node import exec as node_exec
from cephcsi.node.image_meta import RbdImageMetadata
from cephcsi.node.key_rotation import KmsKeyStore
from cephcsi.node.stage_record import ImageSpec
from tests.ceph.fixtures import CephTestCluster

pytestmark = [pytest.mark.integration, pytest.mark.ceph]


class Recording:
    """node_exec.run, keeping the argv each command really ran with."""

    def __init__(self) -> None:
        self.argvs: list[tuple[str, ...]] = []

    def __call__(self, argv: Sequence[str], **kwargs: object) -> node_exec.Result:
        self.argvs.append(tuple(str(arg) for arg in argv))
        return node_exec.run(argv, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("namespace", ["", "tenant"])
def test_the_wrapped_passphrase_reaches_no_argv_and_no_log(ceph_cluster: CephTestCluster, namespace: str,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    pool = ceph_cluster.pool
    if namespace:
        existing = ceph_cluster.admin("rbd", "namespace", "ls", pool)
        if namespace not in existing.split():
            ceph_cluster.admin("rbd", "namespace", "create", f"{pool}/{namespace}")
    name = f"secret-meta-{uuid.uuid4().hex[:8]}"
    spec = f"{pool}/{namespace}/{name}" if namespace else f"{pool}/{name}"
    ceph_cluster.admin("rbd", "create", "--size", "8M", spec)
    volume_id = f"0001-0004-test-0000000000000001-{uuid.uuid4()}"
    kms = SecretsMetadataKms(KmsArgs("meta", {}, secrets={PASSPHRASE_KEY: "class-kek-of-the-test"}))
    runner = Recording()
    meta = RbdImageMetadata(runner, 30, ImageSpec(pool, name, namespace), ceph_cluster.mon_host,
                            Credentials(ceph_cluster.user, ceph_cluster.key))
    store = KmsKeyStore(kms, meta, volume_id)
    passphrase = "the-new-volume-passphrase-" + uuid.uuid4().hex
    caplog.set_level(logging.DEBUG)
    try:
        meta.set("rbd.csi.ceph.com/encrypted", "encrypted")  # a metadata key set the plain way, kept
        store.replace(passphrase)
        stored = ceph_cluster.admin("rbd", "image-meta", "get", spec, DEK_KEY).strip()
        assert kms.unwrap(volume_id, stored) == passphrase
        assert store.current() == passphrase  # read back as NodeStage reads it
        assert meta.read()["rbd.csi.ceph.com/encrypted"] == "encrypted"

        ran = [argv for argv in runner.argvs if "setomapval" in argv]
        assert len(ran) == 1
        assert not [argv for argv in runner.argvs if stored in " ".join(argv) or passphrase in " ".join(argv)]
        commands = [record for record in caplog.records if record.getMessage() == "command"]
        assert any("setomapval" in repr(vars(record)) for record in commands)  # the write was logged...
        leaked = [record for record in caplog.records
                  if stored in repr(vars(record)) or passphrase in repr(vars(record))]
        assert not leaked  # ...without the value
    finally:
        ceph_cluster.admin("rbd", "rm", spec)
