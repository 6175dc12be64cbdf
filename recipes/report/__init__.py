"""Recipe report."""
