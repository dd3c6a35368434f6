"""Kubernetes machinery: API client, informers, work queues, leader election and events for
the embedded sidecars (what client-go gives the Go ones). Import the modules directly. No CSI,
Ceph, sidecar or cephcsi.errors imports (an import-linter contract); its own errors are
cephcsi.kube.errors. Design: docs/design/kubernetes-machinery.md.
"""
