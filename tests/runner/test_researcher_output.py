"""What a researcher reads after a run: every changed input and param as old -> new, one summary
line, the variant in ``log`` and ``compare``, and tables that fit an 80-column terminal."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import Result

from nscas.cli import render
from nscas.runs.changes import ABSENT, Change, changes_between
from nscas.runs.recipe import Recipe
from tests.runner.helpers import opened, write

Nscas = Callable[..., Result]

CHAIN = """
refs = "exp/chain"
[[step]]
name = "a"
recipe = "probe"
params = { label = "a" }
[[step]]
name = "b"
recipe = "probe"
inputs = { source = "step.a.seen", first = "step.a.receipt" }
[[step]]
name = "c"
recipe = "probe"
inputs = { source = "step.b.seen" }
"""
FULL_ID = re.compile(r"[0-9a-f]{64}")


def rows(out: str) -> list[list[str]]:
    return [line.split(maxsplit=2) for line in out.splitlines()]


def test_changes_between_gives_every_input_and_param_old_to_new() -> None:
    got = changes_between({"a": "x", "gone": "y"}, {"a": "z", "new": "w"},
                          {"lr": 1e-3, "n": 1, "same": 2, "counts.test": 16},
                          {"lr": 3e-4, "n": 1.0, "same": 2, "counts.test": 8})
    assert got == (
        Change(what="input", name="a", old="x", new="z"),
        Change(what="input", name="gone", old="y", new=ABSENT),
        Change(what="input", name="new", old=ABSENT, new="w"),
        Change(what="param", name="counts.test", old=16, new=8),
        Change(what="param", name="lr", old=1e-3, new=3e-4),
        Change(what="param", name="n", old=1, new=1.0))  # another type: another value
    assert got[1].to_json() == {"what": "input", "name": "gone", "old": "y"}


def test_every_step_that_ran_says_what_changed_old_to_new(probe: Recipe, home: Path,
                                                           nscas: Nscas) -> None:
    path = write(home, "p.toml", CHAIN)
    first = json.loads(nscas("--store", home, "run", "--jobs", "1", path, "--json").stdout)
    path.write_text(CHAIN.replace('params = { label = "a" }',
                                  'params = { label = "z", count = 3 }'))
    again = nscas("--store", home, "run", "--jobs", "1", path)
    assert again.exit_code == 0, again.output
    with opened(home) as store:
        a_receipt = store.ref_get("exp/chain/a/receipt")
        b_seen = store.ref_get("exp/chain/b/seen")
    found = rows(again.stdout)
    assert ["changed", "param", "count: 0 -> 3"] in found
    assert ["changed", "param", "label: a -> z"] in found
    assert ["changed", "input", f"first: {first[0]['receipt']} -> {a_receipt}"] in found  # b
    assert ["changed", "input", f"source: {first[1]['outputs']['seen']} -> {b_seen}"] in found
    assert [r[:2] for r in found].count(["since", "receipt"]) == 3  # every step that ran
    js = json.loads(nscas("--store", home, "run", "--jobs", "1", path, "--json").stdout)  # cached now: no miss
    assert all("miss" not in s for s in js)


def test_a_miss_in_json_gives_old_and_new(probe: Recipe, home: Path, nscas: Nscas) -> None:
    path = write(home, "p.toml", CHAIN)
    nscas("--store", home, "run", "--jobs", "1", path)
    out = json.loads(nscas("--store", home, "run", "--jobs", "1", path, "--set", "a.count=2", "--json").stdout)
    assert out[0]["variant"] == "a.count-2"
    assert out[0]["miss"]["params"] == ["count"]
    assert out[0]["miss"]["changes"] == [{"what": "param", "name": "count", "old": 0, "new": 2}]
    assert [c["name"] for c in out[1]["miss"]["changes"]] == ["first"]


def test_every_run_ends_with_one_summary_line(probe: Recipe, home: Path, nscas: Nscas) -> None:
    path = write(home, "p.toml", CHAIN)
    assert nscas("--store", home, "run", "--jobs", "1", path).stdout.splitlines()[-1] == (
        "3 steps: 0 cached, 3 ran, 0 failed")
    cached = nscas("--store", home, "run", "--jobs", "1", path, "--only", "b")
    assert cached.stdout.splitlines()[-1] == "1 step: 1 cached, 0 ran, 0 failed"
    rerun = nscas("--store", home, "run", "--jobs", "1", path, "--rerun")  # b reads a's receipt: it differs
    assert rerun.stdout.splitlines()[-1] == (
        "3 steps: 0 cached, 3 ran, 0 failed; rerun verdict: different (2 of 3 outputs: "
        "b.seen, c.seen)")
    pure = write(home, "q.toml", CHAIN.replace(', first = "step.a.receipt"', "").replace(
        "exp/chain", "exp/pure"))
    nscas("--store", home, "run", "--jobs", "1", pure)
    assert nscas("--store", home, "run", "--jobs", "1", pure, "--rerun").stdout.splitlines()[-1] == (
        "3 steps: 0 cached, 3 ran, 0 failed; rerun verdict: reproduced (3 identical)")
    path.write_text(CHAIN.replace('first = "step.a.receipt" }',
                                  'first = "step.a.receipt" }\nparams = { fail = "error" }'))
    failed = nscas("--store", home, "run", "--jobs", "1", path, "--rerun")
    assert failed.exit_code == 1
    assert failed.stdout.splitlines()[-1] == (
        "3 steps: 0 cached, 1 ran, 1 failed, 1 not run; rerun verdict: not reproduced "
        "(a step failed)")
    assert len(failed.stderr.splitlines()) == 1
    path.write_text(CHAIN.replace('first = "step.a.receipt" }',
                                  'first = "step.a.receipt" }\nparams = { fail = "crash" }'))
    crashed = nscas("--store", home, "run", "--jobs", "1", path)
    assert crashed.exit_code == 1 and "probe crashed on purpose" in crashed.stderr
    assert crashed.stdout.splitlines()[-1] == "3 steps: 1 cached, 0 ran, 1 failed, 1 not run"


def test_log_and_compare_show_the_variant(probe: Recipe, home: Path, nscas: Nscas) -> None:
    path = write(home, "p.toml", CHAIN)
    nscas("--store", home, "run", "--jobs", "1", path)
    nscas("--store", home, "run", "--jobs", "1", path, "--set", "a.label=x")
    log = nscas("--store", home, "log", "--kind", "receipt/1")
    header, *lines = log.stdout.splitlines()
    assert header.split()[4:6] == ["step", "variant"]
    assert sorted(line.split()[5] for line in lines) == ["-"] * 3 + ["a.label-x"] * 3
    assert {e["variant"] for e in json.loads(nscas("--store", home, "log", "--json").stdout)
            if e["kind"] == "receipt/1"} == {None, "a.label-x"}
    compared = nscas("--store", home, "compare", "--pipeline", "exp/chain")
    assert compared.exit_code == 0, compared.output
    table = compared.stdout.splitlines()
    assert table[1].split()[:3] == ["receipt", "step", "variant"]
    assert [line.split()[1:3] for line in table[2:8]] == [
        [s, v] for s in "abc" for v in ("-", "a.label-x")]
    changed = table[table.index("What changed, against the first run of each step") + 2:]
    assert [line.split()[:2] + line.split()[4:6] for line in changed] == [
        ["a", "(a.label-x)", "param", "label:"], ["b", "(a.label-x)", "input", "first:"],
        ["c", "(a.label-x)", "input", "source:"]]
    assert changed[0].endswith("label: a -> x")
    pair = nscas("--store", home, "compare", "exp/chain/a/receipt",
                 "exp/chain/variants/a.label-x/a/receipt").stdout.splitlines()
    assert pair[-1].split()[4:] == ["param", "label:", "a", "->", "x"]
    js = json.loads(nscas("--store", home, "compare", "--pipeline", "exp/chain", "--json").stdout)
    assert [r["variant"] for r in js["runs"]] == [None, "a.label-x"] * 3
    assert js["changes"][0]["changes"] == [{"what": "param", "name": "label", "old": "a",
                                            "new": "x"}]


@pytest.mark.parametrize("args", [
    ("run", "--jobs", "1", "p.toml", "--set", "a.label=a-rather-long-label-for-a-param-value"),
    ("run", "--jobs", "1", "p.toml", "--rerun"),
    ("log",),
    ("log", "--kind", "receipt/1"),
    ("compare", "--pipeline", "exp/chain"),
    ("compare", "exp/chain/a/receipt", "exp/chain/variants/a.label-x/c/seen"),
    ("show", "exp/chain/c/receipt"),
    ("ref", "list"),
])
def test_tables_fit_an_80_column_terminal(probe: Recipe, home: Path, nscas: Nscas,
                                          monkeypatch: pytest.MonkeyPatch,
                                          args: tuple[str, ...]) -> None:
    path = write(home, "p.toml", CHAIN)
    nscas("--store", home, "run", "--jobs", "1", path)
    nscas("--store", home, "run", "--jobs", "1", path, "--set", "a.label=x")
    monkeypatch.chdir(home)
    monkeypatch.setattr(render, "is_tty", lambda: True)
    monkeypatch.setenv("COLUMNS", "80")
    out = nscas("--store", home, *args)
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert lines and max(map(len, lines)) <= 80, "\n".join(lines)
    if args[0] != "show":  # show gives an object's own ID and record whole (wrapped)
        assert not FULL_ID.search(out.stdout)  # IDs shortened
    if args[0] in ("run", "compare"):
        wide = nscas("--store", home, *args, "--wide").stdout
        assert FULL_ID.search(wide) and max(map(len, wide.splitlines())) > 80
