"""Replay (docs/format.md §7.8): answers and training updates recomputed from committed weights."""
