"""sidecars layer; see docs/ARCHITECTURE.md."""
