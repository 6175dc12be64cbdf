"""The store: opening, reading, writing, checking (fsck, gc), lineage, data backends."""
