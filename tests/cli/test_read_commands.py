"""``log``, ``show`` and ``lineage`` run as a user runs them: a process whose entry
(nscas.cli.main) ends it at once when the command returns (nscas.cli.root.end). What they print
arrives whole first, errors included, and a closed pipe ends them quietly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from nscas.cli.root import COMMANDS
from nscas.store.writer import init_store
from tests.cli.conftest import assert_user_error, run_process
from tests.store.helpers import build_records


def _store_of_many(tmp_path: Path) -> tuple[Path, int]:
    """A store with over 1,000 records and ``runs/latest``; its .nscas and its record count."""
    with init_store(tmp_path / "project") as s:
        receipt, _ = build_records(s)["receipt/1"]
        s.ref_set("runs/latest", receipt)
        for i in range(1000):
            s.put_record({"nscas": "tasks/1", "role": "eval", "records": str(s.put_bytes(b"x")),
                          "count": 1, "ids": [f"t{i}"]})
        return s.root, s.counts()["records"]


def test_only_the_read_commands_end_the_process_at_once() -> None:
    assert {name for name, lazy in COMMANDS.items() if lazy.only_reads} == {"log", "show",
                                                                            "lineage", "du"}


def test_the_whole_output_arrives_before_the_process_ends(tmp_path: Path) -> None:
    root, stored = _store_of_many(tmp_path)
    assert stored > 1000
    ran = run_process("--store", str(root), "log", "--limit", "5000", "--json", cwd=tmp_path)
    assert ran.exit_code == 0 and ran.stderr == ""
    assert len(json.loads(ran.stdout)) == stored
    ran = run_process("--store", str(root), "lineage", "runs/latest", "--format", "dot",
                      cwd=tmp_path)
    assert ran.exit_code == 0 and ran.stdout.rstrip().endswith("}")
    assert_user_error(run_process("--store", str(root), "show", "runs/none", cwd=tmp_path),
                      "not found: ref 'runs/none'")


def test_a_closed_pipe_ends_a_read_command_quietly(tmp_path: Path) -> None:
    root, _ = _store_of_many(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "NSCAS_STORE"}
    p = subprocess.Popen([sys.executable, "-m", "nscas.cli.main", "--store", str(root), "log",
                          "--limit", "1000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=env)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.readline()
    p.stdout.close()  # as ``head -1`` does
    err = p.stderr.read()
    assert p.wait(timeout=120) == 1
    assert err == b""


def test_a_pipe_closed_before_a_short_output_is_quiet_too(store: Path) -> None:
    """What fits the buffer meets the closed pipe at the flush before the process ends."""
    env = {k: v for k, v in os.environ.items() if k not in ("NSCAS_STORE", "PYTHONUNBUFFERED")}
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        p = subprocess.run([sys.executable, "-m", "nscas.cli.main", "--store", str(store), "log"],
                           stdout=write_end, stderr=subprocess.PIPE, env=env, timeout=120,
                           check=False)
    finally:
        os.close(write_end)
    assert (p.returncode, p.stderr) == (1, b"")


def test_a_missing_store_is_one_line(tmp_path: Path) -> None:
    for command in (["log"], ["show", "runs/latest"], ["lineage", "runs/latest"]):
        ran = run_process("--store", str(tmp_path / "none"), *command, cwd=tmp_path)
        assert_user_error(ran, str(tmp_path / "none"))


def test_help_and_usage_errors_of_a_read_command(tmp_path: Path) -> None:
    ran = run_process("log", "--help", cwd=tmp_path)
    assert ran.exit_code == 0 and "--limit" in ran.stdout and "Example: nscas log" in ran.stdout
    assert_user_error(run_process("log", "--limit", "0", cwd=tmp_path), "--limit",
                      "(try 'nscas log -h')")
    assert_user_error(run_process("lineage", "x", "--format", "svg", cwd=tmp_path), "'svg'")


def test_a_group_without_arguments_prints_its_help_and_exits_2(tmp_path: Path) -> None:
    for group in ([], ["ref"], ["key"], ["remote"]):
        ran = run_process(*group, cwd=tmp_path)
        assert ran.exit_code == 2 and ran.stdout == "", group
        assert ran.stderr.startswith(f"Usage: nscas {' '.join(group)}".rstrip()), group
        assert "Traceback" not in ran.stderr

