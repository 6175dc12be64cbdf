"""The seam between the runner and recipes: what a recipe declares and what it is handed.

A recipe is a pure function of committed object IDs. It reads only its inputs (through
``RunContext``) and writes only through the store; the runner records everything else.
Recipes are found through the ``nscas.recipes`` entry-point group and imported lazily.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from nscas.objects.digests import Digest
from nscas.store.protocol import ObjectReader, ObjectStore

BUNDLE_RESERVED = frozenset({"blobs", "code", "model-signatures", "models", "outputs", "receipts",
                             "records", "signatures", "tasks"})
"""Top-level folders of an export bundle that the exporter lays out itself (docs/bundle.md)."""
_FOLDER = re.compile(r"[a-z0-9][a-z0-9_-]*")


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


@dataclass(frozen=True, slots=True, kw_only=True)
class RunContext:
    """Everything a recipe is handed. ``workdir`` is a private scratch directory, emptied
    before and removed after the run; ``work_area`` is the action's own directory, kept across
    a crash or failure (so a run of the same action can resume) and removed once it succeeds.
    Both live under the store (docs/format.md §5.8)."""

    store: ObjectStore  # reads only on the inputs' closures; writes only through it
    inputs: Mapping[str, Digest]
    params: Any  # the recipe's frozen params dataclass, validated
    workdir: Path
    progress: Progress
    store_path: Path  # for recipes that start subprocesses which open the store themselves
    rerun: bool = False
    action: Digest | None = None
    work_area: Path | None = None  # None only where a caller runs a recipe outside the runner
    shared_tree: Callable[[Digest], Path] | None = None
    """A tree/1 input materialised once for the store's runs and shared read-only (never write
    into it); None outside the runner (materialise into ``workdir`` then)."""
    unshare_tree: Callable[[Digest], None] | None = None
    """Say this run is done reading a ``shared_tree``: its copy goes once no other run uses it,
    so that it does not sit beside the run's later files (None where ``shared_tree`` is)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BundleRole:
    """Where an export bundle puts the outputs (and journals) of this recipe's runs
    (docs/bundle.md, "Paths"): under ``<folder>/<run>/``, where ``<run>`` is

    - with ``arm_input``: the arm of the checkpoint/1 that input names;
    - with ``arm_output``: the arm of the checkpoint/1 output of that name, else of the other
      checkpoint outputs (the first by name);
    - otherwise, or when there is no such checkpoint: the run's receipt name;

    followed by ``-<role>`` of the tasks/1 that ``role_input`` names, unless that role is
    ``plain_role``. A run that names no arm and is the only run of its folder in the bundle
    has its outputs directly in ``<folder>/``.

    The exporter reads this from the registered recipe whose name and version the action
    records, so it is part of the recipe's version: changing it means a new version.
    """

    folder: str
    arm_input: str | None = None
    arm_output: str | None = None
    role_input: str | None = None
    plain_role: str | None = None

    def __post_init__(self) -> None:
        if not _FOLDER.fullmatch(self.folder) or self.folder in BUNDLE_RESERVED:
            raise ValueError(f"bundle folder {self.folder!r}: want [a-z0-9][a-z0-9_-]* and none "
                             f"of {', '.join(sorted(BUNDLE_RESERVED))}")
        if self.arm_input is not None and self.arm_output is not None:
            raise ValueError("a bundle role takes its arm from an input or an output, not both")
        if self.plain_role is not None and self.role_input is None:
            raise ValueError("plain_role needs role_input")


Reproducible = Callable[[ObjectReader, Digest], Any]
"""``(store, output ID) -> the part of that output a rerun must reproduce`` (equal parts:
the verdict ``reproduced``)."""


def blob_part(part: Callable[[bytes], Any]) -> Reproducible:
    """A ``Reproducible`` for a blob output whose part comes from its bytes alone."""

    def reproducible(store: ObjectReader, oid: Digest) -> Any:
        return part(store.get_bytes(oid))

    return reproducible


@dataclass(frozen=True, slots=True, kw_only=True)
class Recipe:
    """A registered recipe. ``params`` is a frozen dataclass whose fields have defaults and
    whose docstring documents each field; ``extra_inputs`` lets any other input name through
    (e.g. ``commit``'s arm names) with ``extra_kind`` as their kind; ``bundle`` says where an
    export bundle puts its runs' outputs (None: ``outputs/<receipt name>/``); ``measurements``
    names the outputs that hold measurements."""

    name: str
    version: str
    params: type
    inputs: Mapping[str, InputSpec]
    run: Callable[[RunContext], RecipeResult]
    outputs: tuple[str, ...]
    extra_inputs: bool = False
    extra_kind: str | None = None
    bundle: BundleRole | None = None
    measurements: Mapping[str, Reproducible] = field(default_factory=dict)
    """Outputs that hold measurements, such as timings, which no rerun reproduces: output
    name -> the function giving the part of it a rerun must reproduce (serve's request log:
    each attempt's ids and output tokens; the report: everything but its timings and the
    receipt IDs it cites). ``--rerun`` compares those parts (docs/format.md §6.6)."""
    doc: str = ""
