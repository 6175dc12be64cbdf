"""Recipes: registered pure functions of committed object IDs."""
