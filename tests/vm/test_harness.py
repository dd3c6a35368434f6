"""The VM harness's own logic (no VM): accelerator choice, per-node identities, the qemu line."""
from __future__ import annotations

import os
import pathlib

import pytest

from tests.vm import machine, network
from tests.vm.machine import VmImage, VmNode

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("flags, kvm_device, expected", [
    ("fpu vme sse2 vmx", True, "kvm"),
    ("fpu vme sse2 svm", True, "kvm"),
    ("fpu vme sse2", True, "tcg"),  # PVM's /dev/kvm: no VT-x/AMD-V, a stock kernel cannot boot there
    ("fpu vme sse2 vmx", False, "tcg"),
])
def test_kvm_only_where_the_cpu_offers_it(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, flags: str,
                                          kvm_device: bool, expected: str) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    monkeypatch.setattr(machine, "_CPUINFO", str(cpuinfo))
    monkeypatch.delenv("CEPHCSI_VM_ACCEL", raising=False)
    real_exists = os.path.exists
    monkeypatch.setattr(os.path, "exists", lambda p: kvm_device if p == "/dev/kvm" else real_exists(p))
    assert machine.accelerator() == expected


def test_each_node_has_its_own_tap_mac_and_address(tmp_path: pathlib.Path) -> None:
    image = VmImage(str(tmp_path))
    nodes = [VmNode(image, index, str(tmp_path / str(index)), "/repo") for index in range(3)]
    for field in ("address", "mac", "tap", "hostname"):
        assert len({getattr(node, field) for node in nodes}) == 3, field
    assert nodes[0].address == "10.247.0.2" and nodes[1].address == "10.247.0.3"
    assert all(len(node.tap) <= 15 for node in nodes)  # IFNAMSIZ
    assert network.HOST_ADDRESS not in {node.address for node in nodes}


def test_qemu_line_boots_a_pristine_disk_and_shares_the_checkout_read_only(tmp_path: pathlib.Path) -> None:
    node = VmNode(VmImage(str(tmp_path)), 1, str(tmp_path), "/work/repo")
    argv = " ".join(node.argv())
    assert "snapshot=on" in argv
    assert "path=/work/repo,mount_tag=repo,security_model=passthrough,readonly=on" in argv
    assert f"ifname={node.tap}," in argv and f"mac={node.mac}" in argv
    assert f"cephcsi.ip={node.address}/24" in argv and "-no-reboot" in argv
