"""``log``, ``show`` and ``lineage`` without typer (nscas.cli.fast): the same meaning, the same
output, typer left unloaded.

The fast parser may refuse anything (the typer app then parses it); what it accepts, it must
mean exactly as the typer app does. That is checked against the typer app itself: its commands
call nscas.cli.reads, which is swapped for a recorder here, so each command line is parsed by
both and the calls compared.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from nscas.cli import fast, reads
from nscas.cli.root import app
from nscas.store.opening import open_store
from tests.cli.conftest import REPO, run_process
from tests.store.helpers import build_records

_COMMANDS = sorted(fast.COMMANDS)


def _typer_call(argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch
                ) -> tuple[str, Path | None, dict[str, Any]] | None:
    """What the typer app calls for ``nscas ARGV``: (command, store, options), or None when it
    calls nothing (help, a usage error)."""
    calls: list[tuple[str, Path | None, dict[str, Any]]] = []
    for name in _COMMANDS:
        def record(store: Path | None, *, _name: str = name, **params: Any) -> None:
            calls.append((_name, store, params))
        monkeypatch.setattr(reads, name, record)
    full_env = {fast.STORE_ENV: None, **env}  # CliRunner unsets what maps to None
    result = CliRunner().invoke(app, argv, env=full_env, prog_name="nscas")
    monkeypatch.undo()
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert len(calls) <= 1
    if not calls:
        assert result.exit_code != 0 or "--help" in argv or "-h" in argv, result.output
        return None
    assert result.exit_code == 0, result.output
    return calls[0]


def _fast_call(argv: list[str], env: dict[str, str]) -> tuple[str, Path | None, dict[str, Any]] | None:
    parsed = fast.parse(argv, env)
    if parsed is None:
        return None
    command, store, params = parsed
    return command.__name__, store, params


# Command lines every user types: the fast path must take each, and mean what typer means.
EVERYDAY = [
    ["log"],
    ["log", "--limit", "5"],
    ["log", "-n", "5", "--kind", "receipt/1", "--json"],
    ["log", "-n5", "--limit=7"],
    ["log", "--kind=tree/1"],
    ["--store", "S", "log"],
    ["--store=S", "log", "--json"],
    ["show", "experiments/base"],
    ["show", "--json", "blake3:0123456789abcdef"],
    ["lineage", "runs/latest"],
    ["lineage", "runs/latest", "--down", "--depth", "2"],
    ["lineage", "--down", "--up", "runs/latest", "--format", "dot"],
    ["lineage", "ID", "--hide", "blobs,code", "--max-nodes", "50", "--format=json"],
    ["lineage", "ID", "--json", "--depth=0"],
    ["--store", "a", "--store", "b", "lineage", "ID", "--max-nodes", "1000000"],
]


@pytest.mark.parametrize("argv", EVERYDAY, ids=" ".join)
def test_everyday_command_lines_run_fast_and_mean_what_typer_means(
        argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    got = _fast_call(argv, {})
    assert got is not None, "the fast path refused an everyday command line"
    assert got == _typer_call(argv, {}, monkeypatch)


@pytest.mark.parametrize("env", [{}, {"NSCAS_STORE": "from-env"}])
def test_the_store_comes_from_the_environment_unless_given(
        env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for argv in (["log"], ["--store", "given", "log"]):
        got = _fast_call(argv, env)
        assert got == _typer_call(argv, env, monkeypatch)
        assert got is not None and got[1] == (Path("given") if "--store" in argv
                                              else Path(env["NSCAS_STORE"]) if env else None)


# Left to typer: help, errors, anything unusual. Each must be refused, not run.
LEFT_TO_TYPER = [
    ["--help"], ["--version"], ["log", "--help"], ["lineage", "-h"], ["log", "--limit", "0"],
    ["log", "--limit", str(fast.LIMIT_MAX + 1)], ["log", "--limit", "5.0"], ["log", "--lim", "5"],
    ["log", "--jsn"], ["log", "extra"], ["log", "--json=yes"], ["show"], ["show", "a", "b"],
    ["show", "-x"], ["show", "--", "-x"], ["lineage", "ID", "--depth", "-1"],
    ["lineage", "ID", "--max-nodes", "0"], ["lineage", "ID", "--format", "svg"],
    ["lineage", "ID", "--format", "TREE"], ["lineage", "ID", "--no-json"], ["--store"],
    ["--store", "S"], ["--store=", "log"], ["--stor", "S", "log"], ["log", "--store", "S"],
    ["-n", "5", "log"], ["cat", "ID"], ["fsck"], ["ref", "list"], [],
]


@pytest.mark.parametrize("argv", LEFT_TO_TYPER, ids=lambda a: " ".join(a) or "(nothing)")
def test_help_errors_and_other_commands_are_left_to_typer(argv: list[str]) -> None:
    assert fast.parse(argv, {}) is None


def test_completion_is_left_to_typer() -> None:
    assert fast.parse(["log"], {"_NSCAS_COMPLETE": "complete_bash"}) is None


_INTS = st.sampled_from(["0", "1", "5", "20", "-1", "+2", " 7", "1_0", "5.0", "0x10", "1000000",
                         "1000001", str(fast.LIMIT_MAX), str(fast.LIMIT_MAX + 1), "x", ""])
_TEXTS = st.sampled_from(["receipt/1", "blobs", "blobs,code", "nope", "", "x y", "-x", "-1",
                          "--x=1", "é"])
_VALUES = {"--kind": _TEXTS, "--limit": _INTS, "-n": _INTS, "--depth": _INTS, "--hide": _TEXTS,
           "--max-nodes": _INTS,
           "--format": st.sampled_from(["tree", "json", "dot", "Tree", "svg", ""])}
_FLAGS = {"log": ["--kind", "--limit", "-n", "--json"], "show": ["--json"],
          "lineage": ["--up", "--down", "--depth", "--hide", "--max-nodes", "--format", "--json"]}
_IDS = st.sampled_from(["runs/latest", "blake3:ab", "x", "-x", "-x y", "", "--json"])
_NOISE = st.sampled_from(["log", "show", "lineage", "--", "-", "--store", "--store=T", "-h",
                          "--no-json", "-n=4", "-nx", "--jso", "--lim", "-x", "--x=1"])


def _option(flag: str) -> st.SearchStrategy[list[str]]:
    if flag not in _VALUES:
        return st.just([flag])
    joined = f"{flag}=" if flag.startswith("--") else flag  # --limit=5, -n5
    return st.one_of(_VALUES[flag].map(lambda v: [flag, v]),
                     _VALUES[flag].map(lambda v: [joined + v]))


def _command_line(command: str) -> st.SearchStrategy[list[str]]:
    """``command`` and a mix of its own options (mostly well formed), an ID, and noise."""
    parts = st.one_of(*[_option(f) for f in _FLAGS[command]], *[_option(f) for f in _FLAGS[command]],
                      _NOISE.map(lambda t: [t]))
    ident = st.lists(_IDS.map(lambda i: [i]), min_size=0 if command == "log" else 1, max_size=1)
    return st.tuples(st.lists(parts, max_size=4), ident, st.lists(parts, max_size=2)).map(
        lambda t: [command, *(a for part in (*t[0], *t[1], *t[2]) for a in part)])


_ROOT = st.lists(st.sampled_from([["--store", "R"], ["--store=R"], ["--store"], ["--version"]]),
                 max_size=2).map(lambda ps: [a for p in ps for a in p])


@settings(max_examples=600, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(root=_ROOT, line=st.sampled_from(_COMMANDS).flatmap(_command_line),
       env_store=st.sampled_from([None, "E", ""]))
def test_what_the_fast_parser_takes_it_means_as_typer_does(
        root: list[str], line: list[str], env_store: str | None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    argv = [*root, *line]
    env = {} if env_store is None else {"NSCAS_STORE": env_store}
    got = _fast_call(argv, env)
    if got is not None:
        assert got == _typer_call(argv, env, monkeypatch), argv


def test_the_options_are_the_typer_commands_options() -> None:
    """Every option the typer command declares, the fast parser knows by the same flags and
    default, and no other: a new option added to one side only fails here."""
    from nscas.cli.root import load_command

    for name, make_parser in fast.COMMANDS.items():
        command = load_command(name)
        declared, declared_choices = {}, {}
        for param in command.params:
            for flag in [*param.opts, *param.secondary_opts]:
                if flag.startswith("-"):
                    declared[flag] = param.default.value if hasattr(param.default, "value") \
                        else param.default
                    if hasattr(param.type, "choices"):
                        declared_choices[flag] = {str(c) for c in param.type.choices}
        parser = make_parser()
        known, known_choices = {}, {}
        for action in parser._actions:  # argparse keeps no public list of them
            for flag in action.option_strings:
                known[flag] = action.default
                if action.choices is not None:
                    known_choices[flag] = set(action.choices)
        assert known.keys() == declared.keys(), name
        assert known_choices == declared_choices, name
        for flag in ("--limit", "--max-nodes", "--depth", "--hide", "--format", "--kind"):
            if flag in declared:
                assert known[flag] == declared[flag], (name, flag)


def _setup(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    root = tmp_path / "project" / ".nscas"
    from nscas.store.writer import init_store

    with init_store(root.parent) as s:
        built = build_records(s)
        receipt, _ = built["receipt/1"]
        s.ref_set("runs/latest", receipt)
        names = {"receipt": str(receipt), "ckpt": str(built["checkpoint/1"][0]),
                 "prefix": str(receipt)[7:19]}
    return root, names


# Run as a user runs them (a process, the fast path) and through the typer app: the same bytes
# on stdout and stderr and the same exit code, errors included.
SAME_OUTPUT = [
    ["log"], ["log", "--json"], ["log", "--kind", "receipt/1", "-n", "1"],
    ["log", "--kind", "nothing/1"], ["show", "{receipt}"], ["show", "{prefix}", "--json"],
    ["show", "runs/latest"], ["show", "runs/none"], ["show", "blake3:zz"], ["show", "abc"],
    ["lineage", "{receipt}"], ["lineage", "{ckpt}", "--down"],
    ["lineage", "{receipt}", "--format", "dot"], ["lineage", "{receipt}", "--json", "--depth", "1"],
    ["lineage", "{receipt}", "--hide", "blobs,code"], ["lineage", "{receipt}", "--hide", "nope"],
    ["lineage", "{receipt}", "--max-nodes", "2"],
]


@pytest.mark.parametrize("argv", SAME_OUTPUT, ids=" ".join)
def test_the_fast_path_prints_what_the_typer_app_prints(tmp_path: Path, argv: list[str]) -> None:
    root, names = _setup(tmp_path)
    args = ["--store", str(root), *[a.format(**names) for a in argv]]
    assert fast.parse(args, {}) is not None
    ran = run_process(*args, cwd=tmp_path)
    typed = CliRunner().invoke(app, args, prog_name="nscas", env={fast.STORE_ENV: None})
    assert (ran.exit_code, ran.stdout, ran.stderr) == (typed.exit_code, typed.stdout, typed.stderr)


def test_a_missing_store_fails_alike(tmp_path: Path) -> None:
    args = ["--store", str(tmp_path / "none"), "log"]
    ran = run_process(*args, cwd=tmp_path)
    typed = CliRunner().invoke(app, args, prog_name="nscas", env={fast.STORE_ENV: None})
    assert ran.exit_code == typed.exit_code == 2
    assert ran.stderr == typed.stderr and ran.stderr.startswith("nscas: error: ")
    assert ran.stderr.count("\n") == 1


_PROBE = """
import json, sys
from nscas.cli.main import app
try:
    app(args=sys.argv[2:])
