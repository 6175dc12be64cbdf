"""Fixtures of the runner tests: a test-only probe recipe, and the CLI invoked in-process."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import Result

from nscas.runs import plans
from nscas.runs.recipe import Recipe
from nscas.store.writer import init_store
from tests.runner import probe_recipe


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A directory holding a new store (``.nscas``): the runner tests' working directory."""
    init_store(tmp_path).close()
    return tmp_path


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch) -> Recipe:
    """Make ``recipe = "probe"`` resolve to the test-only probe recipe."""
    real = plans.load_recipe

    def load(name: str) -> Recipe:
        return probe_recipe.RECIPE if name == "probe" else real(name)

    monkeypatch.setattr(plans, "load_recipe", load)
    return probe_recipe.RECIPE


@pytest.fixture
def nscas() -> Callable[..., Result]:
    """Invoke the real ``nscas`` app in-process (plain output: not a terminal)."""
    from typer.testing import CliRunner

    from nscas.cli import root as main

    assert main.COMMANDS["run"].module == "run"
    assert main.COMMANDS["import-hf"].module == "import_hf"
    runner = CliRunner()

    def invoke(*args: object) -> Result:
        return runner.invoke(main.app, [str(a) for a in args], catch_exceptions=False)

    return invoke
