"""Read-only access to objects, from a store directory or from an export bundle.

Three readers, one interface (``Source``), written from docs/format.md §1, docs/format.md §5 and docs/bundle.md and
sharing no code with the store:

- ``StoreSource`` opens ``<store>/nscas.db`` with stdlib ``sqlite3`` in ``mode=ro`` (on a
  read-only mount without a ``-shm`` file, ``immutable=1``) and reads
  an object's bytes from its row (``inline``), from its chunk file ``data/<2 hex>/<62 hex>``
  (``file``, raw or zstd) or by concatenating its ``parts`` in order (recursively).
- ``TeamStoreSource`` reads a team store the same way, its ``store.toml`` parsed here: the
  database through ``psycopg`` in read-only transactions, chunk objects through ``boto3``
  (``s3://bucket/prefix``) or from a shared directory.
- ``BundleSource`` reads ``manifest.json`` and the files it names; ``derived`` objects are byte
  ranges of another object and ``omitted`` ones are known only by size and SHA-256.

Readers hand out bytes as stored, *unverified*: re-hashing is the integrity checker's job
(``closure.py``), so that a corrupt object becomes a finding instead of a crash.
"""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

import zstandard

from ..core.errors import MissingObject, RecordParseError, VerifierError
from .objects import READ_CHUNK, is_object_id
from .reading import MAX_RECORD_BYTES, extract_links, parse_json

DB_NAME = "nscas.db"
CONFIG_NAME = "store.toml"  # a team store: PostgreSQL + object storage
STORE_DIR = ".nscas"
ENV_VAR = "NSCAS_STORE"
MANIFEST = "manifest.json"
SUMS = "SHA256SUMS"
TARBALL = "measurements.tar.gz"
BUNDLE_FORMAT_V1 = "nscas-bundle/1"
"""The first bundle format: every object in one place only."""
BUNDLE_FORMAT = "nscas-bundle/2"
"""Model folders hold every file of their checkpoint: a file may repeat an object."""
BUNDLE_FORMATS = (BUNDLE_FORMAT_V1, BUNDLE_FORMAT)
MIN_PREFIX = 8
MAX_MANIFEST_BYTES = 64 << 20
"""Largest manifest.json read (about 200,000 objects' entries)."""
CHUNK_LIMIT = 1 << 30
ZSTD_WINDOW_MAX = 1 << 25  # docs/format.md §5.5: a chunk's zstd frame needs no larger window
"""Most bytes one compressed chunk file may inflate to (store chunks are far smaller)."""
_HEX_PREFIX = re.compile(r"^(?:blake3:)?([0-9a-f]{8,64})$")
_REF_NAME = re.compile(r"^[A-Za-z0-9._-]+(?:/[A-Za-z0-9._-]+)*$")


class BadTarget(VerifierError):
    """The TARGET argument names nothing usable (exit 2)."""

    def __init__(self, target: str, why: str) -> None:
        super().__init__(f"cannot verify {target!r}: {why}")
        self.target = target
        self.why = why


