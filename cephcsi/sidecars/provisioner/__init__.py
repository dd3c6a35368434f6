"""The embedded external-provisioner: PVC → CreateVolume → PV, and released PV → DeleteVolume.

Modules, each with one job:
- names: annotation, finalizer and parameter names shared with Kubernetes/external-provisioner.
- claims: which claims to act on and how (pure).
- secrets: StorageClass secret references and their templates (pure).
- request: claim + class → CreateVolume request (pure).
- topology: accessibility requirements and PV node affinity (pure).
- pvspec: the PV object (pure).
- outcome: classification of failures (pure).
- context: what the workers share.
- provision: the claim worker (provision, and clean-up of claims deleted mid-provision).
- delete: the volume worker (DeleteVolume, PV deletion, PV finalizer).
- controller: informer handlers, work queues and workers for one leadership term.
"""
