"""Node layer (domain): everything NodeStage/Publish need below the CSI servicer.

    service.py      wiring from settings, per-volume/per-path locks, stats, topology entry point
    stager.py       NodeStage/NodeUnstage: map → mkfs (only if empty) → mount, and back
    publisher.py    NodePublish/NodeUnpublish: bind mounts of the staged volume
    stage_record.py the on-disk record that makes staging restart-safe
    rederive.py     a stand-in record rebuilt from mounts and mappers when the record is lost
    mappers/        krbd, rbd-nbd, fuse (rbd-fuse + loop) and their selection
    filesystems.py  blkid probe, mkfs defaults, mount options
    mounts.py       /proc/self/mountinfo parser, mount/umount/bind
    devices.py      waiting for device nodes (pyudev or polling), device sizes, claims (O_EXCL)
    stats.py        NodeGetVolumeStats usage and volume condition
    topology.py     topology segments from the Node object's labels
    paths.py        staging/target path checks
    requests.py     domain request dataclasses (no protobuf below the servicer)
    exec.py         the one place external commands run

See docs/ARCHITECTURE.md for the layering rules.
"""
