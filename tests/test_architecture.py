"""ARCHITECTURE.md stays true: every repository path it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP = ("nscas/", "cli/", "recipes/", "verifiers/", "migrations/", "tests/", "benchmarks/",
       "examples/", "docs/", "scripts/")


def named_paths(text: str) -> list[str]:
    """Backticked or linked paths under a top-level folder, or files at the top."""
    found = re.findall(r"`([^`\s]+)`", text) + re.findall(r"\]\(([^)\s]+)\)", text)
    return sorted({p.rstrip(",.") for p in found
                   if ("<" not in p and p.startswith(TOP)) or p in ("pyproject.toml", "alembic.ini", "Makefile")})


def test_every_path_architecture_names_exists() -> None:
    paths = named_paths((ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8"))
    assert len(paths) > 40  # the codemap names its modules, not just its folders
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert missing == []


def test_every_library_subpackage_is_on_the_map() -> None:
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    packages = sorted(p.name for p in (ROOT / "nscas").iterdir()
                      if (p / "__init__.py").exists())
    assert [p for p in packages if f"`nscas/{p}/`" not in text] == []
