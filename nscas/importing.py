"""Importing publication bundles (docs/bundle.md): trust nothing, check everything first.

Every path, byte and record of a bundle is checked before the first object is written;
objects then go in children first, so the closure invariant holds and IDs are unchanged.
"""

from __future__ import annotations

import gzip
import os
import shutil
import stat
import tarfile
import tempfile
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import rfc8785

from nscas import canonical, kinds
from nscas.digests import Digest, is_digest_text
from nscas.errors import IntegrityError, InvalidInput, NscasError, StrictJSONError

if TYPE_CHECKING:
    from nscas.store import Store

from nscas.exporting import (
    _BLOCK,
    _SHA256,
    _SUMS_LINE,
    FORMAT,
    MANIFEST,
    RESERVED,
    SUMS,
    ImportReport,
    InvalidBundle,
    Range,
    _hash_stream,
    sha256sums,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Entry:
    id: Digest
    size: int
    sha256: str
    kind: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class _Manifest:
    target: Digest
    objects: Mapping[str, _Entry]
    derived: Mapping[Digest, tuple[Range, str]]
    omitted: Mapping[Digest, _Entry]
    paths: Mapping[Digest, str]
    """The file of each object in ``objects``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Bundle:
    """A bundle that passed every check."""

    root: Path
    manifest: _Manifest
    records: Mapping[Digest, bytes]
    order: tuple[Digest, ...]
    """Records, children first."""
    children: Mapping[Digest, tuple[Digest, ...]]


def import_bundle(store: Store, source: Path) -> ImportReport:
    """Check a bundle directory or a ``measurements.tar.gz`` completely, then add its objects
    to ``store``, children first. A bad bundle raises ``InvalidBundle`` and writes nothing."""
    if source.is_dir():
        return _import(store, _validate(source, str(source)), source)
    if not source.is_file():
        raise InvalidInput(f"no such bundle directory or tar file: {source}")
    with tempfile.TemporaryDirectory(prefix="nscas-import-") as tmp:
        _extract(source, Path(tmp))
        return _import(store, _validate(Path(tmp), str(source)), source)


def _import(store: Store, b: _Bundle, source: Path) -> ImportReport:
    m = b.manifest
    ids = {e.id for e in m.objects.values()} | m.derived.keys()
    before = {d for d in ids if store.has(d)}

    def put(oid: Digest, what: str, write: Callable[[], Digest]) -> None:
        if oid not in before and not store.has(oid):
            got = write()
            if got != oid:  # the file changed after it was checked
                raise IntegrityError(f"{source}: {what}", str(oid), str(got))

    for path, e in sorted(m.objects.items()):
        if e.kind is None:
            put(e.id, path, lambda p=path: store.put_file(b.root / p))
    for t, (r, _sha) in sorted(m.derived.items()):
        put(t, f"bytes {r.offset}..+{r.size} of {m.paths[r.source]}",
            lambda r=r: store.put_bytes(_read_range(b.root / m.paths[r.source], r)))
    missing = {d for d in m.omitted if not store.has(d)}
    skipped: set[Digest] = set()
    for rid in b.order:  # a record that needs what the store lacks would break the closure
        if rid not in before and any(d in missing or d in skipped for d in b.children[rid]):
            skipped.add(rid)
        else:
            put(rid, m.paths[rid], lambda rid=rid: store.put_record(b.records[rid]))
    return ImportReport(target=m.target, source=source,
                        imported=tuple(sorted(ids - before - skipped)), present=len(before),
                        omitted=tuple(sorted(m.omitted)), skipped=tuple(sorted(skipped)))


def _read_range(path: Path, r: Range) -> bytes:
    with path.open("rb") as f:
        f.seek(r.offset)
        return f.read(r.size)


def _extract(tar_path: Path, dest: Path) -> None:
    """Unpack a bundle tar into ``dest``: regular files with safe relative names only."""
    where = str(tar_path)
    try:
        with gzip.open(tar_path, "rb") as gz:  # one full pass first: truncation, CRC errors
            while gz.read(_BLOCK):
                pass
        with tarfile.open(tar_path, mode="r:gz") as tar:
            for member in tar:
                problem = kinds.relpath_problem(member.name)
                if problem is None and member.issym():
                    problem = f"is a symbolic link to {member.linkname!r}"
                elif problem is None and member.islnk():
                    problem = f"is a hard link to {member.linkname!r}"
                elif problem is None and not (member.isreg() or member.isdir()):
                    problem = "is a device, FIFO or other special file"
                if problem is not None:
                    raise InvalidBundle(where, member.name, problem)
                if member.isreg():
                    _extract_one(tar, member, dest / member.name, where)
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        why = str(exc) or type(exc).__name__
        raise InvalidBundle(where, None, f"not a complete tar.gz ({why})") from None


def _extract_one(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path, where: str) -> None:
    src = tar.extractfile(member)
    if src is None:
        raise InvalidBundle(where, member.name, "cannot be read")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with src, target.open("xb") as out:
            shutil.copyfileobj(src, out, _BLOCK)
    except FileExistsError:
        raise InvalidBundle(where, member.name, "appears twice in the tar") from None
    except (NotADirectoryError, IsADirectoryError):
        raise InvalidBundle(where, member.name, "is both a file and a directory") from None


def _validate(root: Path, where: str) -> _Bundle:
    """Every check of docs/bundle.md "Import", cheapest first; the first failure raises."""
    m = _read_manifest(root, where)
    on_disk = _scan(root, where)
    for path in sorted(m.objects.keys() - on_disk):
        raise InvalidBundle(where, path, "listed in manifest.json but missing")
    for path in sorted(on_disk - m.objects.keys() - RESERVED):
        raise InvalidBundle(where, path, "not listed in manifest.json")
    ranges: dict[Digest, list[Range]] = defaultdict(list)
    for t, (r, _sha) in sorted(m.derived.items()):
        if r.source not in m.paths:
            raise InvalidBundle(where, MANIFEST, f"derived {t} is cut from {r.source}, "
                                                 "which is not a file of the bundle")
        ranges[r.source].append(r)
    sums: dict[str, str] = {}
    hashed: dict[Range, tuple[Digest, str]] = {}
    for path in sorted(on_disk):
        e = m.objects.get(path)
        if e is not None and (root / path).lstat().st_size != e.size:
            raise InvalidBundle(where, path, f"holds {(root / path).lstat().st_size} bytes; "
                                             f"manifest.json says {e.size}")
        with _open_plain(root / path) as f:
            (oid, sha, _size), parts = _hash_stream(f, ranges[e.id] if e is not None else ())
        sums[path] = sha
        hashed.update(parts)
        if e is not None and (oid, sha) != (e.id, e.sha256):
            raise InvalidBundle(where, path, f"bytes are {oid} (sha256 {sha}); "
                                             f"manifest.json says {e.id} (sha256 {e.sha256})")
    for t, (r, sha) in sorted(m.derived.items()):
        if hashed.get(r) != (t, sha):
            raise InvalidBundle(where, m.paths[r.source], f"bytes {r.offset}..+{r.size} do not "
                                                          f"hash to derived {t} (sha256 {sha})")
    if SUMS in on_disk:
        _check_sums(root, where, sums)
    records: dict[Digest, bytes] = {}
    values: dict[Digest, dict[str, Any]] = {}
    for path, e in sorted(m.objects.items()):
        if e.kind is not None:
            records[e.id] = (root / path).read_bytes()
            try:
                values[e.id] = canonical.decode(records[e.id])
                kind = kinds.validate(values[e.id])
            except NscasError as exc:
                raise InvalidBundle(where, path, exc.message) from None
            if kind != e.kind:
                raise InvalidBundle(where, path, f"is a {kind} record; manifest.json says {e.kind}")
    order, children = _check_closure(m, values, where)
    return _Bundle(root=root, manifest=m, records=records, order=order, children=children)


def _check_closure(m: _Manifest, values: Mapping[Digest, dict[str, Any]], where: str,
                   ) -> tuple[tuple[Digest, ...], dict[Digest, tuple[Digest, ...]]]:
    """Records children first, and each record's children. Refuses links to objects the
    bundle neither holds nor omits, and objects the target does not reach."""
    known = set(m.paths) | m.derived.keys() | m.omitted.keys()
    children: dict[Digest, tuple[Digest, ...]] = {}
    for rid, value in values.items():
        children[rid] = tuple(sorted({d for _, d in canonical.iter_links(value)}))
        for d in children[rid]:
            if d not in known:
                raise InvalidBundle(where, m.paths[rid], f"links to {d}, which the bundle "
                                                         "neither holds nor lists as omitted")
    reached: set[Digest] = set()
    order: list[Digest] = []
    stack: list[tuple[Digest, bool]] = [(m.target, False)]
    while stack:  # iterative post-order walk: a record after all of its children
        oid, leaving = stack.pop()
        if leaving:
            order.append(oid)
        elif oid not in reached:
            reached.add(oid)
            if oid in values:
                stack.append((oid, True))
                stack.extend((d, False) for d in reversed(children[oid]) if d not in reached)
    for d in sorted(known - reached):
        raise InvalidBundle(where, MANIFEST, f"{d} is not in the closure of the target {m.target}")
    return tuple(order), children


def _open_plain(path: Path) -> BinaryIO:
    """Open a file without following a symbolic link put there after the scan."""
    return os.fdopen(os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)), "rb")


def _scan(root: Path, where: str) -> set[str]:
    """Relative paths of the regular files under ``root``; refuses links and special files."""
    found: set[str] = set()
    for directory, dirs, names in os.walk(root):
        for name in sorted(dirs) + sorted(names):
            path = Path(directory) / name
            rel = path.relative_to(root).as_posix()
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                raise InvalidBundle(where, rel, "is a symbolic link; "
                                                "bundles hold regular files only")
            if stat.S_ISREG(mode):
                found.add(rel)
            elif not stat.S_ISDIR(mode):
                raise InvalidBundle(where, rel, "is a device, FIFO or socket; "
                                                "bundles hold regular files only")
    return found


def _check_sums(root: Path, where: str, sums: Mapping[str, str]) -> None:
    """SHA256SUMS must be exactly the lines the bundle's files give, byte for byte."""
    data = (root / SUMS).read_bytes()
    if data == sha256sums({p: sha for p, sha in sums.items() if p != SUMS}):
        return
    listed: dict[str, str] = {}
    for number, line in enumerate(data.split(b"\n")[:-1] if data.endswith(b"\n") else [data], 1):
        match = _SUMS_LINE.fullmatch(line.decode("utf-8", "replace"))
        if match is None:
            raise InvalidBundle(where, SUMS, f"line {number} is not '<sha256>  <path>'")
        listed[match.group(2)] = match.group(1)
    for path in sorted(sums.keys() - {SUMS} - listed.keys()):
        raise InvalidBundle(where, path, "is not listed in SHA256SUMS")
    for path, sha in sorted(listed.items()):
        if path not in sums:
            raise InvalidBundle(where, SUMS, f"lists {path!r}, which is not in the bundle")
        if sums[path] != sha:
            raise InvalidBundle(where, path, f"sha256 is {sums[path]}; SHA256SUMS says {sha}")
    raise InvalidBundle(where, SUMS, "lines are not sorted by path or repeat a path")


def _read_manifest(root: Path, where: str) -> _Manifest:
    path = root / MANIFEST
    if path.is_symlink() or not path.is_file():
        raise InvalidBundle(where, MANIFEST, "missing or not a regular file")
    data = path.read_bytes()
    try:
        value = canonical.loads_strict(data)
    except StrictJSONError as exc:
        raise InvalidBundle(where, MANIFEST, f"not valid JSON ({exc.reason})") from None
    if not isinstance(value, dict) or rfc8785.dumps(value) != data:
        raise InvalidBundle(where, MANIFEST, "not a JSON object in RFC 8785 canonical form")
    return _ManifestReader(where).read(value)


class _ManifestReader:
    """The shape of manifest.json (docs/bundle.md); every problem names the member."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, at: str, problem: str) -> Any:
        raise InvalidBundle(self.where, MANIFEST, f"{at}: {problem}")

    def exactly(self, value: Any, at: str, names: set[str]) -> dict[str, Any]:
        if not isinstance(value, dict) or value.keys() != names:
            self.fail(at, f"expected an object with exactly the members {', '.join(sorted(names))}")
        return value

    def mapping(self, value: Any, at: str) -> dict[str, Any]:
        return value if isinstance(value, dict) else self.fail(at, "expected an object")

    def digest(self, value: Any, at: str) -> Digest:
        return Digest.parse(value) if is_digest_text(value) else self.fail(at, "expected an ID")

    def count(self, value: Any, at: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            self.fail(at, "expected an integer >= 0")
        return value

    def sha(self, value: Any, at: str) -> str:
        if not isinstance(value, str) or not _SHA256.fullmatch(value):
            self.fail(at, "expected 64 lowercase hex digits")
        return value

    def read(self, value: dict[str, Any]) -> _Manifest:
        top = self.exactly(value, "$", {"format", "target", "objects", "derived", "omitted"})
        if top["format"] != FORMAT:
            self.fail("format", f"expected {FORMAT!r}")
        objects = {path: self.entry(path, e)
                   for path, e in self.mapping(top["objects"], "objects").items()}
        derived: dict[Digest, tuple[Range, str]] = {}
        for key, e in self.mapping(top["derived"], "derived").items():
            at = f"derived[{key!r}]"
            e = self.exactly(e, at, {"from", "offset", "size", "sha256"})
            r = Range(source=self.digest(e["from"], f"{at}.from"),
                      offset=self.count(e["offset"], f"{at}.offset"),
                      size=self.count(e["size"], f"{at}.size"))
            derived[self.digest(key, at)] = (r, self.sha(e["sha256"], f"{at}.sha256"))
        omitted: dict[Digest, _Entry] = {}
        for key, e in self.mapping(top["omitted"], "omitted").items():
            at = f"omitted[{key!r}]"
            e = self.exactly(e, at, {"size", "sha256", "reason"})
            if not isinstance(e["reason"], str) or not e["reason"]:
                self.fail(f"{at}.reason", "expected a non-empty string")
            oid = self.digest(key, at)
            omitted[oid] = _Entry(id=oid, size=self.count(e["size"], f"{at}.size"),
                                  sha256=self.sha(e["sha256"], f"{at}.sha256"), kind=None)
        ids = Counter([e.id for e in objects.values()] + [*derived] + [*omitted])
        for oid in sorted(d for d, n in ids.items() if n > 1):
            self.fail(str(oid), "is in more than one place (a file, derived, omitted)")
        paths = {e.id: p for p, e in objects.items()}
        target = self.digest(top["target"], "target")
        if target not in paths:
            self.fail("target", f"{target} is not a file of the bundle")
        return _Manifest(target=target, objects=objects, derived=derived, omitted=omitted,
                         paths=paths)

    def entry(self, path: str, e: Any) -> _Entry:
        at = f"objects[{path!r}]"
        if (problem := kinds.relpath_problem(path) or ("reserved name" if path in RESERVED else None)):
            raise InvalidBundle(self.where, path, problem)
        e = self.exactly(e, at, {"id", "size", "sha256", "kind"})
        if e["kind"] is not None and not isinstance(e["kind"], str):
            self.fail(f"{at}.kind", "expected a record kind or null")
        size = self.count(e["size"], f"{at}.size")
        if e["kind"] is not None and size > canonical.MAX_RECORD_BYTES:
            self.fail(f"{at}.size", f"records stay under {canonical.MAX_RECORD_BYTES} bytes")
        return _Entry(id=self.digest(e["id"], f"{at}.id"), size=size,
                      sha256=self.sha(e["sha256"], f"{at}.sha256"), kind=e["kind"])
