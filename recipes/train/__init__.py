"""Recipe train."""
