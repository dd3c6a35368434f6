"""Whose are an image's watchers (node, and whether fenced), best effort, for DeleteVolume's "image
in use" messages. Design: docs/design/ceph-access.md.
"""
from __future__ import annotations

import logging

import rados

from cephcsi.ceph import blocklist, header_metadata, omap
from cephcsi.ceph.publish_keys import ADDRESS_PREFIX, EARLY_ADDRESS_PREFIX, FENCE_LEDGER, NODE_ADDRESSES
from cephcsi.errors import CephCSIError, InvalidArgument

log = logging.getLogger(__name__)


def nodes_by_ip(io: rados.Ioctx, name: str, image_id: str) -> dict[str, str]:
    """IP → node id, from the image's publish keys and the pool's reported node addresses."""
    found: dict[str, str] = {}
    try:
        reported = omap.read(io, NODE_ADDRESSES) or {}
        metadata = header_metadata.read(io, name, image_id) if image_id else {}
    except CephCSIError as error:
        log.debug("watcher owners unknown", exc_info=error)
        return found
    for node, address in reported.items():
        _add(found, address, node)
    for key, address in metadata.items():
        if key.startswith(ADDRESS_PREFIX):
            _add(found, address, key.rpartition("/")[2])
        elif key.startswith(EARLY_ADDRESS_PREFIX):
            _add(found, address, key[len(EARLY_ADDRESS_PREFIX):])
    return found


def _add(found: dict[str, str], address: str, node: str) -> None:
    try:
        found[blocklist.host_of(address)] = node
    except InvalidArgument:
        pass


def describe(io: rados.Ioctx, name: str, image_id: str, watchers: list[dict[str, object]]) -> tuple[list[str], bool]:
    """One phrase per watcher ("client.4123 at 10.0.0.5:0/77 (node node-a, fenced)") and whether
    every watcher is fenced (their watches lapse by themselves)."""
    nodes = nodes_by_ip(io, name, image_id)
    try:
        ledger = omap.read(io, FENCE_LEDGER) or {}
    except CephCSIError as error:
        log.debug("fence ledger not readable", exc_info=error)
        ledger = {}
    fenced_entries = {key.partition("/")[2]: "" for key in ledger}
    phrases, fenced = [], 0
    for watcher in watchers:
        address = str(watcher.get("addr", "?"))
        notes = []
        try:
            node = nodes.get(blocklist.host_of(address))
        except InvalidArgument:
            node = None
        if node:
            notes.append(f"node {node}")
        if blocklist.blocks(fenced_entries, address):
            notes.append("fenced")
            fenced += 1
        suffix = f" ({', '.join(notes)})" if notes else ""
        phrases.append(f"client.{watcher.get('id', '?')} at {address}{suffix}")
    return phrases, bool(watchers) and fenced == len(watchers)
