"""The one distribution: package-dir maps the top-level folders under ``nscas``, and a wheel built
from the tree holds every module and data file an installed nscas needs (the editable install
the suite runs on cannot show a file missing from the wheel)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
DATA_SUFFIXES = (".json", ".mako", ".toml", ".html", ".jinja", ".ini")


def tree_files() -> dict[str, Path]:
    """Installed path (``nscas/cli/main.py``) -> source file, for every mapped folder."""
    files: dict[str, Path] = {}
    for package, folder in SETUPTOOLS["package-dir"].items():
        base = ROOT / folder
        for path in base.rglob("*"):
            rel = path.relative_to(base)
            if not path.is_file() or "__pycache__" in rel.parts:
                continue
            if path.suffix != ".py" and not path.name.endswith(DATA_SUFFIXES):
                continue
            # A mapped subfolder (nscas/cli -> cli/) is not also a subfolder of nscas/.
            if package == "nscas" and rel.parts[0] in {"cli", "recipes", "verifiers", "migrations"}:
                continue
            files["/".join((*package.split("."), *rel.parts))] = path
    return files


def test_every_package_folder_is_listed_and_every_listed_package_exists() -> None:
    found = {
        ".".join(installed.split("/")[:-1])
        for installed in tree_files()
        if installed.endswith("/__init__.py")
    }
    assert sorted(found) == sorted(SETUPTOOLS["packages"])


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    # Built from a copy: setuptools builds in the source tree, and a build/ left there from an
    # earlier run would carry modules since deleted into the wheel.
    out = tmp_path_factory.mktemp("wheel")
    source = out / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".*cache*", ".hypothesis",
        ".nscas", ".whl", "demo-store", "demo-out"))
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(source)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = out.glob("nscas-*.whl")
    return zipfile.ZipFile(built)


def test_the_wheel_holds_every_module_and_data_file_of_the_tree(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    expected = tree_files()
    missing = sorted(set(expected) - names)
    assert missing == []
    # The migrations alembic needs at run time, and the recipes' shipped data, by name.
    for needed in ("nscas/migrations/env.py", "nscas/migrations/script.py.mako",
                   "nscas/migrations/versions/0001_initial.py",
                   "nscas/recipes/common/default_wordings.json",
                   "nscas/spec/report-index.html.jinja", "nscas/spec/report-page.css",
                   "nscas/spec/report-page.js"):
        assert needed in names
    for installed, source in expected.items():
        assert wheel.read(installed) == source.read_bytes(), installed


def test_the_wheel_declares_the_command_and_every_recipe(wheel: zipfile.ZipFile) -> None:
    (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    text = wheel.read(entry_points).decode()
    assert f"nscas = {PYPROJECT['project']['scripts']['nscas']}" in text
    recipes = PYPROJECT["project"]["entry-points"]["nscas.recipes"]
    assert sorted(recipes) == ["commit", "conversations", "convert-gguf", "evaluate", "init",
                               "prepare", "probes", "report", "serve", "tokenizer", "train"]
    for name, target in recipes.items():
        assert f"{name} = {target}" in text
