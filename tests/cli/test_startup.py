"""Read-only commands start fast: they open a StoreReader and never import SQLAlchemy or alembic,
and a command loads its own module and no other command's (nscas.cli.root loads them lazily).

Each command runs in a fresh interpreter (a real process, as a user runs it) that reports which
modules it loaded; creating a store (its migrations) is the control showing that the probe sees
SQLAlchemy.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nscas.store.opening import open_store
from tests.cli.conftest import REPO
from tests.store.helpers import build_records

# Runs the CLI as the `nscas` script does, then writes the loaded modules it cares about.
_PROBE = """
import json, sys
from nscas.cli.main import app
report, args = sys.argv[1], sys.argv[2:]
try:
    app(prog_name="nscas", args=args)
except SystemExit as exc:
    code = exc.code
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("sqlalchemy", "alembic"))
from nscas.cli.root import COMMANDS
commands = sorted(name for name, lazy in COMMANDS.items() if f"nscas.cli.{lazy.module}" in sys.modules)
with open(report, "w") as f:
    json.dump({"code": code, "heavy": heavy, "commands": commands}, f)
"""

READ_ONLY = [
    ["log"],
    ["log", "--kind", "receipt/1", "--json"],
    ["show", "{receipt}"],
    ["lineage", "{receipt}"],
    ["lineage", "{blob}", "--down", "--format", "dot"],
    ["fsck"],
    ["fsck", "--deep", "--json"],
    ["cat", "{blob}"],
    ["get", "{tree}", "{tmp}/restored"],
    ["ref", "list"],
    ["ref", "log", "runs/latest"],
    ["export", "{receipt}", "{tmp}/bundle"],
    ["gc", "--dry-run"],
]


@pytest.fixture
def named(store: Path, tmp_path: Path) -> dict[str, str]:
    with open_store(store) as s:
        built = build_records(s)
        receipt, _ = built["receipt/1"]
        s.ref_set("runs/latest", receipt)
        tree, value = built["tree/1"]
    return {"receipt": str(receipt), "tree": str(tree), "blob": value["entries"]["a/b.txt"]["id"],
            "tmp": str(tmp_path)}


def _probe(store: Path, tmp_path: Path, args: list[str]) -> dict[str, object]:
    report = tmp_path / "probe.json"
    p = subprocess.run([sys.executable, "-c", _PROBE, str(report), "--store", str(store), *args],
                       cwd=REPO, capture_output=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    return json.loads(report.read_text())


@pytest.mark.parametrize("command", READ_ONLY, ids=" ".join)
def test_read_only_commands_import_no_sqlalchemy(store: Path, tmp_path: Path,
                                                  named: dict[str, str], command: list[str]) -> None:
    result = _probe(store, tmp_path, [arg.format(**named) for arg in command])
    assert result == {"code": 0, "heavy": [], "commands": [command[0]]}


def test_writes_import_no_sqlalchemy_either(store: Path, tmp_path: Path,
                                            named: dict[str, str]) -> None:
    """Writes share the reads' query layer (nscas.database.writes on the plain driver)."""
    result = _probe(store, tmp_path, ["ref", "set", "runs/other", named["receipt"]])
    assert result == {"code": 0, "heavy": [], "commands": ["ref"]}


def test_the_probe_sees_sqlalchemy_in_a_migrating_command(store: Path, tmp_path: Path) -> None:
    """The control: creating a store runs the alembic migrations, on SQLAlchemy."""
    result = _probe(store, tmp_path, ["init", str(tmp_path / "fresh")])
    assert result["code"] == 0
    assert "sqlalchemy" in result["heavy"]  # type: ignore[operator]
