"""fuse mapper: the rbd-fuse command line. An rbd-fuse built against libfuse3 (Debian 13's
Ceph 18.2.7) crashes in fuse_opt_parse on any -p/--poolname or -s/--namespace option (it
frees the option's string-literal default), so -p is left out for rbd-fuse's default pool,
and the crash is reported as what it is when a pool or namespace has to be passed."""
from __future__ import annotations

import os

import pytest

from cephcsi.ceph.credentials import Credentials
from cephcsi.errors import FailedPrecondition
from cephcsi.node.exec import CommandFailed
from cephcsi.node.mappers import fuse
from cephcsi.node.mappers.base import MapRequest
from cephcsi.node.mappers.fuse import FuseMapper, rbd_fuse_argv
from cephcsi.node.mounts import Mounter
from cephcsi.node.stage_record import ImageSpec
from tests.unit.node.fakes import FakeRunner

pytestmark = pytest.mark.unit

KEY = "AQBNIjtnAAAAABAAxQZ3mZP9dMa2wfBEXAMPLE=="
SEGV = "*** Caught signal (Segmentation fault) ** in thread 7f37 thread_name:rbd-fuse ... 5: fuse_opt_parse() 6: main()"


def test_default_pool_passes_no_pool_option() -> None:
    assert rbd_fuse_argv("/w/ceph.conf", "csi", "rbd", "", "csi-vol-1", "/w/mnt") == [
        "rbd-fuse", "-c", "/w/ceph.conf", "--id", "csi", "-r", "csi-vol-1", "/w/mnt",
    ]


def test_other_pool_and_namespace_are_passed() -> None:
    assert rbd_fuse_argv("/w/ceph.conf", "csi", "kube", "tenant", "csi-vol-1", "/w/mnt") == [
        "rbd-fuse", "-c", "/w/ceph.conf", "--id", "csi", "-p", "kube", "--namespace=tenant", "-r", "csi-vol-1", "/w/mnt",
    ]
    assert rbd_fuse_argv("/c", "csi", "rbd", "tenant", "img", "/m") == [
        "rbd-fuse", "-c", "/c", "--id", "csi", "--namespace=tenant", "-r", "img", "/m",
    ]


def _start(tmp_path: os.PathLike[str], image: ImageSpec, answer: tuple[int, str, str]) -> Exception:
    def respond(argv: list[str]) -> tuple[int, str, str] | None:
        return answer if argv[0] == "rbd-fuse" else None

    runner = FakeRunner(respond)
    mapper = FuseMapper(runner, 10, os.path.join(tmp_path, "state"), 1, lambda d, t: None, 1, Mounter(runner, 10))
    work_dir = mapper.work_dir_for("vol-1", "/staging")
    request = MapRequest("vol-1", image, "10.0.0.1:6789", Credentials("csi", KEY), work_dir=work_dir)
    mapper._prepare_dirs(work_dir)
    mount_dir = os.path.join(work_dir, fuse.MOUNT_DIR)
    with pytest.raises(Exception) as caught:
        mapper._start_fuse(request, mount_dir, fuse.backing_file(work_dir, image.image))
    assert runner.argvs()[0][0] == "rbd-fuse"
    return caught.value


@pytest.mark.parametrize("image", [ImageSpec("kube", "csi-vol-1", ""), ImageSpec("rbd", "csi-vol-1", "tenant")])
def test_option_parsing_crash_with_a_pool_or_namespace_is_a_precondition(tmp_path: os.PathLike[str], image: ImageSpec) -> None:
    error = _start(tmp_path, image, (-11, "", SEGV))
    assert isinstance(error, FailedPrecondition)
    assert "pool 'rbd'" in str(error) and "krbd or rbd-nbd" in str(error)


def test_crash_without_pool_or_namespace_stays_a_command_failure(tmp_path: os.PathLike[str]) -> None:
    error = _start(tmp_path, ImageSpec("rbd", "csi-vol-1", ""), (-11, "", SEGV))
    assert isinstance(error, CommandFailed)
