"""``nscas compare`` and ``nscas log`` on real runs of the example recipe (docs/recipes.md):
one row per receipt, the params and claims that differ, by pipeline, sorted, and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from nscas.store.opening import open_store
from tests.cli.conftest import Nscas, assert_user_error, snapshot
from tests.cli.example_recipe import wordcount

__all__ = ["wordcount"]

_STEP = """
[[step]]
name = "{name}"
recipe = "wordcount"
inputs = {{ text = "{text}" }}
params = {{ lowercase = {lowercase}, top = {top} }}
outputs = {{ counts = "words/{name}" }}
"""


def _pipeline(where: Path, *, name: str = "words", second_top: int = 2) -> Path:
    text = "\n".join([f'name = "{name}"',
                      _STEP.format(name="lower", text="texts/a", lowercase="true", top=3),
                      _STEP.format(name="cased", text="texts/a", lowercase="false",
                                   top=second_top),
                      _STEP.format(name="other", text="texts/b", lowercase="true", top=3)])
    path = where / f"{name}.toml"
    path.write_text(text)
    return path


@pytest.fixture
def ran(nscas: Nscas, tmp_path: Path, wordcount: str) -> dict[str, dict]:
    """A store that ran the three-step pipeline ``words``: step name -> its run's JSON."""
    (tmp_path / "a.txt").write_text("The cat and the dog. The end.\n")
    (tmp_path / "b.txt").write_text("one two three two one one\n")
    nscas("add", str(tmp_path / "a.txt"), "--ref", "texts/a")
    nscas("add", str(tmp_path / "b.txt"), "--ref", "texts/b")
    # One step at a time: compare lists a pipeline's steps in the order they started, which
    # for independent steps run at once is whichever started first.
    r = nscas("run", str(_pipeline(tmp_path)), "--json", "--jobs", "1")
    assert r.exit_code == 0, r.stderr
    return {s["step"]: s for s in r.json()}


def test_compare_a_pipeline(nscas: Nscas, ran: dict[str, dict]) -> None:
    out = nscas("compare", "--pipeline", "words", "--json").json()
    runs = out["runs"]
    assert [r["step"] for r in runs] == ["lower", "cased", "other"]
    assert [r["receipt"] for r in runs] == [ran[s]["receipt"] for s in ("lower", "cased", "other")]
    assert {r["pipeline"] for r in runs} == {"words"} and {r["recipe"] for r in runs} == {"wordcount@1"}
    assert out["differ"] == {"params": ["lowercase", "top"], "inputs": ["text"],
                             "claims": ["distinct", "words"]}
    assert runs[0]["claims"] == {"distinct": 5, "words": 7}  # the, cat, and, dog, end
    assert runs[1]["claims"] == {"distinct": 6, "words": 7}  # The and the apart
    # The table: one row per run, the differing params and claims as columns.
    lines = nscas("compare", "--pipeline", "words").stdout.splitlines()
    assert lines[0] == "3 run(s) of pipeline words"
    assert lines[1].split() == ["receipt", "step", "recipe", "inputs.text", "lowercase", "top",
                                "distinct", "words"]
    assert lines[2].split()[:3] == [ran["lower"]["receipt"], "lower", "wordcount@1"]
    assert lines[2].split()[4:] == ["true", "3", "5", "7"]


def test_compare_sorts_and_resolves_outputs_to_their_runs(nscas: Nscas, ran: dict) -> None:
    # An output ref stands for the receipt that produced it.
    out = nscas("compare", "words/other", "words/lower", "--json").json()
    assert [r["receipt"] for r in out["runs"]] == [ran["other"]["receipt"], ran["lower"]["receipt"]]
    assert [r["named"] for r in out["runs"]] == ["words/other", "words/lower"]
    assert out["differ"]["params"] == [] and out["differ"]["inputs"] == ["text"]
    by = nscas("compare", "--pipeline", "words", "--sort", "distinct", "--json").json()
    assert [r["claims"]["distinct"] for r in by["runs"]] == [3, 5, 6]
    down = nscas("compare", "--pipeline", "words", "--sort", "distinct", "--desc", "--json").json()
    assert [r["claims"]["distinct"] for r in down["runs"]] == [6, 5, 3]
    top = nscas("compare", "--pipeline", "words", "--sort", "top", "--json").json()
    assert [r["step"] for r in top["runs"]] == ["cased", "lower", "other"]
    # A claim with one value in every run is said once, not as a column.
    r = nscas("compare", "words/lower", "words/cased")
    assert r.stdout.splitlines()[-1] == "The same in every run: words=7."


def test_compare_takes_the_latest_run_of_each_step(nscas: Nscas, ran: dict,
                                                   tmp_path: Path) -> None:
    again = nscas("run", str(_pipeline(tmp_path, second_top=4)), "--json").json()
    cased = next(s for s in again if s["step"] == "cased")
    assert cased["cached"] is False
    out = nscas("compare", "--pipeline", "words", "--json").json()
    # the latest of each step, in the order they started: the new run of cased is last
    assert [r["receipt"] for r in out["runs"]] == [
        ran["lower"]["receipt"], ran["other"]["receipt"], cased["receipt"]]


def test_log_shows_step_pipeline_and_claims(nscas: Nscas, ran: dict) -> None:
    entries = nscas("log", "--kind", "receipt/1", "--json").json()
    assert [(e["pipeline"], e["step"]) for e in entries] == [
        ("words", "other"), ("words", "cased"), ("words", "lower")]
    assert entries[0]["claims"] == {"distinct": 3, "words": 6}
    lines = nscas("log", "--kind", "receipt/1").stdout.splitlines()
    assert lines[0].split() == ["time", "kind", "size", "id", "step", "recipe", "status", "claims"]
    assert lines[1].split()[4:] == ["words/other", "wordcount@1", "succeeded", "distinct=3,",
                                    "words=6"]


def test_bad_input_is_one_line_and_writes_nothing(nscas: Nscas, store: Path, ran: dict,
                                                  tmp_path: Path) -> None:
    before = snapshot(store)
    assert_user_error(nscas("compare"), "REF|ID", "--pipeline")
    assert_user_error(nscas("compare", "words/lower", "--pipeline", "words"), "not both")
    assert_user_error(nscas("compare", "--pipeline", "wrods"),
                      "no succeeded receipt records pipeline 'wrods'", "did you mean 'words'?")
    assert_user_error(nscas("compare", "--pipeline", "words", "--sort", "distnct"),
                      "cannot sort by 'distnct'", "did you mean 'distinct'?")
    assert_user_error(nscas("compare", "words/lower", "--desc"), "--sort")
    assert_user_error(nscas("compare", "words/lower", "--claims", "nope"), "'nope'")
    assert_user_error(nscas("compare", "texts/a"), "texts/a is a blob that no succeeded run "
                                                   "produced")
    assert_user_error(nscas("compare", "words/lowr"), "did you mean 'words/lower'?")
    assert snapshot(store) == before
    with open_store(store, readonly=True) as s:
        assert s.ref_get("words/lower") is not None
