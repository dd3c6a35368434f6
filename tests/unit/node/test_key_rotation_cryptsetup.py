"""The rotation through the real cryptsetup, on a LUKS2 header in a file (keyslot operations need
no device-mapper, so this runs on the host): slots, passphrase tests, the new slot's PBKDF copied
from the header's own, a kill after the new slot and the re-run. The kernel side (an open mapping
on a mapped RBD device, the KMS in the image metadata) is tests/vm/test_key_rotation.py."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from cephcsi.node import exec as node_exec
from cephcsi.node.key_rotation import CryptsetupSlots, kdf_options, rotate

pytestmark = [pytest.mark.unit,
              pytest.mark.skipif(shutil.which("cryptsetup") is None, reason="cryptsetup is not installed")]

CHEAP = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"]


class Crash(Exception):
    pass


class Store:
    def __init__(self, value: str) -> None:
        self.value = value

    def current(self) -> str:
        return self.value

    def replace(self, passphrase: str) -> None:
        self.value = passphrase


def header(tmp_path: Path, passphrase: str) -> str:
    path = str(tmp_path / "header.img")
    with open(path, "wb") as handle:
        handle.truncate(20 << 20)
    subprocess.run(["cryptsetup", "-q", "luksFormat", "--type", "luks2", *CHEAP, "--key-file=-", path],
                   input=passphrase.encode(), check=True, capture_output=True)
    return path


def kdfs(path: str) -> dict[str, str]:
    dump = subprocess.run(["cryptsetup", "luksDump", "--dump-json-metadata", path], check=True, capture_output=True)
    return {slot: value["kdf"]["type"] + "/" + str(value["kdf"].get("iterations"))
            for slot, value in json.loads(dump.stdout)["keyslots"].items()}


def test_a_rotation_killed_after_the_new_slot_is_completed_by_its_rerun(tmp_path: Path) -> None:
    path = header(tmp_path, "first")
    slots = CryptsetupSlots(node_exec.run, 60, path, "vol")
    store = Store("first")
    keys = iter(["lost", "second"])

    def kill_after_new_slot(point: str) -> None:
        if point == "key-rotation.after-new-slot":
            raise Crash()

    with pytest.raises(Crash):
        rotate(slots, store, lambda: next(keys), "vol", reach=kill_after_new_slot)
    assert slots.active() == {0, 1} and store.value == "first"
    assert slots.opens("first", 1) and slots.opens("lost", 0) and not slots.opens("first", 0)

    rotate(slots, store, lambda: next(keys), "vol", reach=lambda point: None)
    assert store.value == "second" and slots.active() == {0}
    assert slots.opens("second", 0) and not slots.opens("first") and not slots.opens("lost")
    assert kdfs(path) == {"0": "pbkdf2/1000"}  # the header's own cost, no benchmark


def test_the_new_slot_copies_argon2_costs() -> None:
    slots = {0: {"kdf": {"type": "argon2id", "time": 4, "memory": 32768, "cpus": 1, "salt": "x"}}}
    assert kdf_options(slots, 1) == ["--pbkdf", "argon2id", "--pbkdf-force-iterations", "4", "--pbkdf-memory",
                                     "32768", "--pbkdf-parallel", "1"]
    assert kdf_options({0: {"kdf": {"type": "new-kdf"}}}, 1) == ["--pbkdf-memory", "32768"]
    assert kdf_options({}, 1) == ["--pbkdf-memory", "32768"]
