"""A recipe's code identity is its first-party import closure, and a cache miss says what changed.

The probe recipe here lives in a package written to a temporary directory, so that its files
can be edited: editing any file the closure reaches changes the action ID, editing one it
does not reach (another module of the package, a CLI-like module that imports the recipe)
keeps it, and ``nscas run`` names the file that changed.
"""

from __future__ import annotations

import importlib
import itertools
import json
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from typer.testing import Result

from nscas.runs import plans
from nscas.runs.codetree import module_files, recipe_files
from nscas.runs.recipe import Recipe
from nscas.runs.registry import available_recipes
from nscas.runs.runner import StepResult, run_file
from nscas.store.writer import Store, init_store
from tests.runner.helpers import write

_PACKAGES = itertools.count()

RECIPE_PY = '''
"""A probe recipe whose closure reaches every kind of reference the scanner follows."""

from __future__ import annotations

from dataclasses import dataclass

from nscas.runs.recipe import Claim, InputSpec, Recipe, RecipeResult, RunContext

from . import helper
from .helper import THING  # a name, not a module: pkg.helper.THING is no file

WORKER_MODULE = "{pkg}.worker"  # started with python -m: named, never imported
TABLE = "table.json"  # a data file read at run time


@dataclass(frozen=True, slots=True, kw_only=True)
class Params:
    label: str = ""
    """Changes the action and nothing else."""


def run(ctx: RunContext) -> RecipeResult:
    from {pkg} import late  # only when it runs: importing the recipe misses it

    value = f"{{helper.NAME}}-{{THING}}-{{late.LATE}}-{{ctx.params.label}}"
    return RecipeResult(outputs={{"seen": ctx.store.put_bytes(value.encode())}},
                        claims={{"value": Claim(value=value, verifier="integrity")}})


RECIPE = Recipe(name="probe-closure", version="1", params=Params,
                inputs={{"source": InputSpec(required=False)}}, outputs=("seen",), run=run)
'''

FILES = {
    "__init__.py": '"""A temporary recipe package."""\n',
    "helper.py": "from .leaf import LEAF\n\nNAME = 'helper'\nTHING = LEAF\n",
    "leaf.py": "LEAF = 'leaf'\n",
    "late.py": "LATE = 'late'\n",
    "worker.py": "print('a worker')\n",
    "table.json": '{"rows": []}\n',
    "other.py": "OTHER = 'not imported by the recipe'\n",
    "cli.py": "from .recipe import RECIPE  # imports the recipe; the recipe does not import it\n",
}
REACHED = ("__init__.py", "recipe.py", "helper.py", "leaf.py", "late.py", "worker.py",
           "table.json")
NOT_REACHED = ("other.py", "cli.py")


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """A fresh importable package ``(name, directory)``; its recipe runs as ``probe-closure``."""
    name = f"nscas_probe_pkg_{next(_PACKAGES)}"
    root = tmp_path / "src"
    directory = root / name
    directory.mkdir(parents=True)
    for file, text in FILES.items():
        (directory / file).write_text(text, encoding="utf-8")
    (directory / "recipe.py").write_text(textwrap.dedent(RECIPE_PY).format(pkg=name),
                                        encoding="utf-8")
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    recipe: Recipe = importlib.import_module(f"{name}.recipe").RECIPE
    real = plans.load_recipe
    monkeypatch.setattr(plans, "load_recipe",
                        lambda n: recipe if n == "probe-closure" else real(n))
    yield name, directory
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with init_store(tmp_path / "home") as s:
        yield s


def run_probe(store: Store, directory: Path, label: str = "",
              output: str | None = "probe/seen") -> StepResult:
    text = f'recipe = "probe-closure"\n[params]\nlabel = "{label}"\n'
    if output is not None:
        text += f'[outputs]\nseen = "{output}"\n'
    (result,) = run_file(store, write(directory.parent.parent, "probe.toml", text))
    return result


def edit(path: Path) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write("\n" if path.suffix == ".json" else "# edited\n")


def test_the_closure_follows_every_import_and_names_its_data(package: tuple[str, Path]) -> None:
    name, _ = package
    files = recipe_files(importlib.import_module(f"{name}.recipe").RECIPE)
    mine = {k.removeprefix(f"{name}/") for k in files if k.startswith(f"{name}/")}
    assert mine == set(REACHED)
    # nscas core is first-party too (nscas.runs.recipe and what it imports), the rest of the
    # distribution is not reached: no recipe, CLI or verifier module.
    assert {"nscas/__init__.py", "nscas/runs/recipe.py", "nscas/objects/digests.py"} <= set(files)
    assert not [k for k in files if k.startswith(("nscas/recipes/", "nscas/cli/",
                                                  "nscas/verifiers/"))]
    assert name + ".recipe" in sys.modules and name + ".late" not in sys.modules  # not imported


