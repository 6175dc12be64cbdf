"""Serving (docs/experiment.md §5): the serving claims recomputed from the client's request log."""
