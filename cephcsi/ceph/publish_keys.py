"""Names of the publish and fencing records (no imports: the node plugin uses them too).

ceph-csi's image-metadata keys (>= 3.15) and cephcsi's two per-pool omap objects; what they
hold is described in cephcsi.volumes.publish."""
from __future__ import annotations

ADDRESS_PREFIX = ".rbd.csi.ceph.com/clientaddress/"
"""ceph-csi's key: + `<volume id>/<node id>` → the node's client IP ('' until reported)."""
EARLY_ADDRESS_PREFIX = ".rbd.csi.ceph.com/clientAddress/"
"""ceph-csi's first 3.15 key: + `<node id>`."""
USER_PREFIX = ".rbd.csi.ceph.com/userid/"
"""ceph-csi's key: + `<volume id>/<node id>` → the cephx user of the publish."""
PUBLISH_GUARD = "cephcsi.publish-guard"
"""Key in the image header's own omap (not image metadata: `rbd image-meta` does not show it,
clones do not copy it) → a random token every cephcsi publish replaces, in the same operation
that writes its record and only while the token is still the one it read."""
NODE_ADDRESSES = "cephcsi.node-addresses"
"""Omap object per pool: node id → the client address its node plugin reported."""
FENCE_LEDGER = "csi.fenced"
"""Omap object per pool: `<node id>/<address>` → volume id, for every blocklist entry the
controller added and has not removed."""
