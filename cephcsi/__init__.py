"""cephcsi: a Ceph RBD CSI driver with the Kubernetes CSI sidecars embedded."""

__version__ = "0.1.0"
