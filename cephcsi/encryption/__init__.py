"""Encryption at rest, compatible with ceph-csi (issue 33): the StorageClass keys, the KMS
ConfigMap, the KMS types, and the per-volume passphrase kept where ceph-csi keeps it."""
