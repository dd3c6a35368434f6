import pytest

from cephcsi.errors import InvalidArgument, OutOfRange
from cephcsi.volumes.capacity import DEFAULT_SIZE, MiB, choose_size, fits
from cephcsi.volumes.parameters import VolumeParameters, parse_features

pytestmark = pytest.mark.unit

BASE = {"clusterID": "c1", "pool": "rbd"}


def test_defaults() -> None:
    p = VolumeParameters.parse(BASE)
    assert p.features == ("layering",)
    assert p.name_prefix == "csi-vol-"
    assert p.volume_context("img", "") == {"clusterID": "c1", "pool": "rbd", "imageName": "img"}


def test_context_carries_namespace_data_pool_and_node_options() -> None:
    p = VolumeParameters.parse({**BASE, "dataPool": "ec", "mounter": "rbd-nbd", "mkfsOptions": "-m0"})
    assert p.volume_context("img", "ns1") == {
        "clusterID": "c1", "pool": "rbd", "imageName": "img", "radosNamespace": "ns1",
        "dataPool": "ec", "mounter": "rbd-nbd", "mkfsOptions": "-m0",
    }


def test_kubernetes_keys_are_accepted_and_fstype_kept() -> None:
    p = VolumeParameters.parse({**BASE, "csi.storage.k8s.io/fstype": "xfs", "csi.storage.k8s.io/pvc/name": "x"})
    assert p.fs_type == "xfs"


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"pool": "rbd"}, "clusterID is required"),
        ({"clusterID": "c1"}, "pool is required"),
        ({**BASE, "imagefeatures": "layering"}, "unknown parameter(s) imagefeatures"),
        ({**BASE, "thickProvision": "true"}, "unknown parameter(s) thickProvision"),
        ({**BASE, "pool": "a/b"}, "not a valid pool name"),
        ({**BASE, "imageFormat": "1"}, "only format 2"),
        ({**BASE, "volumeNamePrefix": "bad/prefix"}, "volumeNamePrefix"),
        ({**BASE, "imageFeatures": "layering,striping"}, "unknown feature(s) striping"),
        ({**BASE, "imageFeatures": "object-map"}, "object-map requires exclusive-lock"),
        ({**BASE, "imageFeatures": "exclusive-lock,fast-diff"}, "fast-diff requires object-map"),
        ({**BASE, "imageFeatures": "journaling"}, "journaling requires exclusive-lock"),
    ],
)
def test_invalid(params: dict[str, str], fragment: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        VolumeParameters.parse(params)
    assert fragment in str(caught.value)


def test_features() -> None:
    assert parse_features(None) == ("layering",)
    assert parse_features("") == ()
    assert parse_features(" layering, exclusive-lock,object-map,fast-diff ,layering") == (
        "layering", "exclusive-lock", "object-map", "fast-diff",
    )


@pytest.mark.parametrize(
    ("required", "limit", "expected"),
    [
        (0, 0, DEFAULT_SIZE),
        (1, 0, MiB),
        (MiB, 0, MiB),
        (MiB + 1, 0, 2 * MiB),
        (10 * 1024**3, 0, 10 * 1024**3),
        (0, 5 * MiB + 7, 5 * MiB),
        (MiB + 1, 3 * MiB, 2 * MiB),
        (2 * MiB, 2 * MiB, 2 * MiB),
    ],
)
def test_choose_size(required: int, limit: int, expected: int) -> None:
    assert choose_size(required, limit) == expected


@pytest.mark.parametrize(("required", "limit"), [(MiB + 1, MiB + 100), (0, 100), (5 * MiB, MiB)])
def test_choose_size_out_of_range(required: int, limit: int) -> None:
    with pytest.raises(OutOfRange):
        choose_size(required, limit)


def test_negative_size_is_invalid() -> None:
    with pytest.raises(InvalidArgument):
        choose_size(-1, 0)


def test_fits() -> None:
    assert fits(2 * MiB, MiB, 0)
    assert fits(2 * MiB, 2 * MiB, 2 * MiB)
    assert not fits(MiB, 2 * MiB, 0)
    assert not fits(3 * MiB, MiB, 2 * MiB)
