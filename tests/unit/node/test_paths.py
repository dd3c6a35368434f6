from __future__ import annotations

import os

import pytest

from cephcsi.errors import InvalidArgument
from cephcsi.node.paths import check_path, check_volume_id, nested

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "path, message",
    [
        ("", "staging_target_path is required"),
        ("relative/dir", "must be an absolute path"),
        ("/var/lib/kubelet/../../etc", "must not contain '..'"),
        ("/var/lib/kubelet/a/..", "must not contain '..'"),
        ("/", "root directory"),
        ("/var/lib/kubelet/a\0b", "NUL"),
    ],
)
def test_rejects_bad_paths(path: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message) as caught:
        check_path(path, "staging_target_path", "")
    assert "staging_target_path" in caught.value.message


def test_normalizes() -> None:
    assert check_path("/var/lib//kubelet/./x/", "target_path", "") == "/var/lib/kubelet/x"


def test_kubelet_dir_prefix(tmp_path: os.PathLike[str]) -> None:
    kubelet = os.path.join(tmp_path, "kubelet")
    os.makedirs(os.path.join(kubelet, "pods"))
    assert check_path(f"{kubelet}/pods/x", "target_path", kubelet) == f"{kubelet}/pods/x"
    for outside in ("/etc/x", f"{kubelet}-other/x", kubelet):
        with pytest.raises(InvalidArgument, match="not inside the kubelet directory"):
            check_path(outside, "target_path", kubelet)


def test_symlink_escape_is_caught(tmp_path: os.PathLike[str]) -> None:
    kubelet = os.path.join(tmp_path, "kubelet")
    os.makedirs(kubelet)
    os.symlink("/etc", os.path.join(kubelet, "evil"))
    with pytest.raises(InvalidArgument, match="not inside the kubelet directory"):
        check_path(f"{kubelet}/evil/passwd", "target_path", kubelet)


def test_kubelet_dir_behind_symlink(tmp_path: os.PathLike[str]) -> None:
    real = os.path.join(tmp_path, "data")
    os.makedirs(os.path.join(real, "pods"))
    link = os.path.join(tmp_path, "kubelet")
    os.symlink(real, link)
    assert check_path(f"{link}/pods/x", "target_path", link) == f"{link}/pods/x"


def test_volume_id() -> None:
    assert check_volume_id("abc") == "abc"
    with pytest.raises(InvalidArgument, match="volume_id is required"):
        check_volume_id("")
    with pytest.raises(InvalidArgument, match="not a valid volume id"):
        check_volume_id("x" * 129)
    with pytest.raises(InvalidArgument, match="not a valid volume id"):
        check_volume_id("a/b")


def test_nested() -> None:
    assert nested("/a/b", "/a/b/c")
    assert nested("/a/b/c", "/a/b")
    assert nested("/a/b", "/a/b/")
    assert not nested("/a/b", "/a/bc")
