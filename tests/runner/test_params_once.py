"""A step's params table is parsed once, by the runner, and that object is what the recipe gets."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from nscas.errors import ConfigError
from nscas.runs import planning, plans, runner
from nscas.runs.recipe import Recipe, RecipeResult, RunContext
from nscas.store.writer import Store
from tests.runner import probe_recipe
from tests.runner.helpers import snapshot, write

PIPELINE = """
[[step]]
name = "one"
recipe = "probe"
params = { label = "first" }

[[step]]
name = "two"
recipe = "probe"
inputs = { source = "step.one.seen" }
params = { label = "second" }
"""


@pytest.fixture
def handed(monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], list[Any]]:
    """(params objects the runner parsed, params objects recipes were handed), in run order."""
    parsed: list[Any] = []
    seen: list[Any] = []
    real_parse = planning.parse_params

    def parse(*args: Any, **kwargs: Any) -> Any:
        parsed.append(real_parse(*args, **kwargs))
        return parsed[-1]

    def run(ctx: RunContext) -> RecipeResult:
        seen.append(ctx.params)
        return probe_recipe.run(ctx)

    recipe = replace(probe_recipe.RECIPE, run=run)
    real_load = plans.load_recipe

    def load(name: str) -> Recipe:
        return recipe if name == "probe" else real_load(name)

    monkeypatch.setattr(planning, "parse_params", parse)
    monkeypatch.setattr(plans, "load_recipe", load)
    return parsed, seen


def test_each_step_is_parsed_once_and_the_recipe_gets_that_object(
        store: Store, tmp_path: Path, handed: tuple[list[Any], list[Any]]) -> None:
    parsed, seen = handed
    runner.run_file(store, write(tmp_path, "pipeline.toml", PIPELINE))
    assert [p.label for p in parsed] == ["first", "second"]
    assert len(seen) == 2 and all(a is b for a, b in zip(parsed, seen, strict=True))
    assert all(isinstance(p, probe_recipe.ProbeParams) for p in seen)


def test_a_bad_key_in_a_later_step_is_refused_before_any_step_runs(
        store: Store, tmp_path: Path, handed: tuple[list[Any], list[Any]]) -> None:
    _, seen = handed
    path = write(tmp_path, "pipeline.toml",
                 PIPELINE.replace('label = "second"', 'lable = "second"'))
    before = snapshot(store)
    with pytest.raises(ConfigError) as err:
        runner.run_file(store, path)
    assert str(path) in str(err.value)
    assert "step 'two': unknown key(s) in params: lable" in str(err.value)
    assert seen == [] and snapshot(store) == before
