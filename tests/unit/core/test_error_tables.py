"""The translation tables side by side: every row of every source is reached by a realistic
failure and gives its class with a filled message. (Ceph bindings: tests/unit/core/test_errors.py;
the kubernetes client: tests/unit/kube/test_apierrors.py and tests/unit/sidecars/test_kubeerrors.py.)"""
from __future__ import annotations

import errno

import pytest

from cephcsi import errors
from cephcsi.ceph import errors as ceph_errors
from cephcsi.kube import apierrors
from cephcsi.node.exec import CommandFailed, Result
from cephcsi.node.mappers import fuse, rbd_cli
from cephcsi.node.stage_record import ImageSpec

pytestmark = pytest.mark.unit

IMAGE = ImageSpec("replicapool", "csi-vol-1")


def failed(stderr: str, argv: tuple[str, ...] = ("rbd", "device", "map"), stdout: str = "") -> CommandFailed:
    return CommandFailed(Result(argv, 1, stdout, stderr), "map the image")


def test_a_rule_needs_every_condition_it_names() -> None:
    both = errors.Rule(errors.NotFound, "x", errnos=frozenset({2}), phrases=("no such image",))
    assert both.matches({2}, "rbd: no such image")
    assert not both.matches({2}, "rbd: other")
    assert not both.matches({13}, "rbd: no such image")
    assert errors.Rule(errors.Internal, "x").matches(set(), ""), "a row with no condition is a fallback"


def test_first_matching_row_wins_and_fills_its_message() -> None:
    table = (errors.Rule(errors.Unavailable, "{what}: down", phrases=("timed out",)),
             errors.Rule(errors.Internal, "{what}: other"))
    found = errors.translate_by(table, set(), "connect timed out", what="map")
    assert isinstance(found, errors.Unavailable) and found.message == "map: down"
    assert errors.translate_by(table[:1], set(), "fine", what="map") is None


RBD_CLI = [
    ("rbd: failed to load rbd kernel module (1)\nrbd: sysfs write failed", errors.FailedPrecondition),
    # krbd on Linux 6.1 mapping an image with journaling, as in tests/vm: the advice is on stdout
    # (test_rbd_cli_reads_the_advice_rbd_prints_on_stdout), stderr has only the errno.
    ('RBD image feature set mismatch. You can disable features unsupported by the kernel with "rbd feature '
     'disable j1 journaling".\nrbd: map failed: (6) No such device or address', errors.FailedPrecondition),
    ("rbd: error opening image csi-vol-1: (2) No such file or directory", errors.NotFound),
    ("rbd: couldn't connect to the cluster!\nmonclient: handle_auth_bad_method: (13) Permission denied",
     errors.PermissionDenied),
    ("monclient(hunting): authenticate timed out after 300\n(110) Connection timed out", errors.Unavailable),
    ("rbd: sysfs write failed\nrbd: unmap failed: (16) Device or resource busy", errors.FailedPrecondition),
    ("rbd: something new", errors.Internal),
]


@pytest.mark.parametrize(("stderr", "cls"), RBD_CLI)
def test_rbd_cli_table(stderr: str, cls: type[errors.CephCSIError]) -> None:
    found = rbd_cli.translate(failed(stderr), "map the image", IMAGE)
    assert type(found) is cls
    assert "{" not in found.message and "map the image" in found.message


def test_rbd_cli_reads_the_advice_rbd_prints_on_stdout() -> None:
    stdout = ('RBD image feature set mismatch. You can disable features unsupported by the kernel with "rbd feature '
              'disable j1 journaling".\nIn some cases useful info is found in syslog - try "dmesg | tail".\n')
    stderr = "rbd: sysfs write failed\nrbd: map failed: (6) No such device or address\n"
    found = rbd_cli.translate(failed(stderr, stdout=stdout), "map the image", IMAGE)
    assert type(found) is errors.FailedPrecondition
    assert "rbd feature disable j1 journaling" in found.message and "rbd-nbd" in found.message


def test_rbd_cli_enoent_of_the_ceph_conf_noise_is_not_a_missing_image() -> None:
    stderr = "can't open ceph.conf: (2) No such file or directory\nrbd: sysfs write failed: (5) I/O error"
    assert type(rbd_cli.translate(failed(stderr), "map the image", IMAGE)) is errors.Internal


def test_every_rbd_cli_row_is_reached() -> None:
    reached = {type(rbd_cli.translate(failed(stderr), "map", IMAGE)) for stderr, _ in RBD_CLI}
    assert reached == {rule.error for rule in rbd_cli.TABLE}


@pytest.mark.parametrize(("stderr", "cls"), [
    ("rbd-fuse: handle_auth_bad_method server allowed_methods [2] but i only support [2]", errors.PermissionDenied),
    ("failed to fetch mon config (--no-mon-config to skip)", errors.Unavailable),
    ("rbd-fuse: connect: (110) Connection timed out", errors.Unavailable),
])
def test_fuse_table(stderr: str, cls: type[errors.CephCSIError]) -> None:
    found = fuse.translate(failed(stderr, ("rbd-fuse",)), "start rbd-fuse")
    assert type(found) is cls and "start rbd-fuse" in found.message


def test_fuse_failure_outside_the_table_stays_what_it_was() -> None:
    error = failed("fuse: device not found, try 'modprobe fuse' first", ("rbd-fuse",))
    assert fuse.translate(error, "start rbd-fuse") is error


@pytest.mark.parametrize("table", [ceph_errors.TABLE, rbd_cli.TABLE])
def test_total_tables_end_with_a_fallback(table: tuple[errors.Rule, ...]) -> None:
    last = table[-1]
    assert not last.errnos and not last.phrases and last.error is errors.Internal


def test_kube_table_ends_with_a_fallback_and_ceph_rows_are_by_errno() -> None:
    matches, error, _ = apierrors.TABLE[-1]
    assert matches(RuntimeError("anything")) and error.__name__ == "ApiFailed"
    assert all(rule.errnos for rule in ceph_errors.TABLE[:-1])
    assert ceph_errors.translate(OSError(errno.EDQUOT, "quota"), "create", "image x").code.name == "RESOURCE_EXHAUSTED"


def test_an_image_in_an_rbd_group_is_a_failed_precondition_that_says_what_to_do() -> None:
    import rbd
    # What the bindings raise for librbd's EMLINK (an rbd.OSError carrying the errno).
    found = ceph_errors.translate(rbd.OSError("RBD image is member of group", errno.EMLINK),
                                  "move image to trash", "image 'csi-vol-x'")
    assert isinstance(found, errors.FailedPrecondition)
    assert "member of an RBD group" in found.message and "rbd group image remove" in found.message
