"""An export bundle read as a ``Source`` (docs/bundle.md): ``manifest.json`` and the files it
names; ``derived`` objects are byte ranges of another object and ``omitted`` ones are known
only by size and SHA-256.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ..core.errors import MissingObject, RecordParseError
from ..records.objects import READ_CHUNK, is_object_id
from ..records.reading import MAX_RECORD_BYTES, extract_links, parse_json
from ..records.sources import HEX_PREFIX, BadTarget, ObjectMeta, SourceError, Unreadable

MANIFEST = "manifest.json"


SUMS = "SHA256SUMS"


TARBALL = "measurements.tar.gz"


BUNDLE_FORMAT_V1 = "nscas-bundle/1"
"""The first bundle format: every object in one place only."""


BUNDLE_FORMAT = "nscas-bundle/2"
"""Model folders hold every file of their checkpoint: a file may repeat an object."""


BUNDLE_FORMATS = (BUNDLE_FORMAT_V1, BUNDLE_FORMAT)


MAX_MANIFEST_BYTES = 64 << 20
"""Largest manifest.json read (about 200,000 objects' entries)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Derived:
    """A bundle object whose bytes are a byte range of another object."""

    source: str
    offset: int
    size: int
    sha256: str


def is_bundle(path: Path) -> bool:
    return path.is_dir() and (path / MANIFEST).is_file()


MAX_SEGMENT_BYTES = 255
"""Longest path segment a bundle may hold (NAME_MAX of Linux and most filesystems)."""


MAX_PATH_BYTES = 1024


def safe_relative(path: str) -> str | None:
    """Why a manifest path is unsafe (absolute, ``..``, empty parts, longer than a filesystem
    holds), or None if it is fine."""
    if not isinstance(path, str) or not path:
        return "empty path"
    if "\\" in path or "\x00" in path:
        return "holds a backslash or NUL"
    pure = PurePosixPath(path)
    if pure.is_absolute():
        return "absolute path"
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "holds '.', '..' or an empty part"
    try:
        encoded = [part.encode("utf-8") for part in parts]
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    if any(len(part) > MAX_SEGMENT_BYTES for part in encoded):
        return f"has a segment over {MAX_SEGMENT_BYTES} bytes"
    if len(path.encode("utf-8")) > MAX_PATH_BYTES:
        return f"is over {MAX_PATH_BYTES} bytes"
    return None


class BundleSource:
    """An export bundle (docs/bundle.md) read from its directory, with no store."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.label = f"bundle {root}"
        self.problems: list[str] = []
        """Everything wrong with the manifest itself, found while reading it."""
        data = self._file_bytes(MANIFEST)
        try:
            manifest = parse_json(data, what=MANIFEST)
        except RecordParseError as exc:
            raise SourceError(str(root / MANIFEST), exc.message) from None
        if not isinstance(manifest, dict) or manifest.get("format") not in BUNDLE_FORMATS:
            raise SourceError(str(root / MANIFEST), f"not a {' or '.join(BUNDLE_FORMATS)} "
                                                    "manifest")
        self.format: str = manifest["format"]
        self.manifest_bytes = data
        self.manifest: dict[str, Any] = manifest
        target = manifest.get("target")
        if not is_object_id(target):
            raise SourceError(str(root / MANIFEST), "'target' is not an object ID")
        self.target: str = target
        self.paths: dict[str, dict[str, Any]] = {}
        self._by_id: dict[str, str] = {}
        self._derived: dict[str, Derived] = {}
        self._omitted: dict[str, dict[str, Any]] = {}
        self._parents: dict[str, list[str]] | None = None
        self._read_sections()

    def copies(self) -> dict[str, list[str]]:
        """Each object at more than one path (format 2): its paths, the one read first."""
        paths: dict[str, list[str]] = {}
        for path, entry in self.paths.items():
            paths.setdefault(entry["id"], []).append(path)
        return {oid: sorted(where, key=lambda p: (p != self._by_id[oid], p.encode("utf-8")))
                for oid, where in paths.items() if len(where) > 1}

    def listed_ids(self) -> set[str]:
        """Every object the manifest accounts for: files, derived ranges and omitted ones."""
        return set(self._by_id) | set(self._derived) | set(self._omitted)

    def _file_bytes(self, rel: str) -> bytes:
        path = self.root / rel
        try:
            if path.is_symlink():
                raise SourceError(str(path), "is a symbolic link")
            if path.stat().st_size > MAX_MANIFEST_BYTES:
                raise SourceError(str(path), f"is over {MAX_MANIFEST_BYTES} bytes, more than "
                                             "any bundle's manifest")
            return path.read_bytes()
        except OSError as exc:
            raise SourceError(str(path), exc.strerror or str(exc)) from None

    def _section(self, name: str, *, required: bool) -> dict[str, Any]:
        section = self.manifest.get(name) if required else self.manifest.get(name, {})
        if not isinstance(section, dict):
            raise SourceError(str(self.root / MANIFEST), f"'{name}' is not an object")
        return section

    def _read_sections(self) -> None:
        objects = self._section("objects", required=True)
        derived = self._section("derived", required=False)
        omitted = self._section("omitted", required=False)
        for path, entry in objects.items():
            why = safe_relative(path)
            if why is None and not (isinstance(entry, dict) and is_object_id(entry.get("id"))
                                    and _count(entry.get("size")) and _hex64(entry.get("sha256"))):
                why = "entry needs id, size and sha256"
            if why is not None:
                self.problems.append(f"objects[{path!r}]: {why}")
                continue
            self.paths[path] = entry
            first = self._by_id.get(entry["id"])  # a repeated object is read at its first path
            if first is None or path.encode("utf-8") < first.encode("utf-8"):
                self._by_id[entry["id"]] = path
        for oid, entry in derived.items():
            if not (is_object_id(oid) and isinstance(entry, dict) and is_object_id(entry.get("from"))
                    and _count(entry.get("offset")) and _count(entry.get("size"))
                    and _hex64(entry.get("sha256"))):
                self.problems.append(f"derived[{oid!r}]: needs from, offset, size and sha256")
                continue
            self._derived[oid] = Derived(source=entry["from"], offset=entry["offset"],
                                         size=entry["size"], sha256=entry["sha256"])
        for oid, entry in omitted.items():
            if not (is_object_id(oid) and isinstance(entry, dict) and _count(entry.get("size"))
                    and _hex64(entry.get("sha256"))):
                self.problems.append(f"omitted[{oid!r}]: needs size, sha256 and reason")
                continue
            self._omitted[oid] = entry

    def meta(self, oid: str) -> ObjectMeta | None:
        path = self._by_id.get(oid)
        if path is not None:
            entry = self.paths[path]
            kind = entry.get("kind")
            return ObjectMeta(id=oid, size=entry["size"], sha256=entry["sha256"],
                              kind=kind if isinstance(kind, str) else None,
                              where=f"{self.label}, file {path}")
        derived = self._derived.get(oid)
        if derived is not None:
            return ObjectMeta(id=oid, size=derived.size, sha256=derived.sha256, kind=None,
                              where=f"{self.label}, bytes {derived.offset}..+{derived.size} of "
                                    f"{derived.source}")
        return None

    def omitted(self, oid: str) -> str | None:
        entry = self._omitted.get(oid)
        if entry is None:
            return None
        return str(entry.get("reason") or "omitted")

    def chunks(self, oid: str) -> Iterator[bytes]:
        path = self._by_id.get(oid)
        if path is not None:
            yield from self._read_file(oid, path)
            return
        derived = self._derived.get(oid)
        if derived is None:
            raise MissingObject(oid)
        if derived.source in self._derived:
            raise Unreadable(oid, "derived from another derived object", missing=False)
        source_path = self._by_id.get(derived.source)
        if source_path is None:
            why = "omitted" if derived.source in self._omitted else "not in the bundle"
            raise Unreadable(oid, f"derived from {derived.source}, which is {why}", missing=True)
        yield from self._read_range(oid, source_path, derived.offset, derived.size)

    def _checked_path(self, oid: str, rel: str) -> Path:
        path = self.root / rel
        try:
            if path.is_symlink() or any(p.is_symlink() for p in path.parents
                                        if p != self.root and self.root in p.parents):
                raise Unreadable(oid, f"bundle path {rel} is a symbolic link", missing=False)
            if not path.is_file():
                raise Unreadable(oid, f"bundle file {rel} is missing", missing=True)
        except OSError as exc:
            raise Unreadable(oid, f"bundle path {rel} cannot be examined "
                             f"({exc.strerror or exc})", missing=False) from None
        return path

    def _read_file(self, oid: str, rel: str) -> Iterator[bytes]:
        path = self._checked_path(oid, rel)
        try:
            with path.open("rb") as stream:
                while piece := stream.read(READ_CHUNK):
                    yield piece
        except OSError as exc:
            raise Unreadable(oid, f"bundle file {rel} cannot be read ({exc.strerror or exc})",
                             missing=False) from None

    def _read_range(self, oid: str, rel: str, offset: int, size: int) -> Iterator[bytes]:
        path = self._checked_path(oid, rel)
        try:
            if offset + size > path.stat().st_size:
                raise Unreadable(oid, f"range {offset}..+{size} runs past the end of {rel}",
                                 missing=False)
            with path.open("rb") as stream:
                stream.seek(offset)
                left = size
                while left:
                    piece = stream.read(min(left, READ_CHUNK))
                    if not piece:
                        raise Unreadable(oid, f"{rel} ended inside range {offset}..+{size}",
                                         missing=False)
                    left -= len(piece)
                    yield piece
        except OSError as exc:
            raise Unreadable(oid, f"bundle file {rel} cannot be read ({exc.strerror or exc})",
                             missing=False) from None

    def file_path(self, oid: str) -> Path | None:
        path = self._by_id.get(oid)
        if path is None:
            return None
        try:
            return self._checked_path(oid, path)
        except Unreadable:
            return None

    def resolve(self, text: str) -> str:
        known = {*self._by_id, *self._derived, *self._omitted}
        if is_object_id(text):
            if text not in known:
                raise MissingObject(text)
            return text
        match = HEX_PREFIX.fullmatch(text)
        if match is None:
            raise BadTarget(text, "a bundle is verified by its directory, an ID or a hex prefix")
        hits = sorted(i for i in known if i[7:].startswith(match.group(1)))
        if len(hits) != 1:
            raise BadTarget(text, "no object of the bundle has that prefix" if not hits
                            else f"prefix is ambiguous ({len(hits)} objects)")
        return hits[0]

    def parents(self, oid: str) -> list[str] | None:
        if self._parents is None:
            self._parents = self._index_links()
        return self._parents.get(oid, [])

    def _index_links(self) -> dict[str, list[str]]:
        """Child -> parents over every file of the bundle whose bytes are a JSON object with an
        ``nscas`` member, whatever the manifest's ``kind`` label says (a record relabelled as a
        blob must not hide from lineage). The index only points the checkers at records;
        whatever they then read is verified as usual."""
        index: dict[str, set[str]] = {}
        for path, entry in self.paths.items():
            data = self._record_candidate(path, entry)
            if data is None:
                continue
            try:
                value = parse_json(data, what=path)
            except RecordParseError:
                continue
            if not isinstance(value, dict) or not isinstance(value.get("nscas"), str):
                continue
            for link in extract_links(value):
                index.setdefault(link.target, set()).add(entry["id"])
        return {child: sorted(parents) for child, parents in index.items()}

    def _record_candidate(self, rel: str, entry: dict[str, Any]) -> bytes | None:
        """The file's bytes if they could be a record (a regular file of at most 16 MiB that
        starts with ``{``), else None; read without following links."""
        path = self.root / rel
        try:
            if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_RECORD_BYTES:
                return None
            with path.open("rb") as stream:
                if stream.read(1) != b"{":
                    return None
                return b"{" + stream.read(MAX_RECORD_BYTES)
        except OSError:
            return None

    def sums_sha256(self) -> str | None:
        """SHA-256 hex of the bundle's SHA256SUMS file (what a publisher pins), if readable."""
        path = self.root / SUMS
        try:
            if path.is_symlink() or not path.is_file():
                return None
            digest = hashlib.sha256()
            with path.open("rb") as stream:
                while piece := stream.read(READ_CHUNK):
                    digest.update(piece)
            return digest.hexdigest()
        except OSError:
            return None

    def created(self, oid: str) -> float | None:
        return None

    def all_files(self) -> list[str]:
        """Every regular file under the bundle directory, relative, sorted bytewise."""
        found = []
        for directory, _dirs, files in os.walk(self.root):
            for name in files:
                rel = (Path(directory) / name).relative_to(self.root).as_posix()
                found.append(rel)
        return sorted(found, key=lambda p: p.encode("utf-8"))


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _hex64(value: Any) -> bool:
    return isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value) is not None