class SourceError(VerifierError):
    """A store or bundle cannot be opened or read at all (exit 2)."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"{where}: {why}")
        self.where = where
        self.why = why


class Unreadable(VerifierError):
    """An object is listed but its bytes cannot be produced (a chunk file is gone, zstd data
    is corrupt). ``missing`` is true when the bytes are simply absent (exit 3)."""

    def __init__(self, object_id: str, why: str, *, missing: bool) -> None:
        super().__init__(f"object {object_id}: {why}")
        self.object_id = object_id
        self.why = why
        self.missing = missing
        self.exit_code = 3 if missing else 1


@dataclass(frozen=True, slots=True, kw_only=True)
class ObjectMeta:
    """What a source records about one object, before anything is re-hashed."""

    id: str
    """``blake3:`` ID."""
    size: int
    """Recorded size in bytes."""
    sha256: str | None
    """Recorded SHA-256 hex; None where the store has not computed it yet (a tensor object's
    SHA-256 is computed lazily, docs/format.md §1.2): nothing to compare then."""
    kind: str | None
    """Recorded record kind (``receipt/1``), None for a blob."""
    where: str
    """Where the bytes live, for messages (a store row, a bundle path)."""


class Source(Protocol):
    """Read-only object access shared by the store and bundle readers."""

    label: str
    """What is being read, for messages."""

    def meta(self, oid: str) -> ObjectMeta | None:
        """The recorded facts of ``oid``; None when the source does not hold it."""

    def omitted(self, oid: str) -> str | None:
        """Why ``oid`` was left out on purpose (a bundle without weights), else None."""

    def chunks(self, oid: str) -> Iterator[bytes]:
        """The object's bytes in pieces, unverified; raises ``Unreadable``/``MissingObject``."""

    def file_path(self, oid: str) -> Path | None:
        """A regular file holding exactly the object's bytes, if the source has one."""

    def resolve(self, text: str) -> str:
        """A full ID, ref name or unique hex prefix as a full ID; raises ``BadTarget``."""

    def parents(self, oid: str) -> list[str] | None:
        """IDs of the records that link ``oid``, or None when the source has no link index."""

    def created(self, oid: str) -> float | None:
        """When the source first stored ``oid`` (seconds since the epoch), if it knows."""


def read_all(source: Source, oid: str) -> bytes:
    return b"".join(source.chunks(oid))


# --- the store ---------------------------------------------------------------------------

def _is_store(path: Path) -> bool:
    return (path / DB_NAME).is_file() or (path / CONFIG_NAME).is_file()


def find_store_dir(path: Path | None = None) -> Path:
    """The store directory: ``path`` (a store, a directory holding ``.nscas``, or a team
    store's ``store.toml``), else ``$NSCAS_STORE``, else ``.nscas`` here or in a parent."""
    if path is None and os.environ.get(ENV_VAR):
        path = Path(os.environ[ENV_VAR])
    if path is not None:
        if path.name == CONFIG_NAME and path.is_file():
            return path.parent
        for candidate in (path, path / STORE_DIR):
            if _is_store(candidate):
                return candidate
        raise SourceError(str(path), f"not an nscas store (no {DB_NAME} or {CONFIG_NAME} in it "
                                     f"or in {path / STORE_DIR}); pass --store or a bundle "
                                     "directory")
    here = Path.cwd().resolve()
    for directory in (here, *here.parents):
        if _is_store(directory / STORE_DIR):
            return directory / STORE_DIR
    raise SourceError("store", "no nscas store here or in any parent directory; pass --store "
                               "or a bundle directory")


def _open_read_only(db: Path) -> sqlite3.Connection:
    """The store's database opened ``mode=ro``; on a read-only mount, where SQLite cannot
    create the ``-shm`` file a WAL database is read through, ``immutable=1`` instead, but only
    while no ``-shm`` exists (no writer has it open) and no commit waits in the ``-wal``."""
    uri = f"{db.resolve().as_uri()}?mode=ro"
    con = sqlite3.connect(uri, uri=True)
    try:
        con.execute("SELECT 1 FROM objects LIMIT 1").fetchall()
        return con
    except sqlite3.OperationalError as exc:
        con.close()
        wal, shm = Path(f"{db}-wal"), Path(f"{db}-shm")
        if (getattr(exc, "sqlite_errorname", "") != "SQLITE_CANTOPEN" or shm.exists()
                or os.access(db.parent, os.W_OK) or (wal.exists() and wal.stat().st_size)):
            raise
    con = sqlite3.connect(uri + "&immutable=1", uri=True)
    try:
        con.execute("SELECT 1 FROM objects LIMIT 1").fetchall()
    except sqlite3.Error:
        con.close()
        raise
    return con


