"""The embedded external-attacher: VolumeAttachments of this driver → attached.

- strategy: what "attach" means, chosen from ControllerGetCapabilities (trivial for rbd).
- controller: informer handler, work queue and workers for one leadership term.
"""
