"""Importing publication bundles (docs/bundle.md): trust nothing, check everything first.

Every path, byte and record of a bundle is checked before the first object is written;
objects then go in children first, so the closure invariant holds and IDs are unchanged.
A bundle is hostile until checked: what it may make import read, hold or unpack is bounded by
``ImportLimits``, each bound checked before the bytes it guards are read.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from nscas.bundle.format import (
    MANIFEST,
    RESERVED,
    SUMS,
    SUMS_LINE,
    InvalidBundle,
    Range,
    hash_stream,
    is_model_signature,
    sha256sums,
)
from nscas.bundle.manifest import Manifest, parse_manifest
from nscas.bundle.refs import bundle_refs
from nscas.bundle.unpacking import ImportLimits, shown, unpack
from nscas.errors import IntegrityError, InvalidInput, NscasError, StrictJSONError
from nscas.objects import canonical, kinds
from nscas.objects.digests import Digest
from nscas.store.provenance import SIGNATURE

if TYPE_CHECKING:
    from nscas.store.writer import Store


@dataclass(frozen=True, slots=True, kw_only=True)
class _Bundle:
    """A bundle that passed every check."""

    root: Path
    manifest: Manifest
    records: Mapping[Digest, bytes]
    order: tuple[Digest, ...]
    """Records, children first."""
    children: Mapping[Digest, tuple[Digest, ...]]


RECORD_MAX_DEPTH = 64
"""How deeply a record may nest (as the verifiers read records), checked before parsing."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ImportReport:
    target: Digest
    source: Path
    imported: tuple[Digest, ...]
    """Objects this import added to the store."""
    present: int
    """Objects of the bundle the store held already."""
    omitted: tuple[Digest, ...]
    """Objects the bundle leaves out (weights)."""
    skipped: tuple[Digest, ...]
    """Records not imported because they link, directly or not, to omitted objects."""
    refs: tuple[tuple[str, Digest], ...] = ()
    """Refs set by ``import --ref PREFIX`` (nscas.bundle.refs), in name order."""
    refs_left: int = 0
    """Refs ``--ref`` derived but did not set: their objects were not imported."""

    @property
    def complete(self) -> bool:
        return self.target not in self.skipped


def import_bundle(store: Store, source: Path, *, limits: ImportLimits = ImportLimits(),
                  ref_prefix: str | None = None) -> ImportReport:
    """Check a bundle directory or a ``measurements.tar.gz`` completely, then add its objects
    to ``store``, children first. A bad bundle raises ``InvalidBundle`` and writes nothing.
    With ``ref_prefix``, the refs ``nscas.bundle.refs`` derives from the bundle are then set
    (those whose objects the store holds); one that already names another object is an
    ``InvalidInput`` before anything is written."""
    if source.is_dir():
        return _import(store, _validate(source, str(source), limits), source, ref_prefix)
    if not source.is_file():
        raise InvalidInput(f"no such bundle directory or tar file: {source}")
    with tempfile.TemporaryDirectory(prefix="nscas-import-") as tmp:
        manifest = unpack(source, Path(tmp), limits)
        return _import(store, _validate(Path(tmp), str(source), limits, manifest), source,
                       ref_prefix)


def _wanted_refs(store: Store, b: _Bundle, prefix: str) -> dict[str, Digest]:
    """The refs to restore under ``prefix``, each checked free (unset, or already the same)."""
    records = {oid: canonical.decode(data) for oid, data in b.records.items()}
    wanted = bundle_refs(prefix, b.manifest.target, records, b.manifest.paths)
    for name, oid in wanted.items():
        held = store.ref_get(name)
        if held is not None and held != oid:
            raise InvalidInput(f"--ref {prefix}: ref {name!r} already names {held}, not the "
                               f"bundle's {oid}; import under another prefix")
    return wanted


def _import(store: Store, b: _Bundle, source: Path, ref_prefix: str | None) -> ImportReport:
    wanted = _wanted_refs(store, b, ref_prefix) if ref_prefix is not None else {}
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
            put(e.id, path, partial(store.put_file, b.root / path))
    for t, (r, _sha) in sorted(m.derived.items()):
        put(t, f"bytes {r.offset}..+{r.size} of {m.paths[r.source]}",
            partial(_put_range, store, b.root / m.paths[r.source], r))
    missing = {d for d in m.omitted if not store.has(d)}
    skipped: set[Digest] = set()
    for rid in b.order:  # a record that needs what the store lacks would break the closure
        if rid not in before and any(d in missing or d in skipped for d in b.children[rid]):
            skipped.add(rid)
        else:
            put(rid, m.paths[rid], partial(store.put_record, b.records[rid]))
    refs = []
    for name, oid in wanted.items():  # children first: every record a ref names is in now
        if store.has(oid):
            store.ref_set(name, oid, expect=store.ref_get(name), message=f"import {source}")
            refs.append((name, oid))
    return ImportReport(target=m.target, source=source,
                        imported=tuple(sorted(ids - before - skipped)), present=len(before),
                        omitted=tuple(sorted(m.omitted)), skipped=tuple(sorted(skipped)),
                        refs=tuple(refs), refs_left=len(wanted) - len(refs))


