"""Capacity tracking (external-provisioner's --enable-capacity): CSIStorageCapacity objects per
StorageClass of this driver and topology segment, from GetCapacity, written by the leader."""
