"""Importing publication bundles (docs/bundle.md): trust nothing, check everything first.

Every path, byte and record of a bundle is checked before the first object is written;
objects then go in children first, so the closure invariant holds and IDs are unchanged.
A bundle is hostile until checked: what it may make import read, hold or unpack is bounded by
``ImportLimits``, each bound checked before the bytes it guards are read.
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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import rfc8785

from nscas.errors import IntegrityError, InvalidInput, NscasError, StrictJSONError
from nscas.objects import canonical, kinds
from nscas.objects.digests import Digest, is_digest_text

if TYPE_CHECKING:
    from nscas.store.writer import Store

from nscas.bundle.exporting import (
    _SHA256,
    _SUMS_LINE,
    FORMAT_V1,
    FORMATS,
    MANIFEST,
    RESERVED,
    SIGNATURE,
    SUMS,
    TARBALL,
    ImportReport,
    InvalidBundle,
    Range,
    _hash_stream,
    is_model_signature,
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
    """The file of each object in ``objects`` (its first path, bytewise, where a format 2
    bundle repeats it: every copy is checked against the same entry)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Bundle:
    """A bundle that passed every check."""

    root: Path
    manifest: _Manifest
    records: Mapping[Digest, bytes]
    order: tuple[Digest, ...]
    """Records, children first."""
    children: Mapping[Digest, tuple[Digest, ...]]


MANIFEST_MAX_DEPTH = 8
"""How deeply manifest.json may nest (an honest one nests 3 deep), checked before parsing."""
RECORD_MAX_DEPTH = 64
"""How deeply a record may nest (as the verifiers read records), checked before parsing."""
_CHUNK = 1 << 20  # how much of a tar member is read (and written) at once
_MAX_READ = 4 << 20  # the most tarfile may read in one call: a PAX or GNU long-name header
_TRAILER = 1 << 20  # what may follow the end of the tar inside the gzip stream (block padding)


@dataclass(frozen=True, slots=True, kw_only=True)
class ImportLimits:
    """Absolute bounds on what a bundle can make ``nscas import`` read, hold in memory or
    unpack (docs/bundle.md), each checked before the bytes it guards are read."""

    manifest_bytes: int = 16 << 20
    """manifest.json, and SHA256SUMS, each: the file's size is checked before it is read."""
    unpacked_bytes: int = 16 << 30
    """The regular members of a tar together, checked at each member's header."""
    members: int = 100_000
    """Members of a tar (directories included), or files and directories of a bundle directory."""


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
        manifest = _unpack(source, Path(tmp), limits)
        return _import(store, _validate(Path(tmp), str(source), limits, manifest), source,
                       ref_prefix)


def _wanted_refs(store: Store, b: _Bundle, prefix: str) -> dict[str, Digest]:
    """The refs to restore under ``prefix``, each checked free (unset, or already the same)."""
    from nscas.bundle.refs import bundle_refs

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
    refs = []
    for name, oid in wanted.items():  # children first: every record a ref names is in now
        if store.has(oid):
            store.ref_set(name, oid, expect=store.ref_get(name), message=f"import {source}")
            refs.append((name, oid))
    return ImportReport(target=m.target, source=source,
                        imported=tuple(sorted(ids - before - skipped)), present=len(before),
                        omitted=tuple(sorted(m.omitted)), skipped=tuple(sorted(skipped)),
                        refs=tuple(refs), refs_left=len(wanted) - len(refs))


def _read_range(path: Path, r: Range) -> bytes:
    with path.open("rb") as f:
        f.seek(r.offset)
        return f.read(r.size)


class _HeaderTooLarge(Exception):
    """tarfile asked to read more than ``_MAX_READ`` bytes at once (a PAX or GNU header)."""


