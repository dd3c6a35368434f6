"""Fixtures for the real Kubernetes control plane (filled by the kube machinery work)."""
