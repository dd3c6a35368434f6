"""The embedded snapshotter: csi-snapshotter's job (VolumeSnapshotContent → CreateSnapshot /
DeleteSnapshot), run leader-elected in --mode=controller like the provisioner."""
