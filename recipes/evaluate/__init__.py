"""Recipe evaluate."""
