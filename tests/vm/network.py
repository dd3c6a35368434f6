"""The VM nodes' network: one host-local bridge, one tap device per VM, nothing routed.

The host holds 10.247.0.1/24 on the bridge and the Ceph test cluster binds there; node N is
10.247.0.(N+2). No NAT, no forwarding: iptables FORWARD rules drop whatever would cross the
bridge to or from elsewhere (traffic between the host and its guests is INPUT/OUTPUT, which
stays open), and the guests have no default route. Everything here is idempotent, so a test
session that died half-way is repaired by the next one.

`qemu -netdev user` is not an option: Ceph clients connect to the OSD addresses the monitors
publish, which a user-mode network cannot reach.
"""
from __future__ import annotations

import ipaddress
import os
import subprocess

BRIDGE = "cephcsivm0"
NETWORK = ipaddress.IPv4Network("10.247.0.0/24")
HOST_ADDRESS = "10.247.0.1"
HOST_ADDRESS_HEX = f"{int.from_bytes(ipaddress.IPv4Address(HOST_ADDRESS).packed, 'little'):08X}"  # /proc/net/tcp's form
_FLAGS = ("-i", "-o")  # FORWARD rules: in from, and out to, the bridge


def guest_address(index: int) -> str:
    return str(NETWORK.network_address + index + 2)


def guest_mac(index: int) -> str:
    return f"52:54:00:f6:00:{index + 2:02x}"


def tap_name(index: int) -> str:
    return f"cephcsivm0t{index}"  # under IFNAMSIZ (15)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def _exists(name: str) -> bool:
    return os.path.exists(f"/sys/class/net/{name}")


def ensure_bridge() -> None:
    if not _exists(BRIDGE):
        _ip("link", "add", "name", BRIDGE, "type", "bridge")
    addresses = _ip("-4", "-o", "addr", "show", "dev", BRIDGE).stdout
    if f" {HOST_ADDRESS}/" not in addresses:
        _ip("addr", "add", f"{HOST_ADDRESS}/{NETWORK.prefixlen}", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    for flag in _FLAGS:
        rule = ["FORWARD", flag, BRIDGE, "-j", "DROP"]
        if subprocess.run(["iptables", "-C", *rule], capture_output=True, check=False, timeout=30).returncode != 0:
            subprocess.run(["iptables", "-I", *rule], capture_output=True, check=True, timeout=30)


def ensure_tap(index: int) -> str:
    name = tap_name(index)
    if not _exists(name):
        _ip("tuntap", "add", "dev", name, "mode", "tap")
    _ip("link", "set", name, "master", BRIDGE)
    _ip("link", "set", name, "up")
    return name


def remove_tap(index: int) -> None:
    if _exists(tap_name(index)):
        _ip("link", "del", tap_name(index), check=False)


def _host_address_in_use() -> bool:
    """A TCP socket listening on the host address: another session's Ceph cluster (before its VM)."""
    wanted = HOST_ADDRESS_HEX + ":"
    try:
        with open("/proc/net/tcp", encoding="ascii") as handle:
            rows = [line.split() for line in list(handle)[1:]]
        return any(row[1].startswith(wanted) and row[3] == "0A" for row in rows)  # 0A: LISTEN
    except OSError:
        return False


def remove_bridge() -> None:
    """Remove the bridge and its rules once nothing uses it: no tap left on it and no socket
    bound to the host address (a concurrent test session's VM or cluster)."""
    if _exists(BRIDGE):
        if os.listdir(f"/sys/class/net/{BRIDGE}/brif") or _host_address_in_use():
            return
        _ip("link", "del", BRIDGE, check=False)
    for flag in _FLAGS:
        rule = ["FORWARD", flag, BRIDGE, "-j", "DROP"]
        while subprocess.run(["iptables", "-D", *rule], capture_output=True, check=False, timeout=30).returncode == 0:
            pass
