"""The demo's output, made once per session by ``examples/demo.sh`` as ``make demo`` runs it,
and a checkout-like directory for each doc to run its shell blocks in.

``$NSCAS_TEST_DEMO_OUT`` names a directory a ``make demo`` of this same code filled
(``demo-out``) to use instead of running the demo again; it is copied, never changed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli.example_recipe import register
from tests.docs.blocks import REPO

VENV_BIN = Path(sys.executable).parent
"""The virtual environment's bin/ the suite runs from (``.venv/bin`` under ``make test``)."""
WRITTEN_BY_DOCS = {".venv", ".nscas", "demo-out", "build", ".git"}
"""Top-level names not linked into a doc's checkout: made there, or not a reader's business."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoOutput:
    """What ``make demo`` left: its directory and what it printed (None if not run here)."""

    directory: Path
    printed: str | None


@pytest.fixture(scope="session")
def demo_output(tmp_path_factory: pytest.TempPathFactory) -> DemoOutput:
    given = os.environ.get("NSCAS_TEST_DEMO_OUT")
    if given:
        return DemoOutput(directory=Path(given).resolve(), printed=None)
    directory = tmp_path_factory.mktemp("demo") / "demo-out"
    env = {**plain_env(tmp_path_factory.mktemp("demo-home")),
           "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "NSCAS_DEMO_DIR": str(directory)}
    done = subprocess.run(["bash", str(REPO / "examples" / "demo.sh")], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=3600, check=False)
    assert done.returncode == 0, f"the demo failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return DemoOutput(directory=directory, printed=done.stdout)


def plain_env(home: Path) -> dict[str, str]:
    """The environment of a fresh shell: no venv on PATH, no store named, a home of its own."""
    drop = {"NSCAS_STORE", "VIRTUAL_ENV", "NSCAS_SIGNING_KEY", "PYTHONPATH"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and Path(p).resolve() != VENV_BIN.resolve())
    env["HOME"] = str(home)
    env["XDG_CONFIG_HOME"] = str(home / ".config")
    return env


def checkout(root: Path, demo: DemoOutput) -> Path:
    """``root`` made to look like the repository after ``make demo``: its files linked, the
    venv as ``.venv`` and a fresh copy of the demo's output as ``demo-out``."""
    root.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in WRITTEN_BY_DOCS:
            (root / entry.name).symlink_to(entry)
    (root / ".venv").symlink_to(VENV_BIN.parent)
    shutil.copytree(demo.directory, root / "demo-out", symlinks=True)
    # docs/recipes.md's recipe, registered as its `pip install -e` would (nothing installed).
    (root / ".docs-site").mkdir()
    return root


def example_recipe_path(root: Path) -> str:
    """The import path that registers docs/recipes.md's example recipe for a child process."""
    return register(root / ".docs-site")
