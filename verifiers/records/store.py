"""A store read directly (docs/format.md §5), sharing no code with the store.

- ``StoreSource`` opens ``<store>/nscas.db`` with stdlib ``sqlite3`` in ``mode=ro`` (on a
  read-only mount without a ``-shm`` file, ``immutable=1``) and reads
  an object's bytes from its row (``inline``), from its chunk file ``data/<2 hex>/<62 hex>``
  (``file``, in any codec of §5.5.1, decoded by ``codecs.decode_leaf``) or by concatenating its
  ``parts`` in order (recursively).
- ``TeamStoreSource`` reads a team store the same way, its ``store.toml`` parsed here: the
  database through ``psycopg`` in read-only transactions, chunk objects through ``boto3``
  (``s3://bucket/prefix``) or from a shared directory.
"""

from __future__ import annotations

import os
import re
import sqlite3
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import MissingObject
from .codecs import ChunkRow, CodecRefused, decode_leaf
from .objects import is_object_id
from .sources import HEX_PREFIX, BadTarget, ObjectMeta, SourceError, Unreadable

DB_NAME = "nscas.db"


CONFIG_NAME = "store.toml"  # a team store: PostgreSQL + object storage


STORE_DIR = ".nscas"


ENV_VAR = "NSCAS_STORE"


CEILING_VAR = "NSCAS_CEILING_DIRECTORIES"  # the search upwards stops there (§5.1)


MIN_PREFIX = 8


_REF_NAME = re.compile(r"^[A-Za-z0-9._-]+(?:/[A-Za-z0-9._-]+)*$")


def _is_store(path: Path) -> bool:
    return (path / DB_NAME).is_file() or (path / CONFIG_NAME).is_file()


def find_store_dir(path: Path | None = None) -> Path:
    """The store directory: ``path`` (a store, a directory holding ``.nscas``, or a team
    store's ``store.toml``), else ``$NSCAS_STORE``, else ``.nscas`` here or in a parent, up to
    the nearest ceiling of ``$NSCAS_CEILING_DIRECTORIES`` (searched, never gone above)."""
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
    ceilings = _ceilings()
    for directory in (here, *here.parents):
        if _is_store(directory / STORE_DIR):
            return directory / STORE_DIR
        if directory in ceilings:
            raise SourceError("store", f"no nscas store in {here} or its parents up to "
                                       f"{directory} (the ceiling {CEILING_VAR} sets); pass "
                                       "--store or a bundle directory")
    raise SourceError("store", f"no nscas store in {here} or any parent directory; pass --store "
                               "or a bundle directory")


def _ceilings() -> frozenset[Path]:
    """``$NSCAS_CEILING_DIRECTORIES``: absolute directories split on ``os.pathsep``, resolved
    (an empty or relative entry ignored)."""
    entries = os.environ.get(CEILING_VAR, "").split(os.pathsep)
    return frozenset(Path(e).resolve() for e in entries if e and os.path.isabs(e))


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
            # Since schema 0006 a delta's base is in objects.base; before, there are no deltas.
            self.has_bases = self._db.execute("SELECT 1 FROM pragma_table_info('objects') "
                                              "WHERE name = 'base'").fetchone() is not None
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
        base = "base" if self.has_bases else "NULL"
        rows = self._query(f"SELECT size, {self._sha256}, kind, storage, codec, data, created, "
                           f"{base} FROM objects WHERE id = ?", (hex_id,))
        return rows[0] if rows else None

    def chunk_row(self, hex_id: str) -> ChunkRow | None:
        row = self._row(hex_id)
        if row is None:
            return None
        return ChunkRow(id=hex_id, size=row[0], storage=row[3], codec=row[4], base=row[7])

    def chunk_head(self, hex_id: str, n: int) -> bytes:
        return self._stored(hex_id, n - 1)[0][:n]

    def chunk_bytes(self, hex_id: str, limit: int) -> tuple[bytes, str]:
        return self._stored(hex_id, limit)

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
            if codec != "raw" or row[7] is not None:  # docs/format.md §5.5.1
                raise CodecRefused(f"blake3:{hex_id}", "unknown-codec", f"an inline leaf is "
                                   f"always raw with no base, this row says codec {codec!r}, "
                                   f"base {row[7]!r}")
            yield bytes(data)
        elif storage == "file":
            yield decode_leaf(self, ChunkRow(id=hex_id, size=row[0], storage=storage,
                                             codec=codec, base=row[7]))
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

    def _stored(self, hex_id: str, limit: int) -> tuple[bytes, str]:
        """At most ``limit + 1`` of a leaf's stored bytes, and where they were read."""
        return _read_chunk_file(self.root / "data", hex_id, limit)

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
                return "blake3:" + str(rows[0][0])
        match = HEX_PREFIX.fullmatch(text)
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
        return "blake3:" + str(rows[0][0])

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


def _read_chunk_file(data: Path, hex_id: str, limit: int) -> tuple[bytes, str]:
    path = data / hex_id[:2] / hex_id[2:]
    try:
        with path.open("rb") as stream:
            return stream.read(limit + 1), f"chunk file {path}"
    except FileNotFoundError:
        raise Unreadable(f"blake3:{hex_id}", f"chunk file {path} is missing",
                         missing=True) from None
    except OSError as exc:
        raise Unreadable(f"blake3:{hex_id}", f"chunk file {path} cannot be read "
                         f"({exc.strerror or exc})", missing=False) from None


_S3_KEYS = {"endpoint_url", "region", "access_key_id", "secret_access_key"}
_CONFIG_KEYS = {"database", "objects", "s3"}


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
            self._pg = psycopg.connect(self.config.database, autocommit=True, connect_timeout=10,
                                       options="-c default_transaction_read_only=on",
                                       application_name="nscas-verify")
            row = self._pg.execute("SELECT to_regclass('object_sha256')").fetchone()
            lazy = row[0] if row is not None else None
            self.has_bases = self._pg.execute(
                "SELECT 1 FROM information_schema.columns WHERE table_schema = "
                "current_schema() AND table_name = 'objects' AND column_name = 'base'"
            ).fetchone() is not None
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
        self._pg.close()

    def _query(self, sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        try:
            return self._pg.execute(sql.replace("?", "%s"), args, prepare=False).fetchall()
        except self._psycopg.Error as exc:
            raise SourceError(_redact(self.config.database),
                              f"cannot read the database: {_first_line(exc)}") from None

    def _stored(self, hex_id: str, limit: int) -> tuple[bytes, str]:
        if self._s3 is None:
            return _read_chunk_file(Path(self.config.objects) / "data", hex_id, limit)
        from botocore.exceptions import BotoCoreError, ClientError

        key = "/".join(p for p in (self._prefix, "data", hex_id[:2], hex_id[2:]) if p)
        where = f"chunk object s3://{self._bucket}/{key}"
        try:
            body = self._s3.get_object(Bucket=self._bucket, Key=key, Range=f"bytes=0-{limit}")
            return body["Body"].read(limit + 1), where
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code == "InvalidRange":  # an empty object has no byte 0
                return b"", where
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
