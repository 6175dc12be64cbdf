"""Hostile and odd command lines: each gets one line, exit 2, and nothing written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .conftest import Nscas, assert_user_error, run_process, snapshot


@pytest.mark.parametrize("args,needle", [
    (("log", "--limit", str(10**21)), "--limit"),
    (("ref", "log", "--limit", str(10**20)), "--limit"),
    (("log", "--limit", "0"), "--limit"),
    (("gc", "--min-age", "nan"), "not a finite number"),
    (("gc", "--min-age", "inf"), "not a finite number"),
    (("gc", "--min-age", "-1"), "--min-age"),
    (("log", "--limt", "3"), "No such option"),
    (("frobnicate",), "No such command"),
])
def test_bad_options_are_one_line_with_the_hint(nscas: Nscas, store: Path, args: tuple[str, ...],
                                                needle: str) -> None:
    before = snapshot(store)
    line = assert_user_error(nscas(*args), needle)
    assert "(try 'nscas" in line and " -h')" in line
    assert snapshot(store) == before


def test_usage_errors_are_one_line_in_a_real_process(tmp_path: Path) -> None:
    result = run_process("log", "--limit", "x", cwd=tmp_path)
    assert_user_error(result, "--limit", "(try 'nscas log -h')")


def test_plain_nscas_prints_its_help(tmp_path: Path) -> None:
    result = run_process(cwd=tmp_path)
    assert result.exit_code == 2 and "Commands:" in result.stderr and "Traceback" not in result.stderr


def test_run_refuses_what_is_not_a_run_file(nscas: Nscas, store: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    deep = tmp_path / "deep.toml"
    deep.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    nested = tmp_path / "nested.toml"
    nested.write_text("a = " + "[" * 40 + "]" * 40 + "\n")
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * (2 << 20) + "\n")
    before = snapshot(store)
    for path, needle in ((tmp_path, "a directory"), (fifo, "not a regular file"),
                         (deep, "nested too deeply"), (nested, "nested more than 32"),
                         (big, "larger than")):
        assert_user_error(nscas("run", str(path)), str(path), needle)
    assert snapshot(store) == before


def test_add_names_a_fifo_as_what_it_is(nscas: Nscas, store: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    before = snapshot(store)
    assert_user_error(nscas("add", str(fifo)), "not a regular file or directory", str(fifo))
    assert snapshot(store) == before


def test_a_full_disk_outside_the_store_is_one_line_exit_2(
        nscas: Nscas, store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # export and import write outside the store, where no store error maps the errno
    import errno

    import nscas.cli.export as export_command

    def full(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "bundle"))

    monkeypatch.setattr(export_command, "export_bundle", full)
    blob = tmp_path / "x.txt"
    blob.write_text("x\n")
    assert nscas("add", str(blob), "--ref", "x").exit_code == 0
    assert_user_error(nscas("export", "x", str(tmp_path / "bundle")),
                      f"no space left on device at {tmp_path / 'bundle'}")
