"""Upkeep of a store: fsck (every check, never just the first finding) and garbage collection."""
