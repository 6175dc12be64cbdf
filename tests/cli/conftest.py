"""Fixtures for CLI tests: a real store on disk, a checkpoint-like directory, two ways to run nscas."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file
from typer.testing import CliRunner

from nscas.cli.root import app
from nscas.store.writer import init_store

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    """What a CLI invocation produced, the same shape for CliRunner and subprocess runs."""

    exit_code: int
    stdout: str
    stderr: str
    stdout_bytes: bytes

    def json(self) -> Any:
        return json.loads(self.stdout)


Nscas = Callable[..., Result]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """An initialised, empty store; returns its ``.nscas`` directory."""
    s = init_store(tmp_path / "project")
    s.close()
    return s.root


@pytest.fixture
def nscas(store: Path) -> Nscas:
    """Run nscas in-process (typer's CliRunner) against ``store``."""
    runner = CliRunner()

    def run(*args: str, input: bytes | None = None, use_store: bool = True) -> Result:
        argv = ["--store", str(store), *args] if use_store else list(args)
        r = runner.invoke(app, argv, input=input, prog_name="nscas")
        if r.exception is not None and not isinstance(r.exception, SystemExit):
            raise r.exception  # a bug, not a user error: show the real traceback
        return Result(exit_code=r.exit_code, stdout=r.stdout, stderr=r.stderr,
                      stdout_bytes=r.stdout_bytes)

    return run


def run_process(*args: str, cwd: Path, env: dict[str, str] | None = None) -> Result:
    """Run ``python -m nscas.cli.main ARGS`` as a real process."""
    full_env = {k: v for k, v in os.environ.items() if k != "NSCAS_STORE"}
    full_env.update(env or {})
    p = subprocess.run([sys.executable, "-m", "nscas.cli.main", *args], cwd=cwd, env=full_env,
                       capture_output=True, timeout=120, check=False)
    return Result(exit_code=p.returncode, stdout=p.stdout.decode(errors="replace"),
                  stderr=p.stderr.decode(errors="replace"), stdout_bytes=p.stdout)


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    """A small HF-like model directory: safetensors weights (one tensor > 4 KiB) and a config."""
    d = tmp_path / "ckpt"
    d.mkdir()
    rng = np.random.default_rng(0)
    save_file({"embed.weight": rng.standard_normal((32, 64)).astype(np.float32),
               "norm.weight": np.ones(8, dtype=np.float32)},
              str(d / "model.safetensors"))
    (d / "config.json").write_text('{"hidden_size": 64, "model_type": "tiny"}\n')
    return d


def snapshot(store_dir: Path) -> tuple[Any, ...]:
    """Everything a command could have written: table rows and the files under data/ and tmp/."""
    con = sqlite3.connect(store_dir / "nscas.db")
    try:
        rows = tuple(
            tuple(sorted(con.execute(f"SELECT * FROM {table}").fetchall(), key=repr))
            for table in ("objects", "links", "parts", "refs", "ref_log", "alembic_version")
        )
    finally:
        con.close()
    files = tuple(sorted(str(p.relative_to(store_dir)) for p in store_dir.rglob("*")
                         if p.is_file() and p.parent != store_dir))
    return rows, files


def assert_user_error(result: Result, *needles: str, code: int = 2) -> str:
    """Exit ``code``, exactly one stderr line ``nscas: error: ...``, no traceback, empty stdout."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("nscas: error: "), lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stdout_bytes == b""
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]
