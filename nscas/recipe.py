"""The seam between the runner and recipes: what a recipe declares and what it is handed.

A recipe is a pure function of committed object IDs. It reads only its inputs (through
``RunContext``) and writes only through the store; the runner records everything else.
Recipes are found through the ``nscas.recipes`` entry-point group and imported lazily.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from nscas.digests import Digest


@dataclass(frozen=True, slots=True, kw_only=True)
class InputSpec:
    """One named input: ``kind`` is the record kind it must be (``None``: any object)."""

    kind: str | None = None
    required: bool = True
    doc: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Claim:
    """A claimed value and the verifier that rechecks it (docs/format.md §3: no claim without one)."""

    value: Any
    verifier: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RecipeResult:
    outputs: Mapping[str, Digest]
    claims: Mapping[str, Claim] = field(default_factory=dict)
    journals: tuple[Digest, ...] = ()


class Progress(Protocol):
    """How a recipe reports progress; the CLI decides how it looks."""

    def start(self, total: int | None, description: str) -> None: ...
    def advance(self, n: int = 1, **fields: Any) -> None: ...
    def finish(self) -> None: ...
    def note(self, message: str) -> None: ...


class NullProgress:
    def start(self, total: int | None, description: str) -> None:
        pass

    def advance(self, n: int = 1, **fields: Any) -> None:
        pass

    def finish(self) -> None:
        pass

    def note(self, message: str) -> None:
        pass


class ObjectReader(Protocol):
    """The read side of the store that recipes may use (only on their inputs' closures)."""

    def get_bytes(self, oid: Digest) -> bytes: ...
    def get_record(self, oid: Digest) -> dict[str, Any]: ...
    def materialise(self, oid: Digest, dest: Path) -> None: ...


class ObjectWriter(Protocol):
    def put_bytes(self, data: bytes) -> Digest: ...
    def put_file(self, path: Path) -> Digest: ...
    def put_tree(self, path: Path) -> Digest: ...
    def put_record(self, value: dict[str, Any]) -> Digest: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class RunContext:
    """Everything a recipe is handed. ``workdir`` is a private scratch directory."""

    store: Any  # ObjectReader & ObjectWriter: the nscas Store
    inputs: Mapping[str, Digest]
    params: Any  # the recipe's frozen params dataclass, validated
    workdir: Path
    progress: Progress
    store_path: Path  # for recipes that start subprocesses which open the store themselves
    rerun: bool = False
    action: Digest | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Recipe:
    """A registered recipe. ``params`` is a frozen dataclass whose fields have defaults and
    whose docstring documents each field; ``extra_inputs`` lets any other input name through
    (e.g. ``commit``'s arm names) with ``extra_kind`` as their kind."""

    name: str
    version: str
    params: type
    inputs: Mapping[str, InputSpec]
    run: Callable[[RunContext], RecipeResult]
    outputs: tuple[str, ...]
    extra_inputs: bool = False
    extra_kind: str | None = None
    doc: str = ""
