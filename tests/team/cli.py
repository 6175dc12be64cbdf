"""Running ``nscas`` as a real process against a team store (tests/team)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from nscas.store.writer import init_store
from tests.store.services import TeamServices


@dataclass(frozen=True, slots=True, kw_only=True)
class Ran:
    code: int
    out: str
    err: str


def nscas(*args: str, cwd: Path | None = None, store: Path | None = None,
          timeout: float = 300) -> Ran:
    """``nscas ARGS`` in a subprocess (``store``: ``$NSCAS_STORE``)."""
    env = dict(os.environ)
    env.pop("NSCAS_STORE", None)
    if store is not None:
        env["NSCAS_STORE"] = str(store)
    p = subprocess.run([sys.executable, "-m", "nscas.cli", *args], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=timeout)
    return Ran(code=p.returncode, out=p.stdout, err=p.stderr)


def team_store(services: TeamServices, where: Path) -> Path:
    """A fresh team store (its own database and bucket) at ``where/.nscas``: its store.toml."""
    init_store(where, services.config()).close()
    return where / ".nscas" / "store.toml"
