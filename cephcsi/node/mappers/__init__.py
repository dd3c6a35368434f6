"""Mappers turn an RBD image into a block device on this node and back.

base.py (the protocol and MapRequest), rbd_cli.py (shared `rbd device` logic), krbd.py,
nbd.py, fuse.py (rbd-fuse + loop device), select.py (--mounter=auto and per-volume choice),
options.py (mapOptions/unmapOptions), read_affinity.py (krbd read_from_replica and
crush_location from the Node's labels), keys.py (cephx key format check before any tool runs),
exclusive.py (the `exclusive` option for single-node writers), nbd_attachments.py (what a restarted
plugin needs to re-attach rbd-nbd devices, cephcsi.node.nbd_healer).
"""
