"""Remotes: pushing to and pulling from other stores (docs/format.md §5.11)."""
