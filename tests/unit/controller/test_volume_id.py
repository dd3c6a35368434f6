import pytest

from cephcsi.volumes.volume_id import MAX_ID_LENGTH, MalformedId, VolumeId

pytestmark = pytest.mark.unit

UUID = "8f0da8c2-ec58-4d67-9cf6-8ab296c1115d"


def test_round_trip() -> None:
    vid = VolumeId("c1", 1, UUID)
    text = vid.encode()
    assert text == f"0001-0002-c1-0000000000000001-{UUID}"
    assert VolumeId.decode(text) == vid


def test_longest_cluster_id_fits_in_128_bytes() -> None:
    vid = VolumeId("x" * 36, 2**63 - 1, UUID)
    assert len(vid.encode()) <= MAX_ID_LENGTH
    assert VolumeId.decode(vid.encode()) == vid


def test_cluster_id_with_dashes_is_length_delimited() -> None:
    vid = VolumeId("a-b-c", 17, UUID)
    assert VolumeId.decode(vid.encode()) == vid


@pytest.mark.parametrize(
    "text",
    [
        "",
        "fake-vol-id-abc",
        "some-vol-id",
        "0002-0002-c1-0000000000000001-" + UUID,  # unknown version
        "0001-0003-c1-0000000000000001-" + UUID,  # length does not match
        "0001-0002-c1-000000000000000z-" + UUID,  # bad pool hex
        "0001-0002-c1-0000000000000001-" + UUID.upper(),
        "0001-0002-c1-0000000000000001-" + UUID + "x",
        "0001-0002-../0000000000000001-" + UUID,
        "x" * 200,
    ],
)
def test_malformed(text: str) -> None:
    with pytest.raises(MalformedId):
        VolumeId.decode(text)


def test_new_uuid_is_valid() -> None:
    vid = VolumeId("c", 0, VolumeId.new_uuid())
    assert VolumeId.decode(vid.encode()) == vid
