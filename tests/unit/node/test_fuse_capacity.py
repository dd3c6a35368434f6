"""The fuse mapper's loop devices follow their images' size (cephcsi.node.mappers.fuse_capacity)."""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from cephcsi.node.exec import CommandFailed, Result
from cephcsi.node.mappers.fuse_capacity import LoopCapacityFollower

pytestmark = pytest.mark.unit


class Loops:
    """Two loop devices backed by sparse files; `sizes` is what the kernel reports for each."""

    def __init__(self, root: Path) -> None:
        self.files = {"/dev/loop1": root / "a" / "mnt" / "img-a", "/dev/loop2": root / "b" / "mnt" / "img-b"}
        self.sizes = {"/dev/loop1": 64 << 20, "/dev/loop2": 64 << 20}
        for path in self.files.values():
            path.parent.mkdir(parents=True)
            with open(path, "wb") as handle:
                handle.truncate(64 << 20)
        self.calls: list[list[str]] = []
        self.fail = False

    def listing(self, root: str) -> list[tuple[str, str]]:
        return [(device, str(path)) for device, path in self.files.items() if str(path).startswith(root + "/")]

    def size_of(self, device: str) -> int:
        return self.sizes[device]

    def runner(self, argv: Sequence[str], *, what: str, timeout: float | None = None, **_: object) -> Result:
        self.calls.append(list(argv))
        result = Result(tuple(argv), 1 if self.fail else 0, "", "losetup: failed" if self.fail else "")
        if self.fail:
            raise CommandFailed(result, what)
        self.sizes[argv[-1]] = os.stat(self.files[argv[-1]]).st_size
        return result


def follower(tmp_path: Path, loops: Loops) -> LoopCapacityFollower:
    return LoopCapacityFollower(str(tmp_path), loops.runner, 5.0, loops=loops.listing, size_of=loops.size_of)


def test_only_grown_images_get_their_loop_resized(tmp_path: Path) -> None:
    loops = Loops(tmp_path)
    sweeper = follower(tmp_path, loops)
    assert sweeper.sweep() == [] and loops.calls == []
    os.truncate(loops.files["/dev/loop2"], 96 << 20)
    assert sweeper.sweep() == ["/dev/loop2"]
    assert loops.calls == [["losetup", "--set-capacity", "/dev/loop2"]]
    assert loops.sizes["/dev/loop2"] == 96 << 20
    assert sweeper.sweep() == []  # nothing left to do: no second call


def test_a_vanished_backing_file_or_failed_resize_is_skipped_and_retried(tmp_path: Path) -> None:
    loops = Loops(tmp_path)
    sweeper = follower(tmp_path, loops)
    os.remove(loops.files["/dev/loop1"])  # e.g. detached, or its rbd-fuse died
    os.truncate(loops.files["/dev/loop2"], 80 << 20)
    loops.fail = True
    assert sweeper.sweep() == []
    loops.fail = False
    assert sweeper.sweep() == ["/dev/loop2"]


def test_the_thread_starts_and_stops(tmp_path: Path) -> None:
    loops = Loops(tmp_path)
    sweeper = LoopCapacityFollower(str(tmp_path), loops.runner, 1.0, interval=0.01,
                                   loops=loops.listing, size_of=loops.size_of)
    sweeper.start()
    sweeper.stop()
    assert sweeper._thread is not None and not sweeper._thread.is_alive()