class StoreSource:
    """An nscas store read through ``sqlite3`` (read-only) and its chunk files."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.label = f"store {root}"
        db = root / DB_NAME
        if not db.is_file():
            raise SourceError(str(root), f"not an nscas store (no {DB_NAME})")
        try:
            self._db = _open_read_only(db)
            # Since schema 0003 a SHA-256 computed after the put is in object_sha256.
            lazy = self._db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND "
                                    "name = 'object_sha256'").fetchone() is not None
        except sqlite3.Error as exc:
            raise SourceError(str(db), f"cannot read the database: {exc}") from None
        self._sha256 = ("COALESCE(sha256, (SELECT s.sha256 FROM object_sha256 s WHERE "
                        "s.id = objects.id))" if lazy else "sha256")

    def close(self) -> None:
        self._db.close()

    def _query(self, sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        try:
            return self._db.execute(sql, args).fetchall()
        except sqlite3.Error as exc:  # a damaged or foreign schema: unusable input, not a crash
            raise SourceError(f"{self.root / DB_NAME}", f"cannot read the database: {exc}") from None

    def _row(self, hex_id: str) -> tuple[Any, ...] | None:
        rows = self._query(f"SELECT size, {self._sha256}, kind, storage, codec, data, created "
                           "FROM objects WHERE id = ?", (hex_id,))
        return rows[0] if rows else None

    def meta(self, oid: str) -> ObjectMeta | None:
        row = self._row(oid.removeprefix("blake3:"))
        if row is None:
            return None
        # Whatever the columns hold, the recorded facts are only compared with what re-hashing
        # finds: a value of the wrong type simply never matches.
        size = row[0] if isinstance(row[0], int) and not isinstance(row[0], bool) else -1
        return ObjectMeta(id=oid, size=size, sha256=None if row[1] is None else str(row[1]),
                          kind=row[2] if isinstance(row[2], str) else None,
                          where=f"{self.label}, row {oid} ({row[3]})")

    def omitted(self, oid: str) -> str | None:
        return None

    def chunks(self, oid: str) -> Iterator[bytes]:
        yield from self._leaves(oid.removeprefix("blake3:"), depth=0)

    def _leaves(self, hex_id: str, depth: int) -> Iterator[bytes]:
        if depth > 8:  # parts of parts exist (large tensors); deeper nesting means a cycle
            raise Unreadable(f"blake3:{hex_id}", "parts nest too deeply", missing=False)
        row = self._row(hex_id)
        if row is None:
            raise MissingObject(f"blake3:{hex_id}")
        storage, codec, data = row[3], row[4], row[5]
        if storage == "inline":
            if not isinstance(data, bytes | bytearray | memoryview):
                raise Unreadable(f"blake3:{hex_id}", "inline row without data", missing=True)
            yield bytes(data)
        elif storage == "file":
            yield self._chunk_file(hex_id, codec, row[0])
        elif storage == "parts":
            subs = self._query("SELECT part_id FROM parts WHERE object_id = ? ORDER BY idx",
                               (hex_id,))
            if not subs:
                raise Unreadable(f"blake3:{hex_id}", "stored as parts but has none", missing=True)
            for (sub,) in subs:
                if not isinstance(sub, str) or not re.fullmatch(r"[0-9a-f]{64}", sub):
                    raise Unreadable(f"blake3:{hex_id}", f"part {sub!r} is not an ID",
                                     missing=False)
                yield from self._leaves(sub, depth + 1)
        else:
            raise Unreadable(f"blake3:{hex_id}", f"unknown storage {storage!r}", missing=False)

    def _stored(self, hex_id: str) -> tuple[bytes, str]:
        """A leaf's bytes as stored (perhaps zstd), and where they were read, for messages."""
        return _read_chunk_file(self.root / "data", hex_id)

    def _chunk_file(self, hex_id: str, codec: str, size: Any) -> bytes:
        stored, path = self._stored(hex_id)
        if codec == "raw":
            return stored
        if codec == "zstd":
            # Never inflate past the recorded size: a small hostile frame can declare gigabytes.
            limit = size if isinstance(size, int) and 0 <= size <= CHUNK_LIMIT else CHUNK_LIMIT
            try:
                with zstandard.ZstdDecompressor(max_window_size=ZSTD_WINDOW_MAX).stream_reader(
                        stored) as reader:
                    pieces, got = [], 0
                    while got <= limit and (piece := reader.read(min(READ_CHUNK, limit + 1 - got))):
                        pieces.append(piece)
                        got += len(piece)
                data = b"".join(pieces)
            except zstandard.ZstdError as exc:
                raise Unreadable(f"blake3:{hex_id}", f"{path} is not valid zstd "
                                 f"({exc})", missing=False) from None
            if len(data) > limit:
                raise Unreadable(f"blake3:{hex_id}", f"{path} inflates past its "
                                 f"recorded {limit} bytes", missing=False)
            return data
        raise Unreadable(f"blake3:{hex_id}", f"unknown codec {codec!r}", missing=False)

    def file_path(self, oid: str) -> Path | None:
        return None  # chunk files may be compressed or split: never the object's bytes as is

    def resolve(self, text: str) -> str:
        if is_object_id(text):
            if self._row(text.removeprefix("blake3:")) is None:
                raise MissingObject(text)
            return text
        if _REF_NAME.fullmatch(text):
            rows = self._query("SELECT target FROM refs WHERE name = ?", (text,))
            if rows:
                if not (isinstance(rows[0][0], str) and is_object_id("blake3:" + rows[0][0])):
                    raise BadTarget(text, "the ref's target in the database is not an ID")
                return "blake3:" + rows[0][0]
        match = _HEX_PREFIX.fullmatch(text)
        if match is None:
            raise BadTarget(text, "not an ID, a ref name of this store, or a hex prefix of at "
                                  f"least {MIN_PREFIX} digits")
        prefix = match.group(1)
        rows = self._query("SELECT id FROM objects WHERE id >= ? AND id < ? ORDER BY id LIMIT 11",
                           (prefix, prefix + "g"))
        if not rows:
            raise BadTarget(text, "no object or ref of that name in the store")
        if len(rows) > 1:
            shown = ", ".join(r[0][:16] for r in rows[:10])
            raise BadTarget(text, f"prefix is ambiguous ({shown}{', ...' if len(rows) > 10 else ''})")
        return "blake3:" + rows[0][0]

    def parents(self, oid: str) -> list[str] | None:
        rows = self._query("SELECT DISTINCT parent FROM links WHERE child = ? ORDER BY parent",
                           (oid.removeprefix("blake3:"),))
        return [f"blake3:{r[0]}" for r in rows if isinstance(r[0], str)
                and is_object_id(f"blake3:{r[0]}")]

    def created(self, oid: str) -> float | None:
        row = self._row(oid.removeprefix("blake3:"))
        if row is None or not isinstance(row[6], int | float) or isinstance(row[6], bool):
            return None
        return float(row[6])


