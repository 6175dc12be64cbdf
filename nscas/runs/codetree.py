"""A recipe's code identity: the first-party files its module can run, found statically.

The closure starts at the modules that define the recipe's ``run`` and ``params`` and follows
every import statement (at module level, inside functions, relative ones), the packages whose
``__init__`` an import runs, and a module named in a string (``python -m``, ``import_module``).
A string naming a file in the module's own directory (``"default_wordings.json"``) adds that
data file: naming the data a module reads is how it declares it. First-party means the nscas
distribution and the recipe's own top-level package; nothing is imported to find the files.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

from nscas.errors import RecipeError
from nscas.objects.digests import Digest
from nscas.objects.kinds import is_safe_relpath
from nscas.runs.recipe import Recipe
from nscas.store.protocol import ObjectStore, tree_record

_DISTRIBUTION = "nscas"
_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_DATA_NAME = re.compile(r"[\w-][\w.-]*(/[\w-][\w.-]*)*")


@dataclass(frozen=True, slots=True, kw_only=True)
class CodeChanges:
    """How one code tree differs from an earlier one, by installed path."""

    changed: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.changed or self.added or self.removed)


def code_tree(store: ObjectStore, recipe: Recipe) -> Digest:
    """The tree/1 of the recipe's closure, keyed by installed path (``nscas/recipes/x/y.py``)."""
    files = {name: store.put_bytes(path.read_bytes()) for name, path in recipe_files(recipe).items()}
    return store.put_record(tree_record(store, files))


def code_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> CodeChanges:
    """Compare the ``entries`` of two code trees."""
    return CodeChanges(
        changed=tuple(sorted(k for k in after.keys() & before.keys()
                             if after[k]["id"] != before[k]["id"])),
        added=tuple(sorted(after.keys() - before.keys())),
        removed=tuple(sorted(before.keys() - after.keys())))


def recipe_files(recipe: Recipe) -> dict[str, Path]:
    """Installed path -> file for every file in the recipe's closure, sorted by path."""
    try:
        return module_files(recipe.run.__module__, recipe.params.__module__)
    except RecipeError as exc:
        raise RecipeError(f"recipe {recipe.name!r}: {exc.message}") from None


def module_files(*modules: str) -> dict[str, Path]:
    """The closure of the named modules (first-party: nscas and their top-level packages)."""
    closure = _Closure(first_party={_DISTRIBUTION, *(m.partition(".")[0] for m in modules)})
    for module in sorted(set(modules)):
        if not closure.add(module):
            raise RecipeError(f"cannot find the source of module {module!r}")
    return dict(sorted(closure.files.items()))


class _Closure:
    def __init__(self, *, first_party: set[str]) -> None:
        self.first_party = first_party
        self.files: dict[str, Path] = {}
        self._specs: dict[str, ModuleSpec | None] = {}
        self._done: set[str] = set()

    def add(self, name: str) -> bool:
        """Add a module, its parent packages and what it reaches; False if it is no module."""
        if name in self._done:
            return True
        spec = self._spec(name)
        if spec is None:
            return False
        self._done.add(name)
        parent = name.rpartition(".")[0]
        if parent:
            self.add(parent)
        if spec.origin is None or not Path(spec.origin).is_file():
            return True  # a namespace package: no file of its own
        path = Path(spec.origin)
        is_package = spec.submodule_search_locations is not None
        parts = name.split(".")
        self.files["/".join(parts) + ("/__init__.py" if is_package else path.suffix)] = path
        if path.suffix != ".py":
            return True
        package = name if is_package else parent
        directory = parts if is_package else parts[:-1]
        try:
            modules, strings = _references(path.read_bytes(), package)
        except SyntaxError as exc:
            raise RecipeError(f"cannot parse {path}: {exc.msg} (line {exc.lineno})") from None
        for target in modules:
            self.add(target)
        for text in strings:
            if "." in text and _MODULE_NAME.fullmatch(text) and self.add(text):
                continue
            if _DATA_NAME.fullmatch(text) and is_safe_relpath(text):
                data = path.parent / text
                if data.suffix != ".py" and data.is_file():
                    self.files["/".join([*directory, text])] = data
        return True

    def _spec(self, name: str) -> ModuleSpec | None:
        """Find a first-party module without importing it or its parents."""
        if name in self._specs:
            return self._specs[name]
        spec: ModuleSpec | None = None
        parent = name.rpartition(".")[0]
        if name.partition(".")[0] in self.first_party:
            if not parent:
                spec = importlib.util.find_spec(name)  # a top-level name imports nothing
            else:
                outer = self._spec(parent)
                locations = outer.submodule_search_locations if outer is not None else None
                if locations is not None:  # `from module import name`: name is no module
                    spec = _find(name, list(locations))
        self._specs[name] = spec
        return spec


def _find(name: str, path: list[str]) -> ModuleSpec | None:
    # What importlib does for a submodule once the parent is imported, with the parent's
    # search path given instead (the editable-install finder maps nscas.cli -> cli/ here).
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        spec: ModuleSpec | None = find_spec(name, path) if find_spec is not None else None
        if spec is not None:
            return spec
    return None


def imported_modules(path: Path, package: str) -> tuple[str, ...]:
    """Every module an import statement of the file at ``path`` (a module of ``package``) may
    load (``from a import b``: a and a.b), wherever the statement is."""
    return _references(path.read_bytes(), package)[0]


@functools.lru_cache(maxsize=1024)  # keyed by the source itself, so never stale
def _references(source: bytes, package: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Every module an import statement may load (``from a import b``: a and a.b), and every
    short string constant."""
    modules: list[str] = []
    strings: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant):
            if isinstance(node.value, str) and 0 < len(node.value) <= 200:
                strings.append(node.value)
        elif isinstance(node, ast.Import):
            modules += (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                try:
                    base = importlib.util.resolve_name("." * node.level + base, package)
                except ImportError:
                    continue  # beyond the top-level package: fails when run, too
            modules.append(base)
            modules += (f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return tuple(modules), tuple(strings)


__all__ = ["CodeChanges", "code_changes", "code_tree", "imported_modules", "module_files",
           "recipe_files"]
