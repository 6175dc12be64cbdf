"""The recipes installed for this nscas: the ``nscas.recipes`` entry-point group.

Its own module, imported by the runner and the exporter only, so that the group's name (a
string that names a package) is not part of every recipe's code identity (nscas.runs.codetree
follows module names written as strings).
"""

from __future__ import annotations

import importlib.metadata

from nscas.errors import RecipeError
from nscas.runs.recipe import Recipe
from nscas.suggestions import did_you_mean

ENTRY_POINT_GROUP = "nscas.recipes"


def available_recipes() -> list[str]:
    """Names of every installed recipe, sorted."""
    return sorted(ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def unknown_recipe(name: str) -> str:
    """What to say of a recipe name nothing registers: the closest known name, if one is
    close (``unknown recipe 'trian'; did you mean 'train'?``), and every known name."""
    known = available_recipes()
    return f"unknown recipe {name!r}{did_you_mean(name, known)} (known: {', '.join(known)})"


def registered_recipe(name: str) -> Recipe | None:
    """The recipe registered under ``name``, imported (only that one), or None if none is."""
    eps = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=name)
    if not eps:
        return None
    recipe = next(iter(eps)).load()
    if not isinstance(recipe, Recipe):
        raise RecipeError(f"entry point {name!r} does not name a Recipe")
    return recipe
