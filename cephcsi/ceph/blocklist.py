"""OSD blocklist entries (`ceph osd blocklist add|rm|ls`), sent as mon commands on the driver's own
connection: a bare IP (a fenced node) or one client instance. The cephx user needs
`mon 'profile rbd, allow command "osd blocklist"'`. Design: docs/design/ceph-access.md.
"""
from __future__ import annotations

import ipaddress
import json
import logging

import rados

from cephcsi.ceph.errors import ceph_call
from cephcsi.errors import FailedPrecondition, InvalidArgument, PermissionDenied, Unavailable
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

_EPERM, _EACCES, _EINVAL = 1, 13, 22


def normalise(address: str) -> str:
    """The address as the monitors print it (`ip` or `ip:port/nonce`), or InvalidArgument.

    Accepts what Ceph prints for clients (`v1:`/`v2:`/`any:` prefixes, `[v6]:port/nonce`) and
    bare IPv4/IPv6 addresses."""
    text = address.strip()
    for prefix in ("v1:", "v2:", "any:"):
        text = text.removeprefix(prefix)
    host, sep, rest = text, "", ""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        sep = ":" if rest.startswith(":") else ""
        rest = rest[1:] if sep else rest
    elif text.count(":") == 1:
        host, sep, rest = text.partition(":")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise InvalidArgument(f"{address!r} is not a Ceph client address (an IP, or ip:port/nonce)") from None
    if not sep:
        return str(ip)
    port, slash, nonce = rest.partition("/")
    if not port.isdigit() or (slash and not nonce.isdigit()):
        raise InvalidArgument(f"{address!r} is not a Ceph client address (an IP, or ip:port/nonce)")
    shown = f"[{ip}]" if ip.version == 6 else str(ip)
    return f"{shown}:{port}/{nonce or '0'}"


def host_of(address: str) -> str:
    """The IP part of a client address (`10.0.0.5:0/123` → `10.0.0.5`)."""
    text = normalise(address)
    if text.startswith("["):
        return text[1:].partition("]")[0]
    return text.partition(":")[0] if text.count(":") == 1 else text


def _command(handle: rados.Rados, what: str, command: dict[str, object], timeout: float) -> str:
    with ceph_call(what, str(command.get("addr", ""))):
        ret, out, status = handle.mon_command(json.dumps(command), b"", timeout=max(1, int(timeout)))
    if ret == 0:
        return out.decode()
    if -ret in (_EPERM, _EACCES):
        raise PermissionDenied(
            f"{what} {command.get('addr')!r} refused by the monitors ({status.strip()}): fencing needs the cephx "
            "user's mon caps to include `allow command \"osd blocklist\"`, e.g. ceph auth caps client.<user> "
            "mon 'profile rbd, allow command \"osd blocklist\"' osd '<its osd caps>' mgr '<its mgr caps>'")
    if -ret == _EINVAL:
        raise InvalidArgument(f"{what}: the monitors refused {command.get('addr')!r}: {status.strip()}")
    raise Unavailable(f"{what} failed ({ret}): {status.strip()}; retry")


def add(handle: rados.Rados, address: str, expire_seconds: int, timeout: float) -> None:
    """Blocklist `address` for `expire_seconds` (again: the expiry is renewed). Refuses an
    address this very connection speaks from: fencing ourselves would stop the controller."""
    addr = normalise(address)
    own = host_of(own_address(handle))
    if own and host_of(addr) == own:
        raise FailedPrecondition(
            f"refusing to blocklist {addr}: the controller's own Ceph client speaks from {own}. A node "
            "sharing the controller's address cannot be fenced by address; move the controller to another node")
    _command(handle, "blocklist client", {"prefix": "osd blocklist", "blocklistop": "add", "addr": addr,
                                          "expire": float(expire_seconds)}, timeout)
    log.warning("Ceph client blocklisted", extra=fields(address=addr, expire_seconds=expire_seconds))


def remove(handle: rados.Rados, address: str, timeout: float) -> None:
    """Remove the entry; an address that is not listed counts as removed."""
    addr = normalise(address)
    # The monitors answer 0 ("... isn't blocklisted") for an address they do not list.
    _command(handle, "remove blocklist entry", {"prefix": "osd blocklist", "blocklistop": "rm", "addr": addr}, timeout)
    log.info("Ceph blocklist entry removed", extra=fields(address=addr))


def listed(handle: rados.Rados, timeout: float) -> dict[str, str]:
    """Every blocklist entry: address as the monitors print it → expiry time."""
    text = _command(handle, "list blocklist", {"prefix": "osd blocklist ls", "format": "json"}, timeout)
    # The address entries' JSON list (Quincy and later print the range entries' list after it).
    entries, _ = json.JSONDecoder().raw_decode(text.strip() or "[]")
    return {str(e.get("addr")): str(e.get("until", "")) for e in entries if isinstance(e, dict)}


def blocks(entries: dict[str, str], address: str) -> bool:
    """Whether a client at `address` is blocklisted by one of `entries` (its exact instance or
    its whole IP)."""
    try:
        addr, host = normalise(address), host_of(address)
    except InvalidArgument:
        return False
    for entry in entries:
        try:
            listed_addr = normalise(entry)
        except InvalidArgument:
            continue
        bare = listed_addr.endswith(":0/0") and host_of(listed_addr) == host
        if listed_addr in (addr, host) or bare:
            return True
    return False


def own_address(handle: rados.Rados) -> str:
    """The address this connection speaks from (`rados_getaddrs`), '' when unknown."""
    try:
        text = handle.get_addrs()
    except (rados.Error, AttributeError):
        return ""
    # "[v2:10.0.0.1:0/123,v1:...]" or a single address
    first = text.strip().strip("[]").split(",")[0]
    try:
        return normalise(first)
    except InvalidArgument:
        return ""
