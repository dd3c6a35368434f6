"""node layer; see docs/ARCHITECTURE.md."""
