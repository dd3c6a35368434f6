from __future__ import annotations

import pytest

from cephcsi.errors import FailedPrecondition, InvalidArgument
from cephcsi.node.mappers.select import MapperChoice, NodeProbe, choose_auto, normalize

pytestmark = pytest.mark.unit


def _probe(paths: set[str], binaries: set[str], modules: set[str] = frozenset()) -> NodeProbe:  # type: ignore[assignment]
    return NodeProbe(
        exists=lambda p: p in paths,
        which=lambda b: f"/usr/bin/{b}" if b in binaries else None,
        modprobe=lambda m: m in modules,
    )


FUSE_NODE = ({"/dev/fuse", "/dev/loop-control"}, {"rbd-fuse", "losetup", "rbd-nbd"})


def test_krbd_when_sysfs_bus_exists() -> None:
    assert choose_auto(_probe({"/sys/bus/rbd"}, set()))[0] == "krbd"


def test_krbd_when_modprobe_works() -> None:
    assert choose_auto(_probe(set(), set(), {"rbd"}))[0] == "krbd"


def test_nbd_next() -> None:
    assert choose_auto(_probe({"/sys/module/nbd"}, {"rbd-nbd"}))[0] == "rbd-nbd"
    assert choose_auto(_probe(set(), {"rbd-nbd"}, {"nbd"}))[0] == "rbd-nbd"
    # nbd module without the rbd-nbd binary is not enough
    assert choose_auto(_probe({"/sys/module/nbd", *FUSE_NODE[0]}, {"rbd-fuse", "losetup"}))[0] == "fuse"


def test_fuse_last_like_on_this_test_machine() -> None:
    name, skipped = choose_auto(_probe(*FUSE_NODE))
    assert name == "fuse"
    assert len(skipped) == 2


def test_nothing_available() -> None:
    with pytest.raises(FailedPrecondition, match="none of krbd"):
        choose_auto(_probe({"/dev/fuse"}, {"rbd-fuse"}))


def test_volume_context_overrides_node_default() -> None:
    choice = MapperChoice("auto", _probe(*FUSE_NODE))
    assert choice.for_volume("") == "fuse"
    assert choice.for_volume("rbd-nbd") == "rbd-nbd"
    assert choice.for_volume("krbd") == "krbd"
    with pytest.raises(InvalidArgument, match="unknown mounter 'ggate'"):
        choice.for_volume("ggate")


def test_configured_default() -> None:
    assert MapperChoice("krbd", _probe(set(), set())).for_volume("") == "krbd"
    assert normalize("rbd-fuse", "x") == "fuse"
