"""The worked example of docs/recipes.md, registered for a test the way an installed package
registers it: a ``*.dist-info`` folder whose ``entry_points.txt`` names the recipe in the
``nscas.recipes`` group, on the import path (nothing is installed)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "examples" / "recipes" / "wordcount"
"""The example's project folder: ``pyproject.toml`` and the ``nscas_wordcount`` package."""
ENTRY_POINT = "wordcount = nscas_wordcount.recipe:RECIPE"


def register(site: Path) -> str:
    """Write the distribution metadata under ``site``; the import path to use (for
    ``sys.path`` or ``PYTHONPATH``): ``site`` and the example's project folder."""
    dist = site / "nscas_wordcount-0.1.0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: nscas-wordcount\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text(f"[nscas.recipes]\n{ENTRY_POINT}\n")
    return f"{site}:{PACKAGE}"


@pytest.fixture
def wordcount(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Register ``wordcount`` for this test (in this process); the import path for a child."""
    path = register(tmp_path / "site")
    for entry in reversed(path.split(":")):
        monkeypatch.syspath_prepend(entry)
    return path
