"""Shared code of the recipes: one checker, task generation, tokenisation, generation."""
