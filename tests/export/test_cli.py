"""``nscas export`` and ``nscas import`` through the real root app (registered here for the
test, since cli/main.py belongs to another part)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nscas.cli import root as main
from nscas.store.writer import Store
from tests.export.conftest import Published, read_tree


@pytest.fixture
def nscas(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(main.COMMANDS, "export", main.Lazy(module="export", summary="Export."))
    monkeypatch.setitem(main.COMMANDS, "import",
                        main.Lazy(module="import_bundle", summary="Import."))
    runner = CliRunner()

    def run(store: Store, *args: str):
        result = runner.invoke(main.app, ["--store", str(store.root), *args], prog_name="nscas")
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        return result

    return run


def test_export_then_import(nscas, published: Published, fresh_store: Store,
                            tmp_path: Path) -> None:
    prefix = published.target.hex[:10]
    out = nscas(published.store, "export", prefix, str(tmp_path / "b"), "--json")
    assert out.exit_code == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["target"] == str(published.target) and report["weights"] is True
    manifest = json.loads((tmp_path / "b/manifest.json").read_bytes())
    assert report["files"] == len(manifest["objects"])
    text = nscas(published.store, "export", prefix, str(tmp_path / "nw"), "--no-weights")
    assert text.exit_code == 0 and text.stdout.startswith(f"exported {published.target} to ")
    assert "omitted 5 weight object(s)" in text.stdout  # 2 weight files, 3 distinct tensors
    back = nscas(fresh_store, "import", str(tmp_path / "b"), "--json")
    assert back.exit_code == 0, back.stderr
    got = json.loads(back.stdout)
    assert (got["complete"], got["present"], got["omitted"], got["skipped"]) == (True, 0, [], [])
    assert got["imported"] == len(published.store.closure([published.target]))
    again = nscas(fresh_store, "import", str(tmp_path / "nw" / "measurements.tar.gz"))
    assert again.exit_code == 0 and "imported 0 object(s)" in again.stdout


def test_errors_are_one_line_and_exit_2(nscas, published: Published, fresh_store: Store,
                                        tmp_path: Path) -> None:
    dest = tmp_path / "taken"
    dest.mkdir()
    (dest / "x").write_text("keep")
    refused = nscas(published.store, "export", str(published.target), str(dest))
    assert refused.exit_code == 2 and refused.stdout == ""
    assert refused.stderr.splitlines() == [f"nscas: error: destination {dest} (a directory that is "
                                           "not empty) already exists; nscas never overwrites"]
    assert read_tree(dest) == {"x": b"keep"}
    ok = nscas(published.store, "export", str(published.target), str(tmp_path / "b"))
    assert ok.exit_code == 0
    (tmp_path / "b" / "manifest.json").write_text("not json")
    bad = nscas(fresh_store, "import", str(tmp_path / "b"))
    assert bad.exit_code == 2 and bad.stdout == ""
    [line] = bad.stderr.splitlines()
    assert line.startswith(f"nscas: error: {tmp_path / 'b'}: manifest.json: not valid JSON")
    assert fresh_store.counts()["objects"] == 0
    unknown = nscas(published.store, "export", "experiments/none", str(tmp_path / "c"))
    assert unknown.exit_code == 2 and "not found" in unknown.stderr
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("command", ["export", "import"])
def test_help_has_an_example(nscas, fresh_store: Store, command: str) -> None:
    out = nscas(fresh_store, command, "--help")
    assert out.exit_code == 0 and "Example: nscas " + command in out.stdout
