"""Fixtures for the real Ceph test cluster."""
