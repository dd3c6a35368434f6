"""The publish decision around the guarded header write (`Publisher._record`): a publish whose
guarded write loses to another process's reads again and decides on what that one wrote. The
header is a fake with cls_rbd's compare-then-write semantics (the real one is exercised in
tests/integration/controller/test_publish_race.py); `interfere` is the other process, writing
between this publish's read and its write."""
from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping

import pytest

from cephcsi.ceph import header_metadata, publish_keys
from cephcsi.ceph.credentials import Credentials
from cephcsi.errors import FailedPrecondition, OperationInFlight
from cephcsi.volumes import publish
from cephcsi.volumes.journal import Record
from cephcsi.volumes.volume_id import VolumeId

pytestmark = pytest.mark.unit

VOL = "0001-0004-test-0000000000000001-9f4d1c2e-0000-4000-8000-000000000001"
CREDENTIALS = Credentials("csi", "AQDsecretkey==")


class FakeHeader:
    def __init__(self) -> None:
        self.metadata: dict[str, str] = {}
        self.token = ""
        self.writes = 0
        self.interfere: Callable[[FakeHeader], None] = lambda header: None

    def read_guarded(self, io: object, name: str, header_id: str, guard_key: str) -> tuple[dict[str, str], str]:
        assert guard_key == publish_keys.PUBLISH_GUARD
        return dict(self.metadata), self.token

    def set_keys_if(self, io: object, name: str, header_id: str, values: Mapping[str, str], guard_key: str,
                    expected: str, new: str) -> bool:
        self.interfere(self)
        if self.token != expected:
            return False
        self.metadata.update(values)
        self.token = new
        self.writes += 1
        return True

    def publish_by_another(self, node: str) -> None:
        self.metadata[publish.address_key(VOL, node)] = ""
        self.token = uuid.uuid4().hex


@pytest.fixture
def header(monkeypatch: pytest.MonkeyPatch) -> FakeHeader:
    fake = FakeHeader()
    monkeypatch.setattr(header_metadata, "read_guarded", fake.read_guarded)
    monkeypatch.setattr(header_metadata, "set_keys_if", fake.set_keys_if)
    return fake


def record(header: FakeHeader, node: str, single_node: bool = True) -> bool:
    publisher = publish.Publisher.__new__(publish.Publisher)  # _record uses no connection state
    target = publish.Target(VolumeId.decode(VOL), "rbd", Record("u", "pvc-1", "csi-vol-u", "abc"), "abc")
    return publisher._record(object(), target, node, single_node, CREDENTIALS)  # type: ignore[arg-type]


def test_an_uncontested_publish_writes_the_record_and_replaces_the_token(header: FakeHeader) -> None:
    assert record(header, "node-a") is True
    assert header.metadata == {publish.address_key(VOL, "node-a"): "", publish.user_key(VOL, "node-a"): "csi"}
    first = header.token
    assert first
    assert record(header, "node-a") is False  # there already: nothing written
    assert header.token == first and header.writes == 1


def test_losing_the_write_to_another_node_is_refused_naming_it(header: FakeHeader) -> None:
    # Both read "nobody holds it"; the other process writes first.
    header.interfere = lambda h: h.publish_by_another("node-b") if not h.metadata else None
    with pytest.raises(FailedPrecondition, match="published to node node-b"):
        record(header, "node-a")
    assert publish.holders(header.metadata, VOL) == {"node-b": ""}
    assert header.writes == 0


def test_a_multi_node_publish_that_lost_the_write_writes_again(header: FakeHeader) -> None:
    header.interfere = lambda h: h.publish_by_another("node-b") if not h.metadata else None
    assert record(header, "node-a", single_node=False) is True
    assert set(publish.holders(header.metadata, VOL)) == {"node-a", "node-b"}


def test_a_publish_losing_every_attempt_gives_up_retryable(header: FakeHeader) -> None:
    header.interfere = lambda h: setattr(h, "token", uuid.uuid4().hex)
    with pytest.raises(OperationInFlight, match="retry"):
        record(header, "node-a", single_node=False)
    assert header.metadata == {}
