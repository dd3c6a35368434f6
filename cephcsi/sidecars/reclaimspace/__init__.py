"""The reclaim-space schedule loop (leader only): docs/reclaim-space.md."""
