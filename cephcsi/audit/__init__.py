"""`cephcsi audit`: find (and, where provably safe, repair) inconsistencies between the
driver's journal, the RBD pool, its trash and, optionally, the cluster's PersistentVolumes.

One job per module: `model` (the records), `scan` (read one snapshot of a pool), `pvs` (read
the PersistentVolumes), `classify` (pure: snapshot → findings), `repair` (act on findings,
each under the volume's journal lock), `report` (table / JSON) and `run` (the sequence).
"""
