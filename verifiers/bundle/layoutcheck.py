"""A bundle's files, required to be exactly the layout of its closure (docs/bundle.md).

``bundle.layout``: the manifest's ``objects`` are the path -> object map that ``layout.py``
derives from the closure's records, path for path (nothing missing, nothing extra, no object
at a second path, no two objects swapped); ``derived`` holds only tensors linked as weights,
and ``omitted`` is empty or exactly the weight-only objects. ``bundle.filesystem``: nothing
in the directory but regular files of one name each (no symbolic or hard links, devices,
FIFOs or sockets) and folders, and no two names that a case-insensitive or normalising file
system would make one. ``bundle.files`` (``bundle.py``) ties the files on disk to the
manifest, so the three together pin every file a reader opens to the object the records name.
"""

from __future__ import annotations

import os
import stat
import unicodedata
from collections.abc import Iterable, Mapping
from pathlib import Path

from ..core.results import Check
from ..records.closure import Closure, Objects, Unusable
from .layout import ClosureView, Layout, derive, role_choices
from .source import BUNDLE_FORMAT_V1, BundleSource

_SHOWN = 6
MODEL_FOLDER = "model-folder"
"""``objects.memo[(MODEL_FOLDER, checkpoint)]``: the bundle folder of a checkpoint's files."""
MAX_LAYOUTS = 64
"""Role choices tried (2**6: six recipes of the role table in one closure)."""


def layout_checks(bundle: BundleSource, objects: Objects, closure: Closure,
                  signatures: Iterable[str]) -> list[Check]:
    """``bundle.layout`` and ``bundle.filesystem`` of a bundle whose target's closure is
    ``closure`` (and whose receipts' signatures are ``signatures``)."""
    return [_layout_check(bundle, objects, closure, frozenset(signatures)),
            filesystem_check(bundle.root)]


def closure_view(objects: Objects, closure: Closure, signatures: frozenset[str]) -> ClosureView:
    """The verified records and kinds of the closure, as ``layout.derive`` reads them."""
    ids = [*closure.order, *sorted(signatures - set(closure.order))]
    records, kinds, sizes = {}, {}, {}
    for oid in ids:
        kind = closure.records.get(oid)
        if kind is None and oid in signatures:
            kind = objects.kind(oid) if objects.state(oid).problem is None else None
        kinds[oid] = kind
        sizes[oid] = objects.state(oid).size
        if kind is not None:
            try:
                records[oid] = objects.record(oid)
            except Unusable:
                kinds[oid] = None
    cache: dict[str, bytes | None] = {}

    def read(oid: str) -> bytes | None:
        if oid not in cache:
            try:
                cache[oid] = objects.bytes(oid)
            except Unusable:
                cache[oid] = None
        return cache[oid]

    return ClosureView(kinds=kinds, records=records, sizes=sizes, read=read)


def _layout_check(bundle: BundleSource, objects: Objects, closure: Closure,
                  signatures: frozenset[str]) -> Check:
    view = closure_view(objects, closure, signatures)
    derived = set(_keys(bundle.manifest.get("derived")))
    omitted = set(_keys(bundle.manifest.get("omitted")))
    actual = {path: entry["id"] for path, entry in bundle.paths.items()}
    best: tuple[list[str], int, Layout] | None = None
    for number, roles in enumerate(role_choices(view)):
        if number >= MAX_LAYOUTS:
            break
        layout = derive(view, roles)
        problems = _differences(layout, view, actual, derived, omitted,
                                copies=bundle.format != BUNDLE_FORMAT_V1)
        if best is None or len(problems) < len(best[0]):
            best = (problems, len(layout.files(exported=set(view.kinds), copies=True)), layout)
        if not problems:
            break
    assert best is not None  # role_choices always yields the all-declared choice
    problems, count, chosen = best
    for ck, folder in chosen.models.items():  # where a reader loads each model from
        objects.memo[(MODEL_FOLDER, ck)] = f"models/{folder}"
    return Check.of_problems("bundle.layout", problems, shown=_SHOWN, recomputed=count)