@pytest.mark.parametrize("file", REACHED)
def test_editing_a_file_in_the_closure_changes_the_action(package: tuple[str, Path],
                                                          store: Store, file: str) -> None:
    name, directory = package
    first = run_probe(store, directory)
    edit(directory / file)
    second = run_probe(store, directory)
    assert (second.cached, second.action != first.action) == (False, True)
    assert second.miss is not None and second.miss.previous == first.receipt
    assert second.miss.code.changed == (f"{name}/{file}",)
    assert (second.miss.params, second.miss.inputs, second.miss.recipe) == ((), (), None)


@pytest.mark.parametrize("file", NOT_REACHED)
def test_editing_a_file_outside_the_closure_keeps_the_action(package: tuple[str, Path],
                                                             store: Store, file: str) -> None:
    _, directory = package
    first = run_probe(store, directory)
    edit(directory / file)
    second = run_probe(store, directory)
    assert (second.cached, second.action, second.receipt) == (True, first.action, first.receipt)


def test_a_new_module_in_the_closure_is_an_added_file(package: tuple[str, Path],
                                                      store: Store) -> None:
    name, directory = package
    first = run_probe(store, directory)
    (directory / "extra.py").write_text("EXTRA = 1\n", encoding="utf-8")
    (directory / "leaf.py").write_text("from .extra import EXTRA\n\nLEAF = 'leaf'\n",
                                       encoding="utf-8")
    second = run_probe(store, directory)
    assert second.miss is not None and second.miss.previous == first.receipt
    assert (second.miss.code.changed, second.miss.code.added) == (
        (f"{name}/leaf.py",), (f"{name}/extra.py",))


def test_the_last_run_of_the_step_is_found_through_its_output_ref(package: tuple[str, Path],
                                                                  store: Store) -> None:
    _, directory = package
    first = run_probe(store, directory, label="a")
    second = run_probe(store, directory, label="b")
    assert second.miss is not None and second.miss.previous == first.receipt
    assert (second.miss.params, second.miss.code.changed) == (("label",), ())
    # A step with neither inputs nor output refs has no way to name its last run.
    alone = run_probe(store, directory, label="c", output=None)
    assert alone.miss is not None and alone.miss.previous is None


def test_nscas_run_names_the_changed_file(package: tuple[str, Path], tmp_path: Path,
                                          nscas: Callable[..., Result]) -> None:
    name, directory = package
    home = tmp_path / "home"
    init_store(home).close()
    path = write(tmp_path, "probe.toml", 'recipe = "probe-closure"\n[outputs]\nseen = "p/s"\n')
    first = nscas("--store", home, "run", path)
    assert first.exit_code == 0, first.output
    assert "since" not in first.stdout  # nothing to compare with yet
    receipt = first.stdout.splitlines()[0].rsplit(" ", 1)[1]
    edit(directory / "late.py")
    second = nscas("--store", home, "run", path)
    assert second.exit_code == 0, second.output
    rows = [line.split(maxsplit=2) for line in second.stdout.splitlines()[2:]]
    assert ["since", "receipt", receipt] in rows
    assert ["changed", "code", f"{name}/late.py (changed)"] in rows
    edit(directory / "late.py")
    third = json.loads(nscas("--store", home, "run", path, "--json").stdout)
    assert third["miss"]["previous"] != receipt
    assert third["miss"]["code"] == {"changed": [f"{name}/late.py"], "added": [], "removed": []}


def test_the_shipped_recipes_closures() -> None:
    evaluate = module_files("nscas.recipes.evaluate.recipe")
    assert "nscas/recipes/init/presets.py" in evaluate  # the module its sources list left out
    assert not [k for k in evaluate if k.startswith(("nscas/recipes/train/", "nscas/cli/"))]
    prepare = module_files("nscas.recipes.prepare.recipe")
    assert "nscas/recipes/common/default_wordings.json" in prepare  # read at run time
    train = module_files("nscas.recipes.train.recipe")
    assert {"nscas/recipes/train/worker.py", "nscas/recipes/train/loop.py"} <= set(train)
    for recipe in available_recipes():
        files = recipe_files(plans.load_recipe(recipe))
        assert not [k for k in files if k.startswith(("nscas/cli/", "nscas/verifiers/"))], recipe