def _read_chunk_file(data: Path, hex_id: str) -> tuple[bytes, str]:
    path = data / hex_id[:2] / hex_id[2:]
    try:
        return path.read_bytes(), f"chunk file {path}"
    except FileNotFoundError:
        raise Unreadable(f"blake3:{hex_id}", f"chunk file {path} is missing",
                         missing=True) from None
    except OSError as exc:
        raise Unreadable(f"blake3:{hex_id}", f"chunk file {path} cannot be read "
                         f"({exc.strerror or exc})", missing=False) from None


# --- a team store: PostgreSQL + object storage (docs/format.md §5.9) ---------------------

_CONFIG_KEYS = {"database", "objects", "s3"}
_S3_KEYS = {"endpoint_url", "region", "access_key_id", "secret_access_key"}


@dataclass(frozen=True, slots=True, kw_only=True)
class TeamConfig:
    """What a team store's ``store.toml`` says, as this reader parses it (tomllib)."""

    database: str
    objects: str
    s3: dict[str, str]


def read_team_config(path: Path) -> TeamConfig:
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SourceError(str(path), f"cannot read the store config: {exc}") from None
    s3 = raw.get("s3", {})
    if (set(raw) - _CONFIG_KEYS or not isinstance(raw.get("database"), str)
            or not isinstance(raw.get("objects"), str) or not isinstance(s3, dict)
            or set(s3) - _S3_KEYS or not all(isinstance(v, str) for v in s3.values())):
        raise SourceError(str(path), "not a team store config (database = \"postgresql://...\", "
                                     "objects = \"s3://...\" or a directory, optional [s3])")
    if not raw["database"].startswith(("postgresql://", "postgres://")):
        raise SourceError(str(path), "database must be a postgresql:// URL")
    return TeamConfig(database=raw["database"], objects=raw["objects"].rstrip("/"), s3=s3)


