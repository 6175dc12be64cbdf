"""docs/recipes.md's worked example, run as the doc says: registered through the
``nscas.recipes`` entry-point group, run with ``nscas run``, a receipt, then a cache hit."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from nscas.store.opening import open_store
from tests.cli.conftest import Nscas, assert_user_error, run_process
from tests.cli.example_recipe import ENTRY_POINT, PACKAGE, wordcount

__all__ = ["wordcount"]  # the fixture, imported for pytest

REPO = Path(__file__).resolve().parents[2]


def _project(tmp_path: Path) -> Path:
    """The example's recipe file and sample text, copied where a test may run them."""
    where = tmp_path / "example"
    where.mkdir()
    for name in ("recipe.toml", "sample.txt"):
        shutil.copy(PACKAGE / name, where / name)
    return where


def test_the_example_recipe_registers_runs_and_is_cached(nscas: Nscas, store: Path,
                                                         tmp_path: Path, wordcount: str) -> None:
    where = _project(tmp_path)
    assert nscas("add", str(where / "sample.txt"), "--ref", "texts/sample").exit_code == 0
    first = nscas("run", str(where / "recipe.toml"), "--json")
    assert first.exit_code == 0, first.stderr
    ran = first.json()
    assert ran["cached"] is False
    assert ran["claims"] == {"words": 44, "distinct": 26}
    with open_store(store, readonly=True) as s:
        receipt = s.get_record(s.resolve(ran["receipt"]))
        action = s.get_record(s.resolve(receipt["action"]))
        code = s.get_record(s.resolve(action["code"]))["entries"]
        counts = json.loads(s.get_bytes(s.resolve("examples/wordcount/sample")))
        text = s.resolve("texts/sample")
    assert receipt["status"] == "succeeded" and receipt["step"] == "count-sample"
    assert receipt["claims"]["words"] == {"value": 44, "verifier": "wordcount"}
    assert action["recipe"] == "wordcount@1"
    assert action["inputs"] == {"text": str(text)}
    assert action["params"] == {"lowercase": True, "top": 5}  # every default filled in
    # The recipe's own package is part of its code identity, beside the nscas core it uses.
    assert {"nscas_wordcount/recipe.py", "nscas_wordcount/__init__.py"} <= set(code)
    assert counts["words"] == 44 and counts["top"][0] == ["the", 8]
    second = nscas("run", str(where / "recipe.toml"), "--json").json()
    assert second["cached"] is True
    assert (second["receipt"], second["outputs"]) == (ran["receipt"], ran["outputs"])
    # A changed param is another action: it runs, and compare names the param that differs.
    other = nscas("run", str(where / "recipe.toml"), "--set", "lowercase=false", "--json").json()
    assert other["cached"] is False and other["receipt"] != ran["receipt"]
    table = nscas("compare", ran["receipt"], other["receipt"], "--json").json()
    assert table["differ"]["params"] == ["lowercase"]


def test_bad_params_of_the_example_are_one_line(nscas: Nscas, store: Path, tmp_path: Path,
                                                wordcount: str) -> None:
    where = _project(tmp_path)
    nscas("add", str(where / "sample.txt"), "--ref", "texts/sample")
    assert_user_error(nscas("run", str(where / "recipe.toml"), "--set", "top=0"),
                      "top must be at least 1")
    assert_user_error(nscas("run", str(where / "recipe.toml"), "--set", "top=many"), "top")


def test_the_example_in_a_real_process(tmp_path: Path, wordcount: str) -> None:
    where = _project(tmp_path)
    env = {"PYTHONPATH": os.pathsep.join([*wordcount.split(":"), str(REPO)])}
    assert run_process("init", cwd=where, env=env).exit_code == 0
    assert run_process("add", "sample.txt", "--ref", "texts/sample", cwd=where, env=env).exit_code == 0
    r = run_process("run", "recipe.toml", cwd=where, env=env)
    assert r.exit_code == 0, r.stderr
    assert "wordcount" in r.stdout and "ran" in r.stdout
    again = run_process("run", "recipe.toml", "--json", cwd=where, env=env)
    assert json.loads(again.stdout)["cached"] is True
    # Without the registration the recipe is unknown: one line, exit 2.
    r = run_process("run", "recipe.toml", cwd=where)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert "unknown recipe 'wordcount'" in r.stderr


def test_the_doc_shows_the_example_as_it_is() -> None:
    doc = (REPO / "docs" / "recipes.md").read_text()
    assert ENTRY_POINT.replace(" = ", ' = "') + '"' in (PACKAGE / "pyproject.toml").read_text()
    assert ENTRY_POINT.replace(" = ", ' = "') + '"' in doc
    source = (PACKAGE / "nscas_wordcount" / "recipe.py").read_text()
    for block in doc.split("```python\n")[1:]:  # every Python block is a part of the example
        code = block.split("```")[0]
        assert code.strip() in source, code
    assert "tests/cli/test_recipe_example.py" in doc
