"""kube layer; see docs/ARCHITECTURE.md."""
