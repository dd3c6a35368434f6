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


# ---- visibility of the node default (issue 12: auto silently picking a userspace mapper) ----

def _gauge(mapper: str, selection: str) -> float | None:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("cephcsi_node_mapper_info", {"mapper": mapper, "selection": selection})


def test_auto_choice_is_logged_with_its_reason_and_published(caplog: pytest.LogCaptureFixture) -> None:
    from cephcsi.node.mappers.select import resolve_at_start

    caplog.set_level("INFO", logger="cephcsi.node.mappers.select")
    assert resolve_at_start(MapperChoice("auto", _probe(*FUSE_NODE))) == "fuse"
    assert _gauge("fuse", "auto") == 1
    info = [r for r in caplog.records if r.getMessage() == "node default mapper"]
    assert len(info) == 1 and info[0].levelname == "INFO"
    assert "modprobe rbd failed" in str(info[0].__dict__)
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert warnings and "end when it restarts" in warnings[0].getMessage()
    assert "OnDelete" in warnings[0].getMessage()


def test_krbd_is_published_without_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    from cephcsi.node.mappers.select import resolve_at_start

    caplog.set_level("INFO", logger="cephcsi.node.mappers.select")
    assert resolve_at_start(MapperChoice("krbd", _probe(set(), set()))) == "krbd"
    assert _gauge("krbd", "configured") == 1
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_no_mapper_at_start_is_logged_and_probed_again_later(caplog: pytest.LogCaptureFixture) -> None:
    from cephcsi.node.mappers.select import resolve_at_start

    modules: set[str] = set()
    choice = MapperChoice("auto", NodeProbe(exists=lambda p: False, which=lambda b: None, modprobe=lambda m: m in modules))
    assert resolve_at_start(choice) is None
    assert [r for r in caplog.records if r.levelname == "ERROR"]
    modules.add("rbd")  # an admin loads the module: the next stage request finds it
    assert choice.for_volume("") == "krbd"