class _TarStream:
    """The uncompressed bytes of a tar.gz, as ``tarfile`` reads them: no single read larger than
    ``_MAX_READ`` (tarfile reads a PAX or GNU long-name header whole, whatever size it
    claims), and forward seeks (over member data) read the gzip stream in large blocks."""

    def __init__(self, raw: BinaryIO) -> None:
        raw.seek(0)
        self._gz = gzip.GzipFile(fileobj=raw, mode="rb")

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0 or size > _MAX_READ:
            raise _HeaderTooLarge
        return self._gz.read(size)

    def tell(self) -> int:
        return self._gz.tell()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence != os.SEEK_SET or offset < self._gz.tell():
            return self._gz.seek(offset, whence)  # back: re-read from the start, as gzip does
        while (pos := self._gz.tell()) < offset and self._gz.read(min(_CHUNK, offset - pos)):
            pass
        return self._gz.tell()

    def drain(self, where: str, most: int = _TRAILER) -> None:
        """Read the rest of the gzip stream, at most ``most`` bytes (its CRC and length are
        checked at its end); raises tarfile's, gzip's or zlib's error for a broken stream."""
        end = self._gz.tell() + most
        while self._gz.read(_CHUNK):
            if self._gz.tell() > end:
                raise InvalidBundle(where, None, f"more than {most} bytes follow the end "
                                                 "of the tar in the gzip stream")


def _shown(name: str) -> str:
    """A name fit for a one-line message, whatever bytes it came from."""
    return name.encode("utf-8", "backslashreplace").decode("utf-8")


def _path_problem(name: str) -> str | None:
    if (problem := kinds.relpath_problem(name)) is not None:
        return problem
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "path is not UTF-8 text"
    return None


def _members(tar: tarfile.TarFile, where: str, limits: ImportLimits) -> Iterator[tarfile.TarInfo]:
    """The tar's members, each checked from its header alone (before its data is read): at
    most ``limits.members`` of them, safe paths, regular files or directories only."""
    count = 0
    while (member := tar.next()) is not None:
        tar.members.clear()  # tarfile keeps every header it read; nothing here needs them
        count += 1
        if count > limits.members:
            raise InvalidBundle(where, None, f"holds more than {limits.members} members "
                                             "(--max-members)")
        problem = _path_problem(member.name)
        if problem is None and member.issym():
            problem = f"is a symbolic link to {_shown(member.linkname)!r}"
        elif problem is None and member.islnk():
            problem = f"is a hard link to {_shown(member.linkname)!r}"
        elif problem is None and member.issparse():
            problem = "is a sparse file; bundle tars hold plain regular files"
        elif problem is None and not (member.isreg() or member.isdir()):
            problem = "is a device, FIFO or other special file"
        elif problem is None and member.name == TARBALL:
            problem = "a bundle tar does not hold another measurements.tar.gz"
        if problem is not None:
            raise InvalidBundle(where, _shown(member.name), problem)
        yield member


def _unpack(tar_path: Path, dest: Path, limits: ImportLimits) -> _Manifest:
    """Unpack a bundle tar into ``dest``, only after its member list and manifest passed: every
    member a listed file of the size the manifest states (or manifest.json, SHA256SUMS), so
    what is written is at most the manifest's total, and there is room for it."""
    where = str(tar_path)
    try:
        with tar_path.open("rb") as raw:
            sizes, manifest = _list_tar(raw, where, limits)
            _check_listing(sizes, manifest, where)
            total = sum(sizes.values())
            free = shutil.disk_usage(dest).free
            if total > free:
                raise InvalidBundle(where, None, f"unpacks to {total} bytes, but {dest} has "
                                                 f"only {free} bytes free")
            _extract(raw, sizes, dest, where, limits)
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        why = str(exc) or type(exc).__name__
        raise InvalidBundle(where, None, f"not a complete tar.gz ({why})") from None
    except _HeaderTooLarge:
        raise InvalidBundle(where, None, f"a tar header is larger than {_MAX_READ} bytes"
                                         ) from None
    return manifest