def _put_range(store: Store, path: Path, r: Range) -> Digest:
    return store.put_bytes(_read_range(path, r))


def _read_range(path: Path, r: Range) -> bytes:
    with path.open("rb") as f:
        f.seek(r.offset)
        return f.read(r.size)


def _validate(root: Path, where: str, limits: ImportLimits,
              manifest: Manifest | None = None) -> _Bundle:
    """Every check of docs/bundle.md "Import", cheapest first; the first failure raises.
    ``manifest``: already read (from a tar), else read from ``root``."""
    m = manifest if manifest is not None else _read_manifest(root, where, limits)
    on_disk = _scan(root, where, limits)
    # Model signatures (``--model-signing``) are no objects: not listed, not imported, and
    # outside SHA256SUMS (docs/bundle.md "Model signatures").
    on_disk = {p for p in on_disk if not is_model_signature(p, m.objects)}
    for path in sorted(m.objects.keys() - on_disk):
        raise InvalidBundle(where, path, "listed in manifest.json but missing")
    for path in sorted(on_disk - m.objects.keys() - RESERVED):
        raise InvalidBundle(where, shown(path), "not listed in manifest.json")
    if SUMS in on_disk and (size := (root / SUMS).lstat().st_size) > limits.manifest_bytes:
        raise InvalidBundle(where, SUMS, f"is {size} bytes; at most {limits.manifest_bytes} "
                                         "(--max-manifest-bytes)")
    ranges: dict[Digest, list[Range]] = defaultdict(list)
    for t, (r, _sha) in sorted(m.derived.items()):
        if r.source not in m.paths:
            raise InvalidBundle(where, MANIFEST, f"derived {t} is cut from {r.source}, "
                                                 "which is not a file of the bundle")
        ranges[r.source].append(r)
    sums: dict[str, str] = {}
    hashed: dict[Range, tuple[Digest, str]] = {}
    records: dict[Digest, bytes] = {}
    values: dict[Digest, dict[str, Any]] = {}
    for path in sorted(on_disk):
        e = m.objects.get(path)
        if e is not None and (root / path).lstat().st_size != e.size:
            raise InvalidBundle(where, path, f"holds {(root / path).lstat().st_size} bytes; "
                                             f"manifest.json says {e.size}")
        kept: list[bytes] = []  # the bytes of a file that could be a record, read once
        keep = e is not None and e.size <= canonical.MAX_RECORD_BYTES
        with open_plain(root / path) as f:
            (oid, sha, _size), parts = hash_stream(
                f, ranges[e.id] if e is not None else (), sink=kept.append if keep else None)
        sums[path] = sha
        hashed.update(parts)
        if e is None:
            continue
        if (oid, sha) != (e.id, e.sha256):
            raise InvalidBundle(where, path, f"bytes are {oid} (sha256 {sha}); "
                                             f"manifest.json says {e.id} (sha256 {e.sha256})")
        data = b"".join(kept)
        if e.kind is not None:
            values[e.id] = _record(data, e.kind, where, path)
            records[e.id] = data
        elif keep and (value := _claimed_record(data, where, path)) is not None:
            raise InvalidBundle(where, path, f"bytes are a {shown(value['nscas'])} record; "
                                             "manifest.json says a blob (kind null)")
    for t, (r, sha) in sorted(m.derived.items()):
        if hashed.get(r) != (t, sha):
            raise InvalidBundle(where, m.paths[r.source], f"bytes {r.offset}..+{r.size} do not "
                                                          f"hash to derived {t} (sha256 {sha})")
        if r.size <= canonical.MAX_RECORD_BYTES:
            with open_plain(root / m.paths[r.source]) as f:
                f.seek(r.offset)
                head = f.read(1)
                data = head + f.read(r.size - 1) if head == b"{" else b""
            if _claimed_record(data, where, m.paths[r.source]) is not None:
                raise InvalidBundle(where, m.paths[r.source], f"bytes {r.offset}..+{r.size} "
                                    f"(derived {t}) are a record; derived objects are blobs")
    if SUMS in on_disk:
        _check_sums(root, where, sums, limits)
    order, children = _check_closure(m, values, where)
    return _Bundle(root=root, manifest=m, records=records, order=order, children=children)


