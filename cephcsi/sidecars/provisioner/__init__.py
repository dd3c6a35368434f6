"""The embedded external-provisioner: PVC → CreateVolume → PV, and released PV → DeleteVolume.
The map of its modules is in docs/design/sidecars.md.
"""
