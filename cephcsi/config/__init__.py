"""config layer; see docs/ARCHITECTURE.md."""
