"""Recipe commit."""
