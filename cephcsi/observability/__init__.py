"""observability layer; see docs/ARCHITECTURE.md."""
