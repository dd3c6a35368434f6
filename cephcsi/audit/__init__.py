"""`cephcsi audit`: find (and, where provably safe, repair) inconsistencies between the
driver's journal, the RBD pool, its trash and, optionally, the cluster's PersistentVolumes and
VolumeSnapshotContents. Reading (`scan*`, `pvs`, `snapshot_contents`), judging (`classify*`,
`journal_rules`: pure) and acting (`repair`, `report`, `run`) are separate modules; the map of
them is in docs/design/audit.md.
"""
