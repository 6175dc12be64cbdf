"""Recipe prepare."""
