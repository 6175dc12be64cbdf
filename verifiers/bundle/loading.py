"""What a reader loads from a checkpoint's files, checked the way it is loaded (docs/verify.md).

``checkpoint.<id>.loader``: a model folder given to ``from_pretrained`` runs no code and
fetches nothing: no ``*.py`` file, no ``auto_map`` or ``trust_remote_code`` member in any
JSON file of it, and every JSON file strict (a duplicate key would be read as its last value
by the loader and as something else by a checker). ``checkpoint.<id>.files``: a trained
checkpoint (one with a ``parent``) holds its parent's files, the same names and the same
bytes, except its weights and the one member training changes: ``config.json`` may differ
in ``use_cache`` alone, rechecked member for member. So a rewritten ``tokenizer.json`` (a
decoder that changes every answer text a reader decodes) is a finding.

``model_folder`` finds the folder of a bundle that holds exactly a checkpoint's files, so
that a replay loads the model from there, as a reader would.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..core.errors import RecordParseError
from ..core.results import Check
from ..records.closure import Closure, Objects, Unusable
from ..records.objects import file_digests
from ..records.reading import parse_json
from .layoutcheck import MODEL_FOLDER
from .source import BUNDLE_FORMAT_V1, BundleSource

WEIGHT_SUFFIX = ".safetensors"
WEIGHT_FILES = frozenset({"model.safetensors.index.json"})
CODE_MEMBERS = ("auto_map", "trust_remote_code")
"""Members by which transformers would import code named by the folder (or a hub repo)."""
TRAINING_CHANGES: Mapping[str, frozenset[str]] = {"config.json": frozenset({"use_cache"})}
"""The members of a file training rewrites (``model.config.use_cache = False`` before
``save_pretrained``); everything else of it must be its parent's."""


def loader_checks(objects: Objects, closure: Closure) -> list[Check]:
    """``.loader`` and (for a trained checkpoint) ``.files`` of every checkpoint."""
    checks = []
    for ck in closure.of_kind("checkpoint/1"):
        try:
            record = objects.record_of(ck, "checkpoint/1")
            entries = _entries(objects, record.get("files"))
        except Unusable:
            continue  # the checkpoint's own checks report unusable records
        checks.append(_loader(objects, ck, entries))
        parent = record.get("parent")
        if isinstance(parent, str) and parent in closure.records:
            try:
                base = _entries(objects, objects.record_of(parent, "checkpoint/1").get("files"))
            except Unusable:
                continue
            checks.append(_from_parent(objects, ck, entries, parent, base))
    return checks


def _entries(objects: Objects, tree: Any) -> dict[str, str]:
    entries = objects.record_of(tree, "tree/1")["entries"]
    return {name: entry["id"] for name, entry in entries.items()}


def _json(objects: Objects, oid: str, name: str) -> Any:
    """A JSON file of a model folder, strictly: raises ``RecordParseError``/``Unusable``."""
    key = ("model-json", oid)
    if key not in objects.memo:
        objects.memo[key] = parse_json(objects.bytes(oid), what=name)
    return objects.memo[key]


def _loader(objects: Objects, ck: str, entries: Mapping[str, str]) -> Check:
    problems = []
    for name, oid in sorted(entries.items()):
        if name.endswith(".py"):
            problems.append(f"{name} is code, which a loader with trust_remote_code would run")
        if not name.endswith(".json"):
            continue
        try:
            value = _json(objects, oid, name)
        except RecordParseError as exc:
            problems.append(exc.message)
            continue
        except Unusable as exc:
            if exc.needs is None:
                problems.append(f"{name} is unusable: {exc.why}")
            continue
        if isinstance(value, dict):
            problems += [f"{name} has {member!r}, which makes a loader import code"
                         for member in CODE_MEMBERS if member in value]
    return Check.of_problems(f"checkpoint.{ck[7:15]}.loader", problems, recomputed=len(entries))


def _from_parent(objects: Objects, ck: str, entries: Mapping[str, str], parent: str,
                 base: Mapping[str, str]) -> Check:
    problems = []
    weights = {n for n in (*entries, *base) if n.endswith(WEIGHT_SUFFIX) or n in WEIGHT_FILES}
    for name in sorted(set(entries) | set(base)):
        if name in weights or entries.get(name) == base.get(name):
            continue
        if name not in base:
            problems.append(f"{name} is not a file of the parent {parent[7:19]}")
        elif name not in entries:
            problems.append(f"{name} of the parent {parent[7:19]} is missing")
        elif name in TRAINING_CHANGES:
            problems += _changed_members(objects, name, entries[name], base[name])
        else:
            problems.append(f"{name} differs from the parent's ({entries[name]} for "
                            f"{base[name]}): a reader's {name} is not the one it trained with")
    return Check.of_problems(f"checkpoint.{ck[7:15]}.files", problems, claimed=parent)


def _changed_members(objects: Objects, name: str, mine: str, theirs: str) -> list[str]:
    try:
        new, old = _json(objects, mine, name), _json(objects, theirs, name)
    except (RecordParseError, Unusable) as exc:
        return [f"{name} cannot be compared with the parent's: {exc.message}"]
    if not isinstance(new, dict) or not isinstance(old, dict):
        return [f"{name} is not a JSON object"]
    allowed = TRAINING_CHANGES[name]
    changed = sorted(k for k in {*new, *old} - allowed
                     if k not in new or k not in old or not _same(new[k], old[k]))
    problems = [f"{name} member {k!r} differs from the parent's; training changes only "
                f"{', '.join(sorted(allowed))}" for k in changed]
    problems += [f"{name} member {k!r} is not a boolean" for k in sorted(allowed)
                 if k in new and not isinstance(new[k], bool)]
    return problems


def _same(a: Any, b: Any) -> bool:
    """JSON equality where the type matters (``1`` is not ``true`` nor ``1.0``)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def model_folder(objects: Objects, checkpoint: str) -> Path | None:
    """The bundle folder a reader gives to ``from_pretrained`` for ``checkpoint``
    (``models/<arm>/``, as the layout check placed it), once it holds exactly the
    checkpoint's files: the same names, bytes re-hashed here, nothing else. None when the
    source is no bundle, or a format 1 bundle (whose folders lack shared files). A folder
    that holds anything else is ``Unusable``: the model a reader would load is not the one
    the records name."""
    source = objects.source
    rel: str | None = objects.memo.get((MODEL_FOLDER, checkpoint))  # the layout check's folder
    if not isinstance(source, BundleSource) or source.format == BUNDLE_FORMAT_V1 or rel is None:
        return None
    entries = _entries(objects, objects.record_of(checkpoint, "checkpoint/1")["files"])
    folder = source.root / rel
    if not _holds_exactly(folder, entries):
        raise Unusable(checkpoint, f"the bundle's {rel}/ does not hold exactly the "
                       "checkpoint's files: a reader would load another model from it")
    return folder


def _holds_exactly(folder: Path, entries: Mapping[str, str]) -> bool:
    try:
        if folder.is_symlink() or not folder.is_dir():
            return False
        found = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                       if not p.is_dir() or p.is_symlink())
        if found != sorted(entries):
            return False
        return all(not (folder / n).is_symlink() and (folder / n).stat().st_nlink == 1
                   and file_digests(folder / n).id == oid for n, oid in entries.items())
    except OSError:
        return False

