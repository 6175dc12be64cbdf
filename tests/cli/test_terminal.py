"""What people read: rounded numbers, IDs whole on a terminal, coloured status words,
``verify --failures-only`` with its summary first, typo suggestions, shell completion."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from nscas.cli import render
from nscas.runs.registry import unknown_recipe
from nscas.suggestions import closest
from tests.cli.conftest import REPO, Nscas, assert_user_error, run_process
from tests.cli.example_recipe import wordcount
from tests.pipelines import tiny_pipeline

__all__ = ["wordcount"]


@pytest.mark.parametrize(("value", "shown"), [
    (0.11681031149964838, "0.1168"), (15.086992987986378, "15.09"), (7834.762042649842, "7835"),
    (-2.669683040739742, "-2.670"), (1e-7, "1.000e-07"), (123456789.5, "1.235e+08"),
    (470220800, "470220800"), (True, "true"), (None, "null"), ("1/1", "1/1"),
    ({"b": 1, "a": 0.5}, '{"a":0.5,"b":1}')])
def test_numbers_are_rounded_for_people(value: object, shown: str) -> None:
    assert render.human(value) == shown


def test_status_words_are_coloured() -> None:
    assert render.status_style("passed") == render.status_style("succeeded") == "green"
    assert render.status_style("failed") == "bold red"
    assert render.status_style("train@1") is None


@pytest.fixture
def counted(nscas: Nscas, tmp_path: Path, wordcount: str) -> str:
    """A store with one wordcount run; its receipt ID."""
    (tmp_path / "t.txt").write_text("a b a\n")
    nscas("add", str(tmp_path / "t.txt"), "--ref", "texts/t")
    (tmp_path / "r.toml").write_text('recipe = "wordcount"\nname = "count"\n'
                                     'inputs = { text = "texts/t" }\n'
                                     'outputs = { counts = "words/t" }\n')
    r = nscas("run", str(tmp_path / "r.toml"), "--json")
    assert r.exit_code == 0, r.stderr
    return str(r.json()["receipt"])


def test_ids_are_never_wrapped_on_a_narrow_terminal(nscas: Nscas, counted: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(render, "is_tty", lambda: True)
    monkeypatch.setenv("COLUMNS", "60")
    short = counted[7:19]
    for args in (["log"], ["compare", counted, "words/t"]):
        out = nscas(*args).stdout
        assert short in out, (args, out)  # whole, on one line
        cells = [c.strip() for line in out.splitlines() for c in line.split("│")]
        # no cell holds a piece of the ID cut off from the rest
        assert not any(len(c) >= 3 and c != short and (short.startswith(c) or short.endswith(c))
                       for c in cells), (args, out)


def test_verify_failures_only_with_the_summary_first(nscas: Nscas, counted: str) -> None:
    full = nscas("verify", "words/t")
    lines = full.stdout.splitlines()
    assert full.exit_code == 1  # no verifier knows the example recipe: not evidence
    assert lines[0].startswith(f"target {counted} (the receipt that produced blake3:")
    assert lines[1].startswith("FAILED: ") and " passed, " in lines[1]
    only = nscas("verify", "words/t", "--failures-only")
    rows = only.stdout.splitlines()
    assert only.exit_code == 1 and rows[:2] == lines[:2]
    table = [r for r in rows[3:] if not r.startswith(("not rechecked", "self-reported"))]
    assert table and all(" failed " in r for r in table), rows
    assert len(table) < len([r for r in lines if " passed " in r]) + len(table)
    js = nscas("verify", "words/t", "--failures-only", "--json").json()
    assert js["checks"] and {c["status"] for c in js["checks"]} == {"failed"}
    assert js["summary"] == lines[1]


def test_typos_get_suggestions(nscas: Nscas, counted: str) -> None:
    assert_user_error(nscas("show", "words/tt"), "not found: ref 'words/tt'",
                      "did you mean 'words/t'?")
    assert_user_error(nscas("lineage", "texts/zzz"), "not found: ref 'texts/zzz'")
    assert "did you mean" not in nscas("show", "texts/zzz").stderr
    assert unknown_recipe("trian").startswith("unknown recipe 'trian'; did you mean 'train'? "
                                              "(known: ")
    assert "did you mean" not in unknown_recipe("zzzzzz")
    assert closest("experiments/coop/zzz", ["experiments/coop/seed"]) is None


def test_a_mistyped_kind_is_refused_with_a_suggestion(nscas: Nscas, store: Path) -> None:
    for typo in ("reciept/1", "receipt", "receipt/2"):
        assert_user_error(nscas("log", "--kind", typo), f"unknown record kind {typo!r}; did you "
                                                        "mean 'receipt/1'?", "(kinds: tree/1, ")
    assert "did you mean" not in nscas("log", "--kind", "zzz").stderr
    assert nscas("log", "--kind", "zzz").exit_code == 2
    # Run as a process (the script's entry), the same check and the same line.
    ran = run_process("--store", str(store), "log", "--kind", "reciept/1", cwd=store.parent)
    assert ran.exit_code == 2 and ran.stdout == ""
    assert ran.stderr.splitlines() == [nscas("log", "--kind", "reciept/1").stderr.strip()]
    assert nscas("log", "--kind", "receipt/1").exit_code == 0  # a known kind, none stored


def test_a_mistyped_step_is_refused_with_a_suggestion(nscas: Nscas, tmp_path: Path) -> None:
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(tiny_pipeline())
    for args, needle in ((("--only", "prepaer"), "--only: no step 'prepaer'"),
                         (("--from", "tokeniser"), "--from: no step 'tokeniser'"),
                         (("--set", "inti.seed=3"), "names step 'inti'")):
        line = assert_user_error(nscas("run", str(pipeline), *args), needle)
        assert "; did you mean '" in line and "(steps: prepare, tokenizer, init, commit)" in line
    assert "did you mean" not in nscas("run", str(pipeline), "--only", "zzzzzz").stderr


def _from_bash(*args: str, cwd: Path, home: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``nscas ARGS`` typed at a bash prompt: typer finds the shell among its parent processes
    (whatever runs the suite, a terminal or a detached CI job, may have none)."""
    env = {k: v for k, v in os.environ.items() if k != "NSCAS_STORE"}
    env.update({"HOME": str(home)} if home is not None else {})
    line = " ".join(shlex.quote(a) for a in (sys.executable, "-m", "nscas.cli.main", *args))
    return subprocess.run(["bash", "-c", f"{line}; exit $?"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_shell_completion_installs(tmp_path: Path) -> None:
    r = run_process("--help", cwd=tmp_path)
    assert "--install-completion" in r.stdout and "--show-completion" in r.stdout
    shown = _from_bash("--show-completion", cwd=tmp_path)
    assert shown.returncode == 0 and "_NSCAS_COMPLETE=complete_bash" in shown.stdout, shown.stderr
    r = run_process(cwd=tmp_path, env={"_NSCAS_COMPLETE": "complete_bash",
                                       "COMP_WORDS": "nscas comp", "COMP_CWORD": "1"})
    assert r.stdout.split() == ["compare"]
    home = tmp_path / "home"
    home.mkdir()
    installed = _from_bash("--install-completion", cwd=tmp_path, home=home)
    assert installed.returncode == 0, installed.stderr
    assert "_NSCAS_COMPLETE" in (home / ".bash_completions" / "nscas.sh").read_text()


def _completions(words: str, cwd: Path, **env: str) -> list[str]:
    r = run_process(cwd=cwd, env={"_NSCAS_COMPLETE": "complete_bash", "COMP_WORDS": words,
                                  "COMP_CWORD": str(len(words.split(" ")) - 1), **env})
    assert r.exit_code == 0, r.stderr
    return r.stdout.split()


def test_shell_completion_offers_refs_kinds_and_steps(nscas: Nscas, store: Path,
                                                      tmp_path: Path) -> None:
    for name in ("experiments/coop/seed", "experiments/coop/clean-pair", "texts/t"):
        (tmp_path / "f").write_text(name)
        assert nscas("add", str(tmp_path / "f"), "--ref", name).exit_code == 0
    assert _completions(f"nscas --store {store} show experiments/coop/", tmp_path) == [
        "experiments/coop/clean-pair", "experiments/coop/seed"]
    for command in ("lineage", "verify", "export", "ref log", "get", "compare texts/t"):
        assert _completions(f"nscas {command} experiments/coop/s", tmp_path,
                            NSCAS_STORE=str(store)) == ["experiments/coop/seed"], command
    assert _completions("nscas show experiments/", tmp_path) == []  # no store here: nothing
    assert _completions("nscas log --kind rec", tmp_path) == ["receipt/1"]
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(tiny_pipeline())
    assert _completions(f"nscas run {pipeline} --only t", tmp_path) == ["tokenizer"]
    assert _completions(f"nscas run {pipeline} --rerun --from ", tmp_path) == [
        "prepare", "tokenizer", "init", "commit"]
    assert _completions(f"nscas run {pipeline} --set i", tmp_path) == ["init."]
    assert _completions(f"nscas run {tmp_path / 'none.toml'} --only ", tmp_path) == []


def test_verify_help_shows_a_ref_the_demo_sets(nscas: Nscas) -> None:
    ref = re.search(r"Example: nscas verify (\S+)", nscas("verify", "--help").stdout)
    assert ref is not None
    demo = tomllib.loads((REPO / "examples" / "cooperative-learning" / "experiment.toml").read_text())
    outputs = {v for step in demo["step"] for v in step.get("outputs", {}).values()}
    assert ref.group(1).rstrip(";") in outputs
