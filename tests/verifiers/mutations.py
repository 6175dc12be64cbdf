"""A generator of bundle mutations by class (docs/verify.md, "Mutation tests").

Given an honest bundle, ``layout_cases`` yields, for every file of it, every layout
operation: delete it, duplicate it under another path, rename it by case, put a case twin
beside it, swap it with another file of its kind, make it a hard link or a symbolic link to a
file outside the bundle, add an unknown file beside it, give it CRLF line ends, move its
SHA256SUMS line out of order. Each but the link cases also comes resealed: the manifest,
the tarball and SHA256SUMS rewritten to describe the mutated files, as a careful forger
would, so only the layout and loader checks stand between it and "ok". ``json_cases`` does
the same for every member of every JSON file a reader opens as JSON: changed, duplicated
(two members of one name: the last wins in most parsers), dropped.

Every case names the bundle path that ``verify --strict`` must name in a finding.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rfc8785

from tests.verifiers.rewrite import MANIFEST, SUMS, TARBALL, object_id, sha256, write_tar

RESERVED = (MANIFEST, SUMS, TARBALL)
CHECK_OF = {MANIFEST: "bundle.manifest", SUMS: "bundle.sha256sums",
            TARBALL: "bundle.measurements"}
"""The check that speaks for a reserved file (its findings need not repeat its name)."""
READER_JSON = ("config.json", "generation_config.json", "tokenizer_config.json")
"""The JSON files of a model folder that ``from_pretrained`` reads as configuration."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """One mutation: what it does, to which file, and the path a finding must name."""

    op: str
    path: str
    named: tuple[str, ...]
    """A finding must name one of these (a path, or for a model file also its name)."""
    apply: Callable[[Path, Path], None]
    """Mutates the bundle copy (first argument); the second is a scratch folder outside it."""
    resealed: bool = False
    """Then the manifest, tar and SHA256SUMS are rewritten for the files as they are."""
    moves: tuple[tuple[str, str | None], ...] = ()
    """For resealing: manifest paths moved (to None: gone)."""
    added: tuple[str, ...] = ()
    """For resealing: new manifest paths (blobs)."""
    touches: tuple[str, ...] = ()
    """Every bundle path the mutation reads or writes besides ``path`` (cases of one batch
    touch disjoint files)."""

    @property
    def id(self) -> str:
        return f"{self.op}{'+reseal' if self.resealed else ''}:{self.path}"


def files_of(bundle: Path) -> list[str]:
    return sorted((p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file()),
                  key=str.encode)


def _kind(path: str) -> tuple[str, str]:
    """Files of one kind: the same top folder and the same extension (``.safetensors`` of
    model folders, ``.json`` receipts, ``.jsonl`` logs ...)."""
    head = path.split("/")[0]
    return head, Path(path).suffix


def _case_variant(name: str) -> str | None:
    swapped = name[:1].swapcase() + name[1:]
    return swapped if swapped != name else None


# ------------------------------------------------------------------ resealing

def reseal(root: Path, moves: dict[str, str | None] | None = None,
           added: dict[str, str | None] | None = None) -> None:
    """Rewrite manifest.json (every object file's entry from its bytes now), the tarball
    (its manifest without weights) and SHA256SUMS for the files as they are. ``moves``:
    old path -> new path (None: gone); ``added``: new path -> kind label."""
    manifest = json.loads((root / MANIFEST).read_bytes())
    objects: dict[str, dict[str, Any]] = manifest["objects"]
    for old, new in (moves or {}).items():
        entry = objects.pop(old, None)
        if new is not None and entry is not None:
            objects[new] = entry
    for path, kind in (added or {}).items():
        objects[path] = {"kind": kind}
    for path in list(objects):
        file = root / path
        if not file.is_file():
            continue
        data = file.read_bytes()
        objects[path] = {"id": object_id(data), "size": len(data), "sha256": sha256(data),
                         "kind": objects[path].get("kind")}
    (root / MANIFEST).write_bytes(rfc8785.dumps(manifest))
    weights = {e["id"]: e for p, e in objects.items() if p.endswith(".safetensors")}
    inner = {"format": manifest["format"], "target": manifest["target"],
             "objects": {p: e for p, e in objects.items() if e["id"] not in weights},
             "derived": {t: d for t, d in manifest["derived"].items()
                         if d["from"] not in weights},
             "omitted": {**manifest["omitted"],
                         **{oid: {"size": e["size"], "sha256": e["sha256"], "reason": "weights"}
                            for oid, e in weights.items()},
                         **{t: {"size": d["size"], "sha256": d["sha256"], "reason": "weights"}
                            for t, d in manifest["derived"].items() if d["from"] in weights}}}
    write_tar(root / TARBALL, {p: root / p for p in inner["objects"] if (root / p).is_file()},
              rfc8785.dumps(inner), level=1)  # the level is no part of the format: fast
    listed = [p for p in files_of(root) if p != SUMS and not os.path.islink(root / p)]
    (root / SUMS).write_bytes("".join(
        f"{sha256((root / p).read_bytes())}  {p}\n" for p in listed).encode())


# ------------------------------------------------------------------ layout operations

def layout_cases(bundle: Path) -> Iterator[Case]:
    """Every layout operation on every file of ``bundle``."""
    files = files_of(bundle)
    by_kind: dict[tuple[str, str], list[str]] = {}
    for path in files:
        by_kind.setdefault(_kind(path), []).append(path)
    sums = (bundle / SUMS).read_bytes().decode().splitlines(keepends=True)
    for path in files:
        reserved = path in RESERVED
        named = (path, CHECK_OF[path]) if reserved else (path,)
        head, _, name = path.rpartition("/")
        folder = f"{head}/" if head else ""
        yield Case(op="delete", path=path, named=named, apply=_delete(path))
        twin = f"{folder}copy-of-{name}"
        yield Case(op="duplicate", path=path, named=(twin,), apply=_copy(path, twin),
                   touches=(twin,))
        variant = _case_variant(name)
        if variant is not None:
            yield Case(op="rename-case", path=path, named=(path, folder + variant),
                       apply=_rename(path, folder + variant), touches=(folder + variant,))
            yield Case(op="case-twin", path=path, named=(folder + variant,),
                       apply=_copy(path, folder + variant), touches=(folder + variant,))
        partner = next((p for p in by_kind[_kind(path)] if p != path
                        and (bundle / p).read_bytes() != (bundle / path).read_bytes()), None)
        if partner is not None and not reserved:
            yield Case(op="swap", path=path, named=(path, partner), apply=_swap(path, partner),
                       touches=(partner,))
        yield Case(op="hard-link", path=path, named=(path,), apply=_link(path, hard=True))
        yield Case(op="symlink", path=path, named=(path,), apply=_link(path, hard=False))
        unknown = f"{folder}unknown.bin"
        yield Case(op="unknown-file", path=path, named=(unknown,), apply=_add(unknown),
                   touches=(unknown,))
        if b"\n" in (bundle / path).read_bytes():
            yield Case(op="crlf", path=path, named=named, apply=_crlf(path))
        line = next((n for n, text in enumerate(sums) if text.endswith(f"  {path}\n")), None)
        if line is not None and len(sums) > 1:
            yield Case(op="reorder", path=path, named=(path,), apply=_reorder(path),
                       touches=(SUMS,))
        if reserved:
            continue
        # Resealed: the manifest, tar and SHA256SUMS describe the mutated files.
        # Gone from the manifest too: its object is missing, named by ID (its path is
        # derived from bytes no longer there: an output's extension comes from them).
        gone = object_id((bundle / path).read_bytes())
        yield Case(op="delete", path=path, named=(*named, gone), resealed=True,
                   apply=_delete(path), moves=((path, None),))
        yield Case(op="duplicate", path=path, named=(twin,), resealed=True,
                   apply=_copy(path, twin), added=(twin,), touches=(twin,))
        if variant is not None:
            yield Case(op="rename-case", path=path, named=(path, folder + variant),
                       resealed=True, apply=_rename(path, folder + variant),
                       moves=((path, folder + variant),), touches=(folder + variant,))
        if partner is not None:
            yield Case(op="swap", path=path, named=(path, partner), resealed=True,
                       apply=_swap(path, partner), touches=(partner,))
        yield Case(op="unknown-file", path=path, named=(unknown,), resealed=True,
                   apply=_add(unknown), added=(unknown,), touches=(unknown,))
        if b"\n" in (bundle / path).read_bytes():
            yield Case(op="crlf", path=path, named=named, resealed=True, apply=_crlf(path))


def _delete(path: str) -> Callable[[Path, Path], None]:
    return lambda root, _: (root / path).unlink()


def _copy(path: str, to: str) -> Callable[[Path, Path], None]:
    return lambda root, _: shutil.copyfile(root / path, root / to)


def _rename(path: str, to: str) -> Callable[[Path, Path], None]:
    return lambda root, _: (root / path).rename(root / to)


def _add(path: str) -> Callable[[Path, Path], None]:
    return lambda root, _: (root / path).write_bytes(b"not an object of this bundle\n")


def _swap(a: str, b: str) -> Callable[[Path, Path], None]:
    def apply(root: Path, _: Path) -> None:
        data = (root / a).read_bytes()
        shutil.copyfile(root / b, root / a)
        (root / b).write_bytes(data)
    return apply


def _link(path: str, *, hard: bool) -> Callable[[Path, Path], None]:
    def apply(root: Path, outside: Path) -> None:
        away = outside / path.replace("/", "__")
        shutil.copyfile(root / path, away)
        (root / path).unlink()
        if hard:
            os.link(away, root / path)
        else:
            os.symlink(away, root / path)
    return apply


def _crlf(path: str) -> Callable[[Path, Path], None]:
    def apply(root: Path, _: Path) -> None:
        data = (root / path).read_bytes()
        (root / path).write_bytes(data.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"))
    return apply


def _reorder(path: str) -> Callable[[Path, Path], None]:
    """The path's line moved to the end (the last one to the start): out of bytewise order."""
    def apply(root: Path, _: Path) -> None:
        lines = (root / SUMS).read_bytes().decode().splitlines(keepends=True)
        (line,) = [n for n, text in enumerate(lines) if text.endswith(f"  {path}\n")]
        moved = lines.pop(line)
        lines = [moved, *lines] if line == len(lines) else [*lines, moved]
        (root / SUMS).write_bytes("".join(lines).encode())
    return apply


def run_batch(cases: list[Case], root: Path, outside: Path) -> None:
    """Apply every case of a batch (all resealed or none) to the bundle copy ``root``."""
    for case in cases:
        case.apply(root, outside)
    if cases and cases[0].resealed:
        reseal(root, {old: new for c in cases for old, new in c.moves},
               {path: None for c in cases for path in c.added})


NAMING = frozenset({"duplicate", "rename-case", "case-twin", "unknown-file"})
"""The layout operations that add a name to a folder (the others delete, rewrite or link a
file in place, as the JSON edits do)."""


def batches(cases: list[Case], size: int) -> list[list[Case]]:
    """Cases grouped, up to ``size`` a group, by op and resealing, so that no two cases of a
    group touch one file, nor (for the ``NAMING`` operations) add names to one folder."""
    groups: list[list[Case]] = []
    open_groups: dict[tuple[str, bool], list[list[Case]]] = {}
    for case in cases:
        mine = {case.path.partition("#")[0], *case.touches}
        folders = {p.rpartition("/")[0] for p in mine} if case.op in NAMING else set()
        for group in open_groups.setdefault((case.op, case.resealed), []):
            theirs = {p for c in group for p in (c.path.partition("#")[0], *c.touches)}
            if len(group) < size and not (mine & theirs) and case.op != "reorder" and not (
                    folders & {p.rpartition("/")[0] for p in theirs}):
                group.append(case)
                break
        else:
            group = [case]
            open_groups[(case.op, case.resealed)].append(group)
            groups.append(group)
    return groups


# ------------------------------------------------------------------ JSON members

def json_files(bundle: Path) -> list[str]:
    """The JSON files a reader opens: the manifest, and every model folder's configuration."""
    return [MANIFEST, *(p for p in files_of(bundle)
                        if p.startswith("models/") and p.rpartition("/")[2] in READER_JSON)]


def json_cases(bundle: Path) -> Iterator[Case]:
    """Every top-level member of every reader JSON file changed, duplicated and dropped (and
    for the manifest, every member of its first entry of each section); model files resealed
    (their tree, checkpoint and everything above relinked is not needed: the bytes a reader
    loads are what the layout and the records pin)."""
    for path in json_files(bundle):
        value = json.loads((bundle / path).read_bytes())
        members: list[tuple[str, ...]] = [(k,) for k in value]
        if path == MANIFEST:
            for section in ("objects", "derived", "omitted"):
                first = next(iter(value[section]), None)
                if first is not None:
                    members += [(section, first, k) for k in value[section][first]]
        named = (path, CHECK_OF[path]) if path == MANIFEST else (path,)
        for where in members:
            key = "/".join(where)
            for op in ("change", "duplicate", "drop"):
                yield Case(op=f"json-{op}", path=f"{path}#{key}", named=named,
                           apply=_json_edit(path, where, op), resealed=path != MANIFEST,
                           touches=(path,))


def _changed(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, list):
        return [*value, 0]
    if isinstance(value, dict):
        return {**value, "added": 1}
    return 0


def _json_edit(path: str, where: tuple[str, ...], op: str) -> Callable[[Path, Path], None]:
    def apply(root: Path, _: Path) -> None:
        raw = (root / path).read_bytes()
        value = json.loads(raw)
        parent = value
        for key in where[:-1]:
            parent = parent[key]
        last = where[-1]
        if op == "drop":
            del parent[last]
            data = _dumps_like(raw, value)
        elif op == "change":
            parent[last] = _changed(parent[last])
            data = _dumps_like(raw, value)
        else:  # a second member of the name, after the first: most parsers keep the last
            text = _dumps_like(raw, value).decode()
            marker = json.dumps(last) + ":"
            at = _member_end(text, where)
            extra = f",{marker}{json.dumps(_changed(parent[last]))}"
            data = (text[:at] + extra + text[at:]).encode()
        (root / path).write_bytes(data)
    return apply


def _dumps_like(raw: bytes, value: Any) -> bytes:
    if raw.startswith(b"{\n"):
        return (json.dumps(value, indent=2, ensure_ascii=False) + ("\n" if raw.endswith(b"\n")
                                                                   else "")).encode()
    return rfc8785.dumps(value)


def _member_end(text: str, where: tuple[str, ...]) -> int:
    """Where the object holding the member ``where`` closes (its ``}``), in ``text``."""
    decoder = json.JSONDecoder()
    start = 0
    for key in where[:-1]:
        start = text.index(json.dumps(key) + ":", start) + len(json.dumps(key)) + 1
        while text[start] in " \n":
            start += 1
    _, end = decoder.raw_decode(text, start)
    return end - 1
