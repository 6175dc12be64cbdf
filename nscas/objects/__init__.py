"""Objects and chunks: IDs, canonical records, record kinds, chunk files (docs/format.md §1-5)."""
