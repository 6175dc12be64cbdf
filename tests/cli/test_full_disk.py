"""A full disk: writes say "no space left on device at <store>" in one line (exit 2) and leave
the store as it was; reads still work. On a real tmpfs of 2 MiB, in a mount namespace."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from . import mounted
from .conftest import Result, assert_user_error

pytestmark = pytest.mark.skipif(not mounted.usable(), reason="needs unshare -m and mount (root)")


def _result(raw: dict[str, Any]) -> Result:
    return Result(exit_code=raw["exit_code"], stdout=raw["stdout"], stderr=raw["stderr"],
                  stdout_bytes=raw["stdout"].encode())


def _untimed(text: str) -> str:
    return re.sub(r" in [0-9.]+ s$", "", text.strip())


def test_a_full_disk_is_named_as_such_and_nothing_is_written(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    root = disk / ".nscas"
    (tmp_path / "big.bin").write_bytes(os.urandom(4 << 20))  # twice the disk
    (tmp_path / "small.txt").write_text("small\n")
    (tmp_path / "kept.txt").write_text("kept\n")

    def nscas(*args: str) -> dict[str, Any]:
        return {"nscas": ["--store", str(root), *args], "cwd": str(tmp_path)}

    state = [nscas("ref", "log", "--json"), nscas("log", "--json"), nscas("fsck")]
    steps = [
        {"mount": ["-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)]},
        nscas("init", str(disk)),
        nscas("add", str(tmp_path / "kept.txt"), "--ref", "kept"),
        *state,
        nscas("add", str(tmp_path / "big.bin")),  # its chunk file does not fit
        *state,
        {"sh": f"dd if=/dev/zero of={disk}/fill bs=64k 2>/dev/null; true"},  # now nothing fits
        nscas("add", str(tmp_path / "small.txt")),  # inline: a database write
        nscas("ref", "set", "other", "kept"),
        nscas("get", "kept", str(disk / "copy.txt")),
        *state,
    ]
    results = [_result(r) for r in mounted.run(steps)]
    init, kept, *rest = results
    assert init.exit_code == 0 and kept.exit_code == 0, (init.stderr, kept.stderr)
    first, rest = rest[:3], rest[3:]
    big, rest = rest[0], rest[1:]
    second, rest = rest[:3], rest[3:]
    small, ref_set, get, *third = rest
    assert_user_error(big, f"no space left on device at {root}")
    assert_user_error(small, f"no space left on device at {root}")
    assert_user_error(ref_set, f"no space left on device at {root}")
    assert_user_error(get, f"no space left on device at {disk}")
    for before, after in ((first, second), (first, third)):  # reads work on a full disk too
        for a, b in zip(before, after, strict=True):
            assert b.exit_code == 0, b.stderr
            assert _untimed(a.stdout) == _untimed(b.stdout)
    assert [e["name"] for e in json.loads(first[0].stdout)] == ["kept"]
    assert first[2].stdout.startswith("ok: 1 objects checked")
