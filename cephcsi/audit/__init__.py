"""`cephcsi audit`: find (and, where provably safe, repair) inconsistencies between the
driver's journal, the RBD pool, its trash and, optionally, the cluster's PersistentVolumes and
VolumeSnapshotContents.

One job per module: `model` (the records), `scan` (read one snapshot of a pool) and
`scan_snaps` (the images' RBD snapshots and the journal leases held, for the snapshot rules),
`pvs` and `snapshot_contents` (read the PersistentVolumes and VolumeSnapshotContents, through
`kube_lists`), `classify` (pure: snapshot → findings, volume journal and librbd's objects)
and `classify_snaps` (the snapshot journal, temporary snapshots, unfinished snapshot images,
VolumeSnapshotContents), `repair` (act on findings, each under its entry's journal lock),
`report` (table / JSON) and `run` (the sequence).
"""
