"""verifiers/README.md names, for every verifier module, its spec section and the product code
of the same section: every module is in the table, once, and every file it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "verifiers" / "README.md").read_text(encoding="utf-8")
ROWS = [line.split(" | ") for line in README.splitlines()
        if line.startswith("| `") and line.endswith(" |")]


def test_every_verifier_module_has_one_row() -> None:
    modules = sorted(p.relative_to(ROOT / "verifiers").as_posix()
                     for p in (ROOT / "verifiers").rglob("*.py") if p.name != "__init__.py")
    named = sorted(row[0].removeprefix("| `").removesuffix("`") for row in ROWS)
    assert named == modules


def test_every_product_file_named_exists() -> None:
    for row in ROWS:
        product = row[2].removesuffix(" |")
        folder = ""
        for name in re.findall(r"[\w/.-]+\.py", product):
            if "/" in name:
                folder = name.rsplit("/", 1)[0]
            path = ROOT / (name if "/" in name else f"{folder}/{name}")
            assert path.is_file(), (row[0], name)
