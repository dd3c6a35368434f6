"""volumes layer; see docs/ARCHITECTURE.md."""