def _list_tar(raw: BinaryIO, where: str, limits: ImportLimits) -> tuple[dict[str, int], _Manifest]:
    """First pass, writing nothing: every member's header checked, the running total of sizes
    checked at each header, the manifest parsed (its size checked at its header), and the gzip
    stream read to its end."""
    stream = _TarStream(raw)
    sizes: dict[str, int] = {}
    manifest: _Manifest | None = None
    total = 0
    with tarfile.open(fileobj=stream, mode="r:") as tar:  # type: ignore[call-overload]
        for member in _members(tar, where, limits):
            if member.isdir():
                continue
            name = member.name
            if name in sizes:
                raise InvalidBundle(where, name, "appears twice in the tar")
            total += member.size
            if total > limits.unpacked_bytes:
                raise InvalidBundle(where, name, f"takes the tar past {limits.unpacked_bytes} "
                                                 "unpacked bytes (--max-bytes)")
            if name in (MANIFEST, SUMS) and member.size > limits.manifest_bytes:
                raise InvalidBundle(where, name, f"is {member.size} bytes; at most "
                                                 f"{limits.manifest_bytes} (--max-manifest-bytes)")
            sizes[name] = member.size
            if name == MANIFEST:
                data = _member_bytes(tar, member, where)
                try:
                    manifest = _parse_manifest(data, where)
                except InvalidBundle as refused:
                    try:  # a manifest that decompressed wrongly: report the broken stream
                        stream.drain(where, limits.unpacked_bytes)
                    except InvalidBundle:
                        raise refused from None
                    raise
        stream.drain(where)
    if manifest is None:
        raise InvalidBundle(where, MANIFEST, "missing or not a regular file")
    return sizes, manifest


def _member_bytes(tar: tarfile.TarFile, member: tarfile.TarInfo, where: str) -> bytes:
    src = tar.extractfile(member)
    if src is None:
        raise InvalidBundle(where, member.name, "cannot be read")
    with src:
        parts = []
        while chunk := src.read(_CHUNK):
            parts.append(chunk)
    return b"".join(parts)


def _check_listing(sizes: Mapping[str, int], m: _Manifest, where: str) -> None:
    """Every member a file the manifest lists, of the size it states; every listed file there."""
    for name, size in sorted(sizes.items()):
        e = m.objects.get(name)
        if e is None and name not in (MANIFEST, SUMS):
            raise InvalidBundle(where, _shown(name), "not listed in manifest.json")
        if e is not None and size != e.size:
            raise InvalidBundle(where, name, f"holds {size} bytes; manifest.json says {e.size}")
        parent = name.rpartition("/")[0]
        while parent:
            if parent in sizes:
                raise InvalidBundle(where, parent, "is both a file and a directory")
            parent = parent.rpartition("/")[0]
    for name in sorted(m.objects.keys() - sizes.keys()):
        raise InvalidBundle(where, name, "listed in manifest.json but missing")


def _extract(raw: BinaryIO, sizes: Mapping[str, int], dest: Path, where: str,
             limits: ImportLimits) -> None:
    """Second pass: write the files the first pass accepted, each at most its stated size
    (a tar that changed in between is refused)."""
    with tarfile.open(fileobj=_TarStream(raw), mode="r:") as tar:  # type: ignore[call-overload]
        for member in _members(tar, where, limits):
            if member.isdir() or member.name == MANIFEST:
                continue  # the manifest was parsed in the first pass
            if sizes.get(member.name) != member.size:
                raise InvalidBundle(where, member.name, "changed while it was being imported")
            _extract_one(tar, member, dest / member.name, where)


def _extract_one(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path, where: str) -> None:
    src = tar.extractfile(member)
    if src is None:
        raise InvalidBundle(where, member.name, "cannot be read")
    written = 0
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with src, target.open("xb") as out:
            while chunk := src.read(_CHUNK):
                written += len(chunk)
                if written > member.size:
                    raise InvalidBundle(where, member.name, f"holds more than {member.size} bytes")
                out.write(chunk)
    except FileExistsError:
        raise InvalidBundle(where, member.name, "appears twice in the tar") from None
    except (NotADirectoryError, IsADirectoryError):
        raise InvalidBundle(where, member.name, "is both a file and a directory") from None
    except OSError as exc:  # a full disk, say: the temporary directory goes with the error
        raise InvalidInput(f"{where}: cannot unpack {member.name} into {target.parent}: "
                           f"{exc.strerror or exc}") from None