def _record(data: bytes, kind: str, where: str, path: str) -> dict[str, Any]:
    """The value of a file the manifest labels a record of ``kind``; its bytes must be one."""
    try:
        # Depth first: nothing recursive (the canonical re-encoding, the schema, the links)
        # may see a value nested deeper than records are.
        canonical.loads_strict(data, max_depth=RECORD_MAX_DEPTH, jcs_numbers=True)
        value = canonical.decode(data)
        got = kinds.validate(value)
    except NscasError as exc:
        raise InvalidBundle(where, path, exc.message) from None
    if got != kind:
        raise InvalidBundle(where, path, f"is a {got} record; manifest.json says {kind}")
    return value


def _claimed_record(data: bytes, where: str, path: str) -> dict[str, Any] | None:
    """The value of bytes that claim to be a record (docs/format.md §1.5: a JSON object with a
    string ``nscas`` member, at most 16 MiB), else None; the bytes decide, never a label.
    Bytes that are not strict JSON claim nothing; an object nested too deeply to tell is
    refused."""
    if len(data) > canonical.MAX_RECORD_BYTES or not data.startswith(b"{") \
            or b'"nscas"' not in data:
        return None
    try:
        value = canonical.loads_strict(data, max_depth=RECORD_MAX_DEPTH, jcs_numbers=True)
    except StrictJSONError:
        text = data.decode("utf-8", "replace")
        if canonical.nesting_depth(text) > RECORD_MAX_DEPTH:
            raise InvalidBundle(where, path, f"nests deeper than {RECORD_MAX_DEPTH} levels "
                                             "(records nest at most that deep)") from None
        return None
    return value if isinstance(value, dict) and isinstance(value.get("nscas"), str) else None


def _check_closure(m: Manifest, values: Mapping[Digest, dict[str, Any]], where: str,
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
    for rid in sorted(values):  # the signatures of reached receipts, after their receipts
        if values[rid].get("nscas") == SIGNATURE and rid not in reached \
                and Digest.parse(values[rid]["receipt"]) in reached:
            reached.add(rid)
            order.append(rid)
    for d in sorted(known - reached):
        raise InvalidBundle(where, MANIFEST, f"{d} is not in the closure of the target {m.target}")
    return tuple(order), children


def open_plain(path: Path) -> BinaryIO:
    """Open a file without following a symbolic link put there after the scan."""
    return os.fdopen(os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)), "rb")


def _scan(root: Path, where: str, limits: ImportLimits) -> set[str]:
    """Relative paths of the regular files under ``root``; refuses links (symbolic, or a file
    with another name elsewhere), special files, and more than ``limits.members`` entries."""
    found: set[str] = set()
    count = 0
    for directory, dirs, names in os.walk(root):
        for name in sorted(dirs) + sorted(names):
            count += 1
            if count > limits.members:
                raise InvalidBundle(where, None, f"holds more than {limits.members} files and "
                                                 "directories (--max-members)")
            path = Path(directory) / name
            rel = path.relative_to(root).as_posix()
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                raise InvalidBundle(where, shown(rel), "is a symbolic link; "
                                                        "bundles hold regular files only")
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                raise InvalidBundle(where, shown(rel), f"is a hard link ({st.st_nlink} names); "
                                    "bundles hold files of their own (copy it, do not link it)")
            if stat.S_ISREG(st.st_mode):
                found.add(rel)
            elif not stat.S_ISDIR(st.st_mode):
                raise InvalidBundle(where, shown(rel), "is a device, FIFO or socket; "
                                                        "bundles hold regular files only")
    return found


def _read_bounded(path: Path, limit: int, where: str, name: str, flag: str) -> bytes:
    """A regular file's bytes, refused unread if its size is over ``limit``, and never more
    than ``limit`` + 1 bytes read (a file that grows meanwhile is refused too)."""
    with open_plain(path) as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise InvalidBundle(where, name, "missing or not a regular file")
        if st.st_size > limit:
            raise InvalidBundle(where, name, f"is {st.st_size} bytes; at most {limit} ({flag})")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise InvalidBundle(where, name, f"is more than {limit} bytes ({flag})")
    return data


def _check_sums(root: Path, where: str, sums: Mapping[str, str], limits: ImportLimits) -> None:
    """SHA256SUMS must be exactly the lines the bundle's files give, byte for byte."""
    data = _read_bounded(root / SUMS, limits.manifest_bytes, where, SUMS, "--max-manifest-bytes")
    if data == sha256sums({p: sha for p, sha in sums.items() if p != SUMS}):
        return
    listed: dict[str, str] = {}
    for number, line in enumerate(data.split(b"\n")[:-1] if data.endswith(b"\n") else [data], 1):
        match = SUMS_LINE.fullmatch(line.decode("utf-8", "replace"))
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


def _read_manifest(root: Path, where: str, limits: ImportLimits) -> Manifest:
    path = root / MANIFEST
    if path.is_symlink() or not path.is_file():
        raise InvalidBundle(where, MANIFEST, "missing or not a regular file")
    return parse_manifest(_read_bounded(path, limits.manifest_bytes, where, MANIFEST,
                                         "--max-manifest-bytes"), where)
