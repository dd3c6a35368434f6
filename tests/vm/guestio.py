"""Data checks run inside the VM: write a random payload through a published volume, read it back.

Everything goes through the guest's page cache with fsync / O_DIRECT, so what is read back
after an unstage + stage came from the RBD image, not from memory.
"""
from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable

from tests.vm.plugin import KUBELET_DIR
from tests.vm.machine import VmNode, scaled

PAYLOAD_MB = 4


def write_payload(vm: VmNode, target: str, block: bool) -> str:
    """Write PAYLOAD_MB random MiB at the target (a file in a filesystem, or the block device); its sha256."""
    quoted = shlex.quote(target)
    if block:
        script = (f"head -c {PAYLOAD_MB}M /dev/urandom >/tmp/payload && "
                  f"dd if=/tmp/payload of={quoted} bs=1M oflag=direct conv=fsync status=none && "
                  "sha256sum </tmp/payload && rm /tmp/payload")
    else:
        script = (f"head -c {PAYLOAD_MB}M /dev/urandom >{quoted}/payload && sync {quoted}/payload && "
                  f"sha256sum <{quoted}/payload")
    return vm.check(script, timeout=120).split()[0]


def read_payload(vm: VmNode, target: str, block: bool) -> str:
    quoted = shlex.quote(target)
    if block:
        script = f"dd if={quoted} bs=1M count={PAYLOAD_MB} iflag=direct status=none | sha256sum"
    else:
        script = f"sha256sum <{quoted}/payload"
    return vm.check(script, timeout=120).split()[0]


def stage_record(vm: VmNode, staging: str) -> dict[str, object]:
    out = vm.check(f"cat {shlex.quote(staging)}/cephcsi-stage.json", timeout=30)
    return dict(json.loads(out))


def kubelet_mounts(vm: VmNode) -> list[str]:
    out = vm.check(f"awk '$2 ~ \"^{KUBELET_DIR}/\" {{print $2}}' /proc/mounts", timeout=30)
    return out.split()


def fs_bytes(vm: VmNode, path: str) -> int:
    """The mounted filesystem's size (blocks × block size, as statvfs says)."""
    blocks, size = vm.check(f"stat -f -c '%b %S' {shlex.quote(path)}", timeout=30).split()
    return int(blocks) * int(size)


def device_bytes(vm: VmNode, device: str) -> int:
    return int(vm.check(f"blockdev --getsize64 {shlex.quote(device)}", timeout=30).strip())


def acknowledged(vm: VmNode, ack: str) -> int:
    """How many writes tests/vm/writer.py has acknowledged (lines in its ack file)."""
    return int(vm.check(f"cat {ack} 2>/dev/null | wc -l", timeout=30).strip() or 0)


def wait_for_progress(vm: VmNode, ack: str, beyond: int, timeout: float,
                      explain: Callable[[], str] = lambda: "") -> int:
    """Wait until the writer acknowledged more than `beyond` writes; the count."""
    deadline = time.monotonic() + scaled(timeout)
    while (count := acknowledged(vm, ack)) <= beyond:
        assert time.monotonic() < deadline, (f"the writer made no progress beyond {beyond} acknowledged writes:\n"
                                             f"{vm.read_file('writer.log')[-2000:]}\n{explain()}")
        time.sleep(0.5)
    return count
