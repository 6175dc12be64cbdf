"""An example recipe package for nscas: ``wordcount`` (docs/recipes.md walks through it)."""