def _validate(root: Path, where: str, limits: ImportLimits,
              manifest: _Manifest | None = None) -> _Bundle:
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
        raise InvalidBundle(where, _shown(path), "not listed in manifest.json")
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
        with _open_plain(root / path) as f:
            (oid, sha, _size), parts = _hash_stream(
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
            raise InvalidBundle(where, path, f"bytes are a {_shown(value['nscas'])} record; "
                                             "manifest.json says a blob (kind null)")
    for t, (r, sha) in sorted(m.derived.items()):
        if hashed.get(r) != (t, sha):
            raise InvalidBundle(where, m.paths[r.source], f"bytes {r.offset}..+{r.size} do not "
                                                          f"hash to derived {t} (sha256 {sha})")
        if r.size <= canonical.MAX_RECORD_BYTES:
            with _open_plain(root / m.paths[r.source]) as f:
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
    for rid in sorted(values):  # the signatures of reached receipts, after their receipts
        if values[rid].get("nscas") == SIGNATURE and rid not in reached \
                and Digest.parse(values[rid]["receipt"]) in reached:
            reached.add(rid)
            order.append(rid)
    for d in sorted(known - reached):
        raise InvalidBundle(where, MANIFEST, f"{d} is not in the closure of the target {m.target}")
    return tuple(order), children


def _open_plain(path: Path) -> BinaryIO:
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
                raise InvalidBundle(where, _shown(rel), "is a symbolic link; "
                                                        "bundles hold regular files only")
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                raise InvalidBundle(where, _shown(rel), f"is a hard link ({st.st_nlink} names); "
                                    "bundles hold files of their own (copy it, do not link it)")
            if stat.S_ISREG(st.st_mode):
                found.add(rel)
            elif not stat.S_ISDIR(st.st_mode):
                raise InvalidBundle(where, _shown(rel), "is a device, FIFO or socket; "
                                                        "bundles hold regular files only")
    return found


def _read_bounded(path: Path, limit: int, where: str, name: str, flag: str) -> bytes:
    """A regular file's bytes, refused unread if its size is over ``limit``, and never more
    than ``limit`` + 1 bytes read (a file that grows meanwhile is refused too)."""
    with _open_plain(path) as f:
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


def _read_manifest(root: Path, where: str, limits: ImportLimits) -> _Manifest:
    path = root / MANIFEST
    if path.is_symlink() or not path.is_file():
        raise InvalidBundle(where, MANIFEST, "missing or not a regular file")
    return _parse_manifest(_read_bounded(path, limits.manifest_bytes, where, MANIFEST,
                                         "--max-manifest-bytes"), where)


def _parse_manifest(data: bytes, where: str) -> _Manifest:
    """manifest.json's bytes (already within their size limit) as a checked manifest."""
    try:
        value = canonical.loads_strict(data, max_depth=MANIFEST_MAX_DEPTH)
    except StrictJSONError as exc:
        raise InvalidBundle(where, MANIFEST, f"not valid JSON ({exc.reason})") from None
    try:
        canonical_form = isinstance(value, dict) and rfc8785.dumps(value) == data
    except (rfc8785.CanonicalizationError, TypeError, ValueError):  # lone surrogates, say
        canonical_form = False
    if not canonical_form:
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
        if top["format"] not in FORMATS:
            self.fail("format", f"expected one of {', '.join(map(repr, FORMATS))}")
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
        files: dict[Digest, list[str]] = defaultdict(list)
        for path in sorted(objects, key=str.encode):
            files[objects[path].id].append(path)
        if top["format"] == FORMAT_V1:  # version 2 may repeat a file, never a section
            ids = Counter([e.id for e in objects.values()] + [*derived] + [*omitted])
        else:
            ids = Counter([*files, *derived, *omitted])
            for oid, where in sorted(files.items()):
                for other in (p for p in where[1:] if objects[p] != objects[where[0]]):
                    self.fail(f"objects[{other!r}]", f"describes {oid} otherwise than "
                                                     f"objects[{where[0]!r}]")
        for oid in sorted(d for d, n in ids.items() if n > 1):
            self.fail(str(oid), "is in more than one place (a file, derived, omitted)")
        paths = {oid: where[0] for oid, where in files.items()}
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
