"""A store's database changed by hand: fsck reports each difference then a summary (exit 1);
other commands answer in one line naming the damage and pointing at fsck."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from .conftest import Nscas, assert_user_error


def _sql(store: Path, *statements: str) -> None:
    con = sqlite3.connect(store / "nscas.db", isolation_level=None)
    try:
        for s in statements:
            con.execute(s)
    finally:
        con.close()


def _ids(nscas: Nscas, tmp_path: Path) -> tuple[str, str]:
    (tmp_path / "a").write_text("a\n")
    (tmp_path / "b").write_text("b\n")
    a = nscas("add", str(tmp_path / "a"), "--ref", "tags/v1", "--json").json()
    b = nscas("add", str(tmp_path / "b"), "--json").json()
    return a[0]["id"], b[0]["id"]


def test_fsck_reports_a_moved_tag_and_dropped_guards(nscas: Nscas, store: Path,
                                                     tmp_path: Path) -> None:
    a, b = _ids(nscas, tmp_path)
    assert nscas("fsck").exit_code == 0
    _sql(store, f"UPDATE refs SET target = '{b.removeprefix('blake3:')}' WHERE name = 'tags/v1'",
         "DROP TRIGGER objects_no_update")
    r = nscas("fsck")
    assert r.exit_code == 1, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("error: missing-trigger: objects_no_update: ")
    assert lines[1] == (f"error: ref-log-mismatch: tags/v1: ref points at {b}, but its ref log "
                        f"last set it to {a}; tags never move")
    assert lines[2].startswith("FAILED: 2 objects checked; 2 error(s), 0 note(s)")
    findings = nscas("fsck", "--json").json()["findings"]
    assert [(f["problem"], f["object"]) for f in findings] == [
        ("missing-trigger", "objects_no_update"), ("ref-log-mismatch", "tags/v1")]


def test_a_dropped_ref_log_is_found_by_fsck_and_named_by_every_other_command(
        nscas: Nscas, store: Path, tmp_path: Path) -> None:
    a, _ = _ids(nscas, tmp_path)
    _sql(store, "DROP TABLE ref_log")
    r = nscas("fsck")
    assert r.exit_code == 1 and r.stderr == "", r.stderr
    assert r.stdout.splitlines()[0] == "error: missing-table: ref_log: table ref_log is missing"
    assert r.stdout.splitlines()[-1].startswith("FAILED: 2 objects checked; 1 error(s), 1 note(s)")
    damaged = f"the store database at {store} is damaged (no such table: ref_log); run 'nscas fsck'"
    for args in (("ref", "log"), ("ref", "log", "tags/v1"), ("ref", "set", "other", a)):
        assert assert_user_error(nscas(*args)) == f"nscas: error: {damaged}"
    assert_user_error(nscas("gc"), "is damaged (table ref_log is missing)", "run 'nscas fsck'")
    assert nscas("cat", "tags/v1").stdout == "a\n"  # what needs no ref log still works


def test_a_dropped_objects_table_is_reported_not_a_crash(nscas: Nscas, store: Path,
                                                         tmp_path: Path) -> None:
    _ids(nscas, tmp_path)
    _sql(store, "DROP TABLE objects")
    r = nscas("fsck")
    assert r.exit_code == 1 and "Traceback" not in r.stderr, r.stderr
    assert "error: missing-table: objects: table objects is missing" in r.stdout.splitlines()
    for args in (("log",), ("cat", "tags/v1"), ("add", str(tmp_path / "a"))):
        assert_user_error(nscas(*args), "no such table: objects", "run 'nscas fsck'")
