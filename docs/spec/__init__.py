"""Data files docs/format.md defines and pins by SHA-256 (the report's page templates), read by
the recipes and the verifiers alike; no code."""
