"""Recipe serve."""
