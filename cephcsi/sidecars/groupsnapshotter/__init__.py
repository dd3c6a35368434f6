"""The embedded group snapshotter: csi-snapshotter's VolumeGroupSnapshotContent half
(→ CreateVolumeGroupSnapshot / GetVolumeGroupSnapshot / DeleteVolumeGroupSnapshot), run with the
snapshotter, leader-elected in --mode=controller."""