def _differences(layout: Layout, view: ClosureView, actual: Mapping[str, str],
                 derived: set[str], omitted: set[str], *, copies: bool) -> list[str]:
    """Every way the manifest's files differ from the layout, each naming its path."""
    problems = []
    every = set(view.kinds)
    for oid in sorted(derived - (layout.tensors & layout.weight_only)):
        problems.append(f"derived[{oid}] is no tensor linked only as weights: a bundle holds "
                        "every other object as a file")
    if omitted and omitted != layout.weight_only - derived:
        for oid in sorted(omitted - layout.weight_only):
            problems.append(f"omitted[{oid}] is no weight: only weights are left out")
        for oid in sorted(layout.weight_only - omitted - derived):
            where = layout.paths.get(oid, ("?",))[0]
            problems.append(f"{where} is a weight the bundle keeps while it omits the others")
    expected = layout.files(exported=every - derived - omitted, copies=copies)
    placed: dict[str, list[str]] = {}
    for path, oid in expected.items():
        placed.setdefault(oid, []).append(path)
    for path in sorted(set(actual) | set(expected), key=lambda p: p.encode("utf-8")):
        want, got = expected.get(path), actual.get(path)
        if want == got:
            continue
        if want is None:
            home = placed.get(got or "", [])
            problems.append(f"{path} holds {got}, which the layout puts "
                            + (f"at {home[0]}" if home else "at no path (not an object file "
                               "of this closure)"))
        elif got is None:
            problems.append(f"{path} is missing: the layout puts {want} there")
        else:
            problems.append(f"{path} holds {got}, but the layout puts {want} there")
    return problems


def filesystem_check(root: Path) -> Check:
    """Only folders and regular files of one name each, and no two names equal under case
    folding or Unicode normalisation (NFC, NFKC)."""
    problems: list[str] = []
    names: list[str] = []
    for directory, dirs, files in os.walk(root):
        for name in sorted((*dirs, *files)):
            path = Path(directory) / name
            rel = path.relative_to(root).as_posix()
            names.append(rel)
            try:
                info = path.lstat()
            except OSError as exc:
                problems.append(f"{rel} cannot be examined ({exc.strerror or exc})")
                continue
            if stat.S_ISLNK(info.st_mode):
                problems.append(f"{rel} is a symbolic link")
            elif stat.S_ISREG(info.st_mode):
                if info.st_nlink > 1:
                    problems.append(f"{rel} is a hard link ({info.st_nlink} names): its bytes "
                                    "can change through a name outside the bundle")
            elif not stat.S_ISDIR(info.st_mode):
                problems.append(f"{rel} is not a regular file or folder")
            try:
                rel.encode("utf-8")
            except UnicodeEncodeError:
                problems.append(f"{rel.encode('utf-8', 'surrogateescape')!r} is not UTF-8")
    problems += _collisions(names)
    return Check.of_problems("bundle.filesystem", problems, shown=_SHOWN, recomputed=len(names))


def _collisions(names: list[str]) -> list[str]:
    """Names that one file system would give one file: equal case-folded, or after NFC or
    NFKC normalisation (and case folding)."""
    groups: dict[str, list[str]] = {}
    for rel in names:
        if rel.isascii():
            key = rel.casefold()
        else:
            key = unicodedata.normalize("NFKC", unicodedata.normalize("NFC", rel).casefold())
            key = key.casefold()
        groups.setdefault(key, []).append(rel)
    return [f"{' and '.join(sorted(same))} are one name under case folding or Unicode "
            "normalisation: a reader's file system may open either" for same in
            groups.values() if len(same) > 1]


def _keys(section: object) -> list[str]:
    return [k for k in section if isinstance(k, str)] if isinstance(section, dict) else []

