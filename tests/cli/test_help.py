"""Every command documents itself with an example; help and version stay light to load."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import nscas as nscas_pkg
from nscas.cli.root import COMMANDS, app, load_command

from .conftest import REPO, Nscas, run_process

# The commands of this package; later commands register themselves in COMMANDS too and are
# covered by the example test, but only these are held to "no torch even for --help".
STORE_COMMANDS = ("init", "add", "cat", "get", "show", "log", "ref", "lineage", "fsck", "gc")


def _command_paths() -> list[tuple[str, ...]]:
    """Every registered command and, for groups, every subcommand, as argv prefixes."""
    paths: list[tuple[str, ...]] = []

    def walk(prefix: tuple[str, ...], command: Any) -> None:
        paths.append(prefix)
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            walk((*prefix, name), sub)

    for name in COMMANDS:
        walk((name,), load_command(name))
    return paths


def test_store_commands_are_registered() -> None:
    assert set(STORE_COMMANDS) <= set(COMMANDS)


def test_the_walk_reaches_subcommands() -> None:
    paths = _command_paths()
    assert {("ref", "set"), ("ref", "list"), ("ref", "log")} <= set(paths)


@pytest.mark.parametrize("path", _command_paths(), ids=" ".join)
def test_every_command_has_help_with_an_example(path: tuple[str, ...]) -> None:
    r = CliRunner().invoke(app, [*path, "--help"], prog_name="nscas")
    assert r.exit_code == 0, r.output
    example = [line.strip() for line in r.stdout.splitlines() if line.strip().startswith("Example:")]
    assert example, f"'nscas {' '.join(path)} --help' has no 'Example:' line:\n{r.stdout}"
    assert example[0].startswith(f"Example: nscas {path[0]}"), example[0]


def test_root_help_lists_every_command_with_its_summary() -> None:
    r = CliRunner().invoke(app, ["--help"], prog_name="nscas")
    assert r.exit_code == 0
    assert "Example: nscas init" in r.stdout
    for name, lazy in COMMANDS.items():
        assert any(line.split()[:1] == [name] and lazy.summary[:30] in line
                   for line in r.stdout.splitlines()), name


def test_version(nscas: Nscas) -> None:
    r = nscas("--version", use_store=False)
    assert (r.exit_code, r.stdout) == (0, f"nscas {nscas_pkg.__version__}\n")


def _modules_after(code: str) -> dict[str, bool]:
    probe = (
        "import sys, json\n"
        f"{code}\n"
        "print(json.dumps({m: m in sys.modules for m in ('torch', 'sqlalchemy', 'rich',"
        " 'nscas.store.writer', 'transformers')}))\n"
    )
    p = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True,
                       timeout=120, check=True)
    return json.loads(p.stdout.splitlines()[-1])


def test_root_help_imports_neither_torch_nor_sqlalchemy() -> None:
    loaded = _modules_after(
        "import runpy\n"
        "sys.argv = ['nscas', '--help']\n"
        "try:\n"
        "    runpy.run_module('nscas.cli.main', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert e.code in (0, None), e.code\n"
    )
    assert loaded == {"torch": False, "sqlalchemy": False, "rich": False,
                      "nscas.store.writer": False, "transformers": False}


def test_store_commands_import_no_torch() -> None:
    loaded = _modules_after(
        "from nscas.cli.root import load_command\n"
        f"for name in {STORE_COMMANDS!r}:\n"
        "    load_command(name)\n"
    )
    assert loaded["torch"] is False
    assert loaded["nscas.store.writer"] is True  # the probe really loaded the commands


def test_loading_every_recipe_imports_neither_torch_nor_transformers() -> None:
    # Planning a run loads the recipe of each step (its params, inputs, resources); each
    # recipe imports its heavy libraries inside run, so that planning does not.
    loaded = _modules_after(
        "import importlib.metadata\n"
        "for ep in importlib.metadata.entry_points(group='nscas.recipes'):\n"
        "    ep.load()\n"
    )
    assert (loaded["torch"], loaded["transformers"]) == (False, False)


def test_usage_errors_exit_2(nscas: Nscas) -> None:
    assert nscas("no-such-command").exit_code == 2
    assert nscas("show").exit_code == 2  # missing ID
    assert nscas("log", "--limit", "0").exit_code == 2
    assert nscas("fsck", "--sample", "1.5").exit_code == 2
    assert nscas("gc", "--min-age", "-1").exit_code == 2
    assert nscas("lineage", "x", "--format", "svg").exit_code == 2


def test_module_runs_as_a_script(tmp_path: Path) -> None:
    r = run_process("--version", cwd=tmp_path)
    assert (r.exit_code, r.stdout, r.stderr) == (0, f"nscas {nscas_pkg.__version__}\n", "")


def test_fsck_help_says_what_each_mode_proves() -> None:
    r = CliRunner().invoke(app, ["fsck", "--help"], prog_name="nscas")
    description = r.stdout.split("\nOptions:")[0]
    modes = [line.split()[0] for line in description.splitlines()
             if line.startswith(("  (no flag)", "  --deep", "  --full"))]
    assert modes == ["(no", "--deep", "--full"]  # one paragraph each, kept as written
    text = " ".join(description.split())
    assert "must hash with BLAKE3 to its ID and have its recorded size" in text
    assert "checks its BLAKE3 (the ID), recorded SHA-256 and size" in text