class TeamStoreSource(StoreSource):
    """A team store read through its own read-only readers: PostgreSQL with ``psycopg`` in
    read-only transactions, leaves from S3 with ``boto3`` (or from a shared directory)."""

    def __init__(self, root: Path) -> None:
        import psycopg

        self.root = root
        self.config = read_team_config(root / CONFIG_NAME)
        self.label = f"store {root}"
        self._psycopg = psycopg
        try:
            self._db = psycopg.connect(self.config.database, autocommit=True, connect_timeout=10,
                                       options="-c default_transaction_read_only=on",
                                       application_name="nscas-verify")
            lazy = self._db.execute("SELECT to_regclass('object_sha256')").fetchone()[0]
        except psycopg.Error as exc:
            raise SourceError(_redact(self.config.database),
                              f"cannot read the database: {_first_line(exc)}") from None
        self._sha256 = ("COALESCE(sha256, (SELECT s.sha256 FROM object_sha256 s WHERE "
                        "s.id = objects.id))" if lazy is not None else "sha256")
        self._bucket = self._prefix = ""
        self._s3: Any = None
        if self.config.objects.startswith("s3://"):
            self._bucket, _, self._prefix = self.config.objects[5:].partition("/")
            self._s3 = _s3_client(self.config.s3)

    def close(self) -> None:
        self._db.close()

    def _query(self, sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        try:
            return self._db.execute(sql.replace("?", "%s"), args, prepare=False).fetchall()
        except self._psycopg.Error as exc:
            raise SourceError(_redact(self.config.database),
                              f"cannot read the database: {_first_line(exc)}") from None

    def _stored(self, hex_id: str) -> tuple[bytes, str]:
        if self._s3 is None:
            return _read_chunk_file(Path(self.config.objects) / "data", hex_id)
        from botocore.exceptions import BotoCoreError, ClientError

        key = "/".join(p for p in (self._prefix, "data", hex_id[:2], hex_id[2:]) if p)
        where = f"chunk object s3://{self._bucket}/{key}"
        try:
            return self._s3.get_object(Bucket=self._bucket, Key=key)["Body"].read(), where
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            missing = code in ("NoSuchKey", "404", "NotFound")
            raise Unreadable(f"blake3:{hex_id}", f"{where} is missing" if missing
                             else f"{where} cannot be read ({code})", missing=missing) from None
        except BotoCoreError as exc:
            raise SourceError(where, f"cannot reach object storage: {exc}") from None


def _s3_client(settings: dict[str, str]) -> Any:
    import boto3

    return boto3.session.Session().client(
        "s3", endpoint_url=settings.get("endpoint_url"), region_name=settings.get("region"),
        aws_access_key_id=settings.get("access_key_id"),
        aws_secret_access_key=settings.get("secret_access_key"))


def _redact(url: str) -> str:
    return re.sub(r"(://[^:/@]*):[^@]*@", r"\1:***@", url)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def open_store_source(root: Path) -> StoreSource:
    """The reader of the store directory ``root``: a team store's if it holds ``store.toml``."""
    return TeamStoreSource(root) if (root / CONFIG_NAME).is_file() else StoreSource(root)


# --- the bundle --------------------------------------------------------------------------

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
        self.target = manifest.get("target")
        if not is_object_id(self.target):
            raise SourceError(str(root / MANIFEST), "'target' is not an object ID")
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

    def _read_sections(self) -> None:
        objects = self.manifest.get("objects")
        derived = self.manifest.get("derived", {})
        omitted = self.manifest.get("omitted", {})
        for name, section in (("objects", objects), ("derived", derived), ("omitted", omitted)):
            if not isinstance(section, dict):
                raise SourceError(str(self.root / MANIFEST), f"'{name}' is not an object")
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
        match = _HEX_PREFIX.fullmatch(text)
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
