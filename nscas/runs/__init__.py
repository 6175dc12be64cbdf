"""Runs: recipe files, the runner, the recipe API, work areas, code identity, variants."""