except SystemExit as exc:
    code = exc.code
# typer and click are most of a typer command's start-up, SQLAlchemy the writer's, and
# dataclasses (with the inspect it imports) a good part of a read command's: none is needed
loaded = sorted({m.split(".")[0] for m in sys.modules}
                & {"typer", "click", "sqlalchemy", "dataclasses", "inspect"})
with open(sys.argv[1], "w") as f:
    json.dump([code, loaded], f)
"""


@pytest.mark.parametrize("argv", [["log"], ["show", "runs/latest"], ["lineage", "runs/latest"],
                                  ["lineage", "runs/latest", "--down", "--format", "dot"]],
                         ids=" ".join)
def test_the_fast_commands_import_no_typer_sqlalchemy_or_dataclasses(tmp_path: Path, argv: list[str]) -> None:
    root, _ = _setup(tmp_path)
    report = tmp_path / "report.json"
    p = subprocess.run([sys.executable, "-c", _PROBE, str(report), "--store", str(root), *argv],
                       cwd=REPO, capture_output=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    assert json.loads(report.read_text()) == [0, []]


def test_help_still_comes_from_typer(tmp_path: Path) -> None:
    ran = run_process("log", "--help", cwd=tmp_path)
    assert ran.exit_code == 0 and "--limit" in ran.stdout and "Example: nscas log" in ran.stdout


def test_the_whole_output_arrives_before_the_process_ends(tmp_path: Path) -> None:
    """The fast path ends the process without finalizing the interpreter (nscas.cli.main):
    what it printed is flushed first, to a pipe, errors included."""
    root, _ = _setup(tmp_path)
    with open_store(root) as s:
        for i in range(1000):
            s.put_record({"nscas": "tasks/1", "role": "eval", "records": str(s.put_bytes(b"x")),
                          "count": 1, "ids": [f"t{i}"]})
        stored = s.counts()["records"]
    assert stored > 1000
    ran = run_process("--store", str(root), "log", "--limit", "5000", "--json", cwd=tmp_path)
    assert ran.exit_code == 0 and ran.stderr == ""
    assert len(json.loads(ran.stdout)) == stored
    ran = run_process("--store", str(root), "show", "runs/none", cwd=tmp_path)
    assert (ran.exit_code, ran.stdout) == (2, "")
    assert ran.stderr.startswith("nscas: error: ") and ran.stderr.endswith("\n")


def test_a_closed_pipe_ends_the_fast_path_quietly(tmp_path: Path) -> None:
    root, _ = _setup(tmp_path)
    with open_store(root) as s:
        for i in range(1000):
            s.put_record({"nscas": "tasks/1", "role": "eval", "records": str(s.put_bytes(b"x")),
                          "count": 1, "ids": [f"t{i}"]})
    env = {k: v for k, v in os.environ.items() if k != fast.STORE_ENV}
    p = subprocess.Popen([sys.executable, "-m", "nscas.cli.main", "--store", str(root), "log",
                          "--limit", "1000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=env)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.readline()
    p.stdout.close()  # as ``head -1`` does
    err = p.stderr.read()
    assert p.wait(timeout=120) == 1
    assert err == b""
