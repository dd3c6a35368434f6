"""csi layer; see docs/ARCHITECTURE.md."""
