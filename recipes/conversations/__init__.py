"""Recipes ``conversations`` (replay and retention sets selected from a chat corpus) and
``probes`` (retention probes answered by the seed model itself): docs/experiment.md §2.1, §2.2."""
