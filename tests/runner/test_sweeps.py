"""Sweeps (docs/format.md §6.13): an array set on a param that takes none, or a ``[sweep]``
table, runs the step once per value and its downstream steps once per arm, each arm with its
own step names and refs; ``nscas compare --pipeline`` shows the arms as one table."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from typer.testing import Result

from nscas.objects.digests import Digest
from nscas.runs.config import param_takes_array
from nscas.runs.plans import load_plan_file
from nscas.runs.recipe import Recipe
from nscas.runs.runner import run_file
from tests.runner.helpers import opened, snapshot, write

Nscas = Callable[..., Result]

PIPELINE = """
name = "swept"
refs = "exp/swept"
[[step]]
name = "a"
recipe = "probe"
params = { label = "a" }
[[step]]
name = "b"
recipe = "probe"
inputs = { source = "step.a.seen" }
outputs = { seen = "keep/b" }
[[step]]
name = "c"
recipe = "probe"
inputs = { source = "step.b.seen", first = "step.a.receipt" }
[[step]]
name = "apart"
recipe = "probe"
params = { label = "apart" }
"""
ARMS = ["a", "apart", "b.label-x", "b.label-y", "c.b.label-x", "c.b.label-y"]


def test_an_array_set_sweeps_the_step_and_what_depends_on_it(home: Path, probe: Recipe) -> None:
    file = write(home, "p.toml", PIPELINE)
    sets = ('b.label=["x", "y"]',)
    assert sorted(s.name for s in load_plan_file(file, sets).steps) == ARMS
    with opened(home) as store:
        results = {r.step: r for r in run_file(store, file, sets=sets)}
        assert sorted(results) == ARMS
        for arm in ("x", "y"):
            action = store.get_record(results[f"c.b.label-{arm}"].action)
            assert action["inputs"]["source"] == str(results[f"b.label-{arm}"].outputs["seen"])
            assert action["inputs"]["first"] == str(results["a"].receipt)
            b_params = store.get_record(results[f"b.label-{arm}"].action)["params"]
            assert b_params["label"] == arm
            assert store.ref_get(f"exp/swept/c.b.label-{arm}/receipt") == \
                results[f"c.b.label-{arm}"].receipt
            assert store.ref_get(f"keep/b/variants/b.label-{arm}") == \
                results[f"b.label-{arm}"].outputs["seen"]
        assert store.ref_get("keep/b") is None  # the unswept step's own ref is not moved
        receipt = store.get_record(results["b.label-x"].receipt)
        assert receipt["step"] == "b.label-x" and "variant" not in receipt
        again = run_file(store, file, sets=sets)
        assert all(r.cached for r in again)


def test_a_sweep_table_gives_the_arms_an_array_set_gives(home: Path, probe: Recipe) -> None:
    file = write(home, "p.toml", PIPELINE + '[sweep]\n"b.label" = ["x", "y"]\n')
    by_set = write(home, "q.toml", PIPELINE)
    with opened(home) as store:
        table = {r.step: r.action for r in run_file(store, file)}
    assert sorted(table) == ARMS
    with opened(home) as store:
        given = {r.step: r.action for r in run_file(store, by_set, sets=('b.label=["x","y"]',))}
    for step in ("b.label-x", "b.label-y", "a", "apart"):
        assert table[step] == given[step]


def test_two_swept_params_give_their_product(home: Path, probe: Recipe) -> None:
    file = write(home, "p.toml", PIPELINE)
    steps = {s.name for s in load_plan_file(file, ("b.label=[\"x\",\"y\"]",
                                                   "a.scale=[1.0, 2.0]")).steps}
    assert {"a.scale-1.0", "a.scale-2.0", "apart"} <= steps
    assert "b.a.scale-2.0_b.label-y" in steps
    assert "c.a.scale-1.0_b.label-x" in steps
    assert len([s for s in steps if s.startswith("c.")]) == 4


@dataclass(frozen=True)
class _Listy:
    sizes: list[int] = field(default_factory=list)
    pair: tuple[int, int] | None = None
    lr: float = 1.0


def test_an_array_on_a_param_that_takes_one_is_a_value_not_a_sweep() -> None:
    assert param_takes_array(_Listy, ("sizes",))
    assert param_takes_array(_Listy, ("pair",))
    assert not param_takes_array(_Listy, ("lr",))
    assert not param_takes_array(_Listy, ("missing",))


@pytest.mark.parametrize(("args", "message"), [
    (("--set", "b.label=[]"), "sweeps no values"),
    (("--set", "nosuch.label=[1]"), "no such step"),
])
def test_a_bad_sweep_is_one_line_and_writes_nothing(home: Path, probe: Recipe, nscas: Nscas,
                                                    args: tuple[str, ...], message: str) -> None:
    file = write(home, "p.toml", PIPELINE)
    with opened(home) as store:
        before = snapshot(store)
    result = nscas("--store", home, "run", "--jobs", "1", file, *args)
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    with opened(home) as store:
        assert snapshot(store) == before


@pytest.mark.parametrize("table", ['[sweep]\n"b.label" = []\n', "[sweep]\nb = [1]\n",
                                   '[sweep]\n"b.label" = 3\n'])
def test_a_bad_sweep_table_is_refused(home: Path, probe: Recipe, nscas: Nscas,
                                      table: str) -> None:
    file = write(home, "p.toml", PIPELINE + table)
    result = nscas("--store", home, "run", "--jobs", "1", file)
    assert result.exit_code == 2
    assert "sweep" in result.output and "Traceback" not in result.output


def test_compare_shows_the_sweep_as_one_table(home: Path, probe: Recipe, nscas: Nscas) -> None:
    file = write(home, "p.toml", PIPELINE)
    assert nscas("--store", home, "run", "--jobs", "1", file, "--set", 'b.label=["x","y"]').exit_code == 0
    shown = nscas("--store", home, "compare", "--pipeline", "swept", "--json")
    assert shown.exit_code == 0, shown.output
    runs = {run["step"]: run for run in json.loads(shown.output)["runs"]}
    # (the probe's output is its inputs: both c arms are one action, which ran once)
    assert {"a", "apart", "b.label-x", "b.label-y"} <= set(runs)
    labels = {runs[s]["params"]["label"] for s in ("b.label-x", "b.label-y")}
    assert labels == {"x", "y"}
    Digest.parse(runs["b.label-x"]["receipt"])
