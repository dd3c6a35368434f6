"""cephcsi benchmarks: `.venv/bin/python -m bench` (see bench/README.md)."""
