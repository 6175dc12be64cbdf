"""Reading a store: every query that changes nothing, on the standard library's ``sqlite3``.

Read-only commands (``log``, ``show``, ``lineage``, ``fsck``, ``cat``, ``export``) open a
:class:`StoreReader` and never import SQLAlchemy, whose import alone costs more than the 0.2 s
such a command may take. The writer, :class:`nscas.store.writer.Store`, inherits these reads, so each
query exists once; it adds the writes (SQLAlchemy Core, migrations, the gc bypass). This module
never imports the writer: nscas.store.opening picks one or the other.
"""

from __future__ import annotations

import errno
import io
import os
import re
import sqlite3
import threading
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Literal, NamedTuple, NoReturn

from nscas.database.revision import (
    SchemaDifference,
    check_revision,
    database_error,
    schema_differences,
)
from nscas.errors import (
    AmbiguousPrefix,
    DestinationExists,
    IntegrityError,
    InvalidInput,
    NoSpace,
    NotFound,
    StoreError,
)
from nscas.objects import canonical
from nscas.objects.chunks import ChunkBackend, ChunkFiles
from nscas.objects.digests import Digest, DualHasher, blake3_hex, parse_prefix
from nscas.store.config import chunk_backend, read_config
from nscas.store.locating import BUSY_TIMEOUT_MS, DB_NAME, HEXISH, REF_NAME, store_writable
from nscas.suggestions import did_you_mean

# ObjectInfo's columns: a SHA-256 left out at put time comes from object_sha256 once recorded.
_INFO = ("id, size, COALESCE(sha256, (SELECT s.sha256 FROM object_sha256 s WHERE s.id = objects.id)),"
         " kind, storage, codec, stored_size, created")
BATCH = 500  # IDs per IN (...) list, well under SQLite's bound on parameters
_UNION_BATCH = 100  # SELECTs per UNION ALL, well under SQLite's bound of 500 terms
OUTPUTS = "substr(path, 1, 9) = '$.outputs'"
"""The links that name a run's outputs, exactly as the partial index ``ix_links_outputs``
(migration 0005) is defined: a query that names it so reads that index, on both engines."""
# The writer's methods: asked of a reader, they fail as a read-only store's writes always did.
_WRITES = frozenset({"put_bytes", "put_record", "put_records", "put_file", "put_tree",
                     "put_whole", "ref_set", "delete_objects", "execute_raw", "work_area",
                     "release_work_area"})


class ObjectInfo(NamedTuple):
    id: Digest
    size: int
    sha256: str | None
    """None while unknown: a tensor object put without it (docs/format.md §1.2); ask
    ``sha256()``, which computes it (and, on a writer, records it)."""
    kind: str | None  # record kind, or None for a blob
    storage: str
    codec: str
    stored_size: int
    created: float


class RefEntry(NamedTuple):
    name: str
    old: Digest | None
    new: Digest
    at: float
    message: str


class Link(NamedTuple):
    parent: Digest
    path: str
    child: Digest


LinkWay = Literal["from", "to", "outputs"]
"""Which links of an object: its own (to its children), those to it (from its parents), or those
to it from ``$.outputs`` paths (the receipts of the runs that made it)."""


class Linked(NamedTuple):
    """Links of some IDs with what is at their other ends (:meth:`StoreReader.linked`)."""

    links: dict[Digest, list[Link]]
    """Each asked ID's links, in the order its way reads them."""
    kinds: dict[Digest, str | None]
    """The kind (None: a blob) of each stored object at a link's other end."""
    records: dict[Digest, dict[str, Any]]
    """The records among those ends of the kinds asked for."""


class StoreReader:
    """A store opened for reading. Thread-safe; any number of readers and writers may share it.

    Every method sees one committed state of the store: a method of one statement runs it
    alone (a statement is atomic on both engines), one of several statements reads in one
    transaction of its own (WAL, or PostgreSQL's REPEATABLE READ: a writer committing meanwhile
    changes nothing of what it sees). On PostgreSQL a transaction costs two round trips more
    (BEGIN, ROLLBACK), so the many small reads of ``log`` and ``lineage`` are single statements.
    """

    readonly = True  # the writer sets its own

    def __init__(self, root: Path) -> None:
        self.root = root
        self.config = read_config(root)
        """A team store's config (PostgreSQL + object storage); None for an SQLite store."""
        self._idle: list[Any] = []  # connections not in use, for reuse
        self._pool_lock = threading.Lock()
        self._closed = False
        self.immutable = False
        """True when the database was opened ``immutable=1``: a read-only store without the
        ``-shm`` file that a WAL-mode read needs (see :func:`_immutable_open`)."""
        self._errors: tuple[type[BaseException], ...] = (sqlite3.Error,)
        self._pg: Any = None  # nscas.database.postgres, for a team store
        if self.config is not None:
            self._open_team_store()
            return
        db = root / DB_NAME
        if not db.is_file():
            raise StoreError(f"{root} is not an nscas store (no {DB_NAME})")
        self._uri = f"{db.absolute().as_uri()}?mode=ro"
        self.chunks: ChunkBackend = ChunkFiles(root)
        try:
            try:
                self._check_revision()
            except sqlite3.Error as exc:
                if not _immutable_open(root, exc):
                    raise database_error(exc, root) from None
                self._uri += "&immutable=1"
                self.immutable = True
                try:
                    self._check_revision()
                except sqlite3.Error as again:
                    raise database_error(again, root) from None
        except BaseException:
            self._close_reads()  # not close(): a subclass's own resources do not exist yet
            raise

    def _open_team_store(self) -> None:
        """PostgreSQL through libpq directly (nscas.database.postgres), object data where the config
        says."""
        from nscas.database import postgres

        assert self.config is not None
        self._pg = postgres
        self._errors = postgres.ERRORS
        self.chunks = chunk_backend(self.root, self.config)
        c = self._connect()
        try:
            check_revision(c, self.root, postgres.schema_revision(c))
        except BaseException:
            c.close()
            raise
        self._release(c)  # the first read's connection: one connect per command, not two

    def _database_error(self, exc: BaseException) -> StoreError:
        if self._pg is not None:
            return self._pg.database_error(exc, self.root, self.config.database)
        return database_error(exc, self.root)  # type: ignore[arg-type]

    def _share(self) -> None:
        """Read through the ``-shm`` file from now on (a writer of this process has created
        it): ``immutable=1`` is right only while nothing can write."""
        if self.immutable:
            self._uri = self._uri.removesuffix("&immutable=1")
            self.immutable = False
            with self._pool_lock:
                idle, self._idle = self._idle, []
            for c in idle:
                c.close()

    def _check_revision(self) -> None:
        """Refuse another schema version; raises SQLite's own error, for the caller to judge."""
        c = self._connect()
        try:
            c.execute("BEGIN")
            check_revision(c, self.root)
        finally:
            c.close()

    def _connect(self) -> Any:
        if self._pg is not None:
            return self._pg.connect(self.config.database, self.root)
        # Autocommit mode, so that BEGIN is the transaction; the timeout is SQLite's busy
        # timeout (a reader waits only for a WAL checkpoint or recovery, if at all).
        return sqlite3.connect(self._uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000,
                               isolation_level=None, check_same_thread=False)

    def close(self) -> None:
        self._close_reads()

    def _close_reads(self) -> None:
        with self._pool_lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> NoReturn:
        if name in _WRITES:
            raise StoreError(f"store opened read-only: {name} needs open_store(readonly=False)")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @contextmanager
    def _read(self, *, snapshot: bool = True) -> Iterator[sqlite3.Connection]:
        """A connection inside a deferred read transaction, returned to the pool afterwards;
        ``snapshot=False`` for a read of one statement, which needs no transaction.

        A pool rather than one connection per thread: a generator (``leaves``) may hold its
        transaction open while the same thread runs other reads.

        SQLite's errors (a table dropped by hand, a full disk) become the store's, in one line.
        """
        with self._pool_lock:
            c = self._idle.pop() if self._idle else None
        try:
            if c is None:
                c = self._connect()
            if snapshot:
                c.execute("BEGIN")
            yield c
        except self._errors as exc:
            raise self._database_error(exc) from None
        finally:
            if c is not None:
                self._release(c)

    def _release(self, c: Any) -> None:
        if c.in_transaction:
            try:
                c.rollback()
            except self._errors:  # a connection the server closed: not one to reuse
                c.close()
                return
        with self._pool_lock:
            keep = not self._closed
            if keep:
                self._idle.append(c)
        if not keep:
            c.close()

    # ----------------------------------------------------------------- lookups

    def has(self, oid: Digest) -> bool:
        with self._read(snapshot=False) as c:
            return c.execute("SELECT 1 FROM objects WHERE id = ?", (oid.hex,)).fetchone() is not None

    def info(self, oid: Digest) -> ObjectInfo:
        with self._read(snapshot=False) as c:
            row = c.execute(f"SELECT {_INFO} FROM objects WHERE id = ?", (oid.hex,)).fetchone()
        if row is None:
            raise NotFound(str(oid))
        return _info(row)

    def sha256(self, oid: Digest) -> str:
        """The object's SHA-256: as recorded, else computed from its bytes (checked against
        the ID). A reader records nothing; the writer records what it computes."""
        known = self.info(oid).sha256
        return known if known is not None else self._compute_sha256(oid)

    def _compute_sha256(self, oid: Digest) -> str:
        h = DualHasher()
        with self.open(oid) as f:  # checks every leaf and the whole against the ID
            while block := f.read(1 << 20):
                h.update(block)
        return h.sha256()

    def lazy_sha256(self) -> Iterator[tuple[Digest, str]]:
        """(ID, SHA-256) of every object whose SHA-256 was recorded after its put."""
        last = ""
        while True:
            with self._read(snapshot=False) as c:
                rows = c.execute("SELECT id, sha256 FROM object_sha256 WHERE id > ? ORDER BY id"
                                 " LIMIT 2000", (last,)).fetchall()
            if not rows:
                return
            last = rows[-1][0]
            yield from ((Digest(h), sha) for h, sha in rows)

    def resolve(self, text_: str) -> Digest:
        """A full ID, a ref name, or a unique prefix of at least 8 hex digits, exactly as given:
        surrounding whitespace is refused, as everywhere IDs are parsed."""
        if text_ != text_.strip() or not text_:
            raise InvalidInput(f"invalid object ID or ref name {text_!r}: "
                               + ("empty" if not text_.strip() else "surrounding whitespace"))
        if text_.startswith("blake3:") and len(text_) == 71:
            oid = Digest.parse(text_)
            if not self.has(oid):
                raise NotFound(str(oid))
            return oid
        if REF_NAME.fullmatch(text_) and not HEXISH.fullmatch(text_):
            target = self.ref_get(text_)
            if target is None:
                hint = ("; ID prefixes need at least 8 lowercase hex digits"
                        if re.fullmatch(r"(blake3:)?[0-9a-fA-F]{1,64}", text_)
                        else did_you_mean(text_, (name for name, _ in self.ref_list())))
                raise NotFound(f"ref {text_!r}{hint}")
            return target
        prefix = parse_prefix(text_)
        with self._read(snapshot=False) as c:
            rows = [r[0] for r in c.execute(
                "SELECT id FROM objects WHERE id >= ? AND id < ? ORDER BY id LIMIT 11",
                (prefix, prefix + "g"))]
        if not rows:
            target = self.ref_get(text_) if REF_NAME.fullmatch(text_) else None
            if target is not None:
                return target
            raise NotFound(f"object with ID prefix {prefix}")
        if len(rows) > 1:
            raise AmbiguousPrefix(prefix, [f"blake3:{r}" for r in rows])
        return Digest(rows[0])

    # ------------------------------------------------------------------- bytes

    def get_bytes(self, oid: Digest) -> bytes:
        """All bytes of an object, checked against its ID (never wrong bytes)."""
        with self._read() as c:
            data = b"".join(self.read_leaf(*leaf) for leaf in _leaves(c, oid.hex))
        got = blake3_hex(data)
        if got != oid.hex:
            raise IntegrityError(f"object {oid}", str(oid), f"blake3:{got}")
        return data

    def get_record(self, oid: Digest) -> dict[str, Any]:
        return self.get_records([oid])[oid]

    def get_records(self, ids: Iterable[Digest]) -> dict[Digest, dict[str, Any]]:
        """The decoded records of ``ids``, each checked against its ID: one statement per
        :data:`BATCH` IDs for records stored inline (as nearly all are), the others read as
        ``get_bytes`` reads. A missing ID is NotFound; a blob's is bad input, as in
        ``get_record``.

        The bytes are parsed strictly but not re-encoded: their BLAKE3 is their ID, and their
        canonical form was checked when they were stored (``put_record``, imports, pulls) and
        is checked again by ``fsck`` (the re-encoding was most of the time of a wide lineage)."""
        wanted = list(dict.fromkeys(ids))
        out: dict[Digest, dict[str, Any]] = {}
        for batch in batches([d.hex for d in wanted], BATCH):
            with self._read(snapshot=False) as c:
                rows = {r[0]: r[1:] for r in c.execute(
                    f"SELECT id, kind, storage, data FROM objects WHERE id IN ({_marks(batch)})",
                    batch)}
            for hex_id in batch:
                if hex_id not in rows:
                    raise NotFound(str(Digest(hex_id)))
                kind, storage, data = rows[hex_id]
                if kind is None:
                    raise InvalidInput(f"{Digest(hex_id)} is a blob, not a record")
                out[Digest(hex_id)] = self._record(hex_id, storage, data)
        return out

    def kinds_and_records(self, ids: Iterable[Digest], record_kinds: Collection[str]
                          ) -> tuple[dict[Digest, str | None], dict[Digest, dict[str, Any]]]:
        """:meth:`kinds_of` of ``ids`` and, read by the same statement, the records among them
        whose kind is one of ``record_kinds`` (as :meth:`get_records` decodes them): a walk
        that labels what it reaches (lineage) learns both in one round trip."""
        kinds_: dict[Digest, str | None] = {}
        records: dict[Digest, dict[str, Any]] = {}
        wanted = sorted(set(record_kinds))
        data_of = f"CASE WHEN kind IN ({_marks(wanted)}) THEN data END" if wanted else "NULL"
        todo = list(batches(list(dict.fromkeys(d.hex for d in ids)), BATCH))
        if not todo:
            return kinds_, records
        with self._read(snapshot=len(todo) > 1) as c:
            for batch in todo:
                rows = c.execute(f"SELECT id, kind, storage, {data_of} FROM objects "
                                 f"WHERE id IN ({_marks(batch)})", [*wanted, *batch]).fetchall()
                for hex_id, kind, storage, data in rows:
                    kinds_[Digest(hex_id)] = kind
                    if kind in wanted:
                        records[Digest(hex_id)] = self._record(hex_id, storage, data)
        return kinds_, records

    def _record(self, hex_id: str, storage: str, data: bytes | None) -> dict[str, Any]:
        if storage == "inline" and data is not None:
            return canonical.parse(self.read_leaf(Digest(hex_id), "raw", bytes(data), len(data)))
        return canonical.parse(self.get_bytes(Digest(hex_id)))

    def open(self, oid: Digest) -> BinaryIO:
        """A reader over an object's bytes, each leaf checked as it is read."""
        if not self.has(oid):  # fail at open, not at the first read
            raise NotFound(str(oid))
        return io.BufferedReader(_LeafReader(self, oid), buffer_size=1 << 20)

    def leaves(self, oid: Digest) -> Iterator[tuple[Digest, str, bytes | None, int]]:
        """(ID, codec, inline data or None, recorded size) of an object's leaves in order."""
        with self._read() as c:
            yield from _leaves(c, oid.hex)

    def read_leaf(self, oid: Digest, codec: str, inline: bytes | None, size: int) -> bytes:
        """A leaf's plain bytes, checked against its ID; a chunk decodes to at most ``size``
        (its row's) bytes, whatever its stored bytes claim."""
        if inline is not None:
            got = blake3_hex(inline)
            if got != oid.hex:
                raise IntegrityError(f"object {oid}", str(oid), f"blake3:{got}")
            return inline
        return self.chunks.read(oid, codec, size)

    def materialise(self, oid: Digest, dest: Path) -> None:
        """Write a blob to a new file, or a tree/1 to a new (or empty) directory; never
        overwrite."""
        info = self.info(oid)
        if dest.is_symlink() or dest.exists():
            empty = dest.is_dir() and not dest.is_symlink() and not any(dest.iterdir())
            if not (empty and info.kind == "tree/1"):
                raise DestinationExists(str(dest) if empty or not dest.is_dir()
                                        else f"{dest} (a directory that is not empty)")
        try:
            self._materialise(oid, info, dest)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise NoSpace(str(dest.parent)) from None
            raise

    def _materialise(self, oid: Digest, info: ObjectInfo, dest: Path) -> None:
        import tempfile  # only ``get`` needs it (3 ms of imports for every other read command)

        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".nscas-get-", dir=dest.parent))
        try:
            if info.kind == "tree/1":
                out = tmp / "tree"
                out.mkdir()
                record = self.get_record(oid)
                for rel, entry in sorted(record["entries"].items()):
                    target = out / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    self._write_blob(Digest.parse(entry["id"]), target)
            else:
                out = tmp / "blob"
                self._write_blob(oid, out)
            try:
                os.replace(out, dest)
            except OSError as exc:
                if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):  # filled meanwhile
                    raise DestinationExists(str(dest)) from None
                raise
        finally:
            import shutil  # only writing a directory out needs it

            shutil.rmtree(tmp, ignore_errors=True)

    def _write_blob(self, oid: Digest, target: Path) -> None:
        h = DualHasher()
        with target.open("wb") as f:
            for leaf in self.leaves(oid):
                chunk = self.read_leaf(*leaf)
                h.update(chunk)
                f.write(chunk)
        if h.digest() != oid:
            raise IntegrityError(f"object {oid}", str(oid), str(h.digest()))

    def part_ids(self, oid: Digest) -> list[tuple[int, Digest]]:
        """(offset, part ID) of an object stored as parts; empty for other objects."""
        with self._read(snapshot=False) as c:
            rows = c.execute('SELECT "offset", part_id FROM parts WHERE object_id = ? ORDER BY idx',
                             (oid.hex,)).fetchall()
        return [(off, Digest(part)) for off, part in rows]

    # -------------------------------------------------------------------- refs

    def ref_get(self, name: str) -> Digest | None:
        with self._read(snapshot=False) as c:
            row = c.execute("SELECT target FROM refs WHERE name = ?", (name,)).fetchone()
        return Digest(row[0]) if row and row[0] else None

    def ref_list(self, prefix: str = "") -> list[tuple[str, Digest]]:
        sql, args = "SELECT name, target FROM refs", ()
        if prefix:
            # Case-sensitive on both engines, as ref names are (SQLite's LIKE ignores ASCII case,
            # PostgreSQL's does not): the name's first characters equal the prefix exactly.
            sql, args = sql + " WHERE substr(name, 1, ?) = ?", (len(prefix), prefix)
        with self._read(snapshot=False) as c:
            rows = c.execute(sql, args).fetchall()
        # Sorted here, by code point: a PostgreSQL database's collation may order otherwise.
        return [(name, Digest(target)) for name, target in sorted(rows)]

    def ref_log(self, name: str | None = None, limit: int | None = None) -> list[RefEntry]:
        sql = "SELECT name, old, new, at, message FROM ref_log"
        args: list[Any] = []
        if name is not None:
            sql += " WHERE name = ?"
            args.append(name)
        sql += " ORDER BY seq DESC"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        with self._read(snapshot=False) as c:
            return [RefEntry(name=n, old=Digest(old) if old else None, new=Digest(new), at=at,
                             message=message) for n, old, new, at, message in c.execute(sql, args)]

    # ------------------------------------------------------------------- links

    def links_from(self, oid: Digest) -> list[Link]:
        return self.links_from_each([oid])[oid]

    def links_from_each(self, ids: Iterable[Digest]) -> dict[Digest, list[Link]]:
        """Each ID's links, by path: one statement per :data:`BATCH` IDs."""
        return self._links(ids, "from", None, None).links

    def links_to(self, oid: Digest, limit: int | None = None) -> list[Link]:
        """The links to ``oid``, by (parent, path); the first ``limit`` of them if given."""
        return self.links_to_each([oid], limit)[oid]

    def links_to_each(self, ids: Iterable[Digest], limit: int | None = None
                      ) -> dict[Digest, list[Link]]:
        """:meth:`links_to` of each ID, in one statement per 100 IDs (a UNION ALL of one
        limited SELECT each: a shared object's hundred thousand parents are not all read); on
        PostgreSQL one per :data:`BATCH` IDs, a LATERAL join doing the same."""
        return self._links(ids, "to", limit, None).links

    def output_links_to(self, ids: Iterable[Digest]) -> dict[Digest, list[Link]]:
        """The links to each ID whose path starts ``$.outputs`` (a receipt naming it among its
        outputs, and maybe a path such as ``$.outputsX`` of some other kind of record, for the
        caller to judge), by (parent, path): a lookup in ``ix_links_outputs``, however many
        other links the object has."""
        return self._links(ids, "outputs", None, None).links

    def linked(self, ids: Iterable[Digest], way: LinkWay, record_kinds: Collection[str], *,
               limit: int | None = None) -> Linked:
        """The links of ``way`` of each ID (``from``: :meth:`links_from_each`; ``to``:
        :meth:`links_to_each` with ``limit``; ``outputs``: :meth:`output_links_to`) and, read
        by the same statement, the kind of the object at each link's other end, with its
        record if that kind is one of ``record_kinds``: a walk learns a level's edges and
        what they reach in one round trip, not two. An end that is not stored (a damaged
        store) is left out of ``kinds``."""
        return self._links(ids, way, limit, sorted(set(record_kinds)))

    def _links(self, ids: Iterable[Digest], way: LinkWay, limit: int | None,
               ends: list[str] | None) -> Linked:
        out = Linked(links={d: [] for d in ids}, kinds={}, records={})
        end = "child" if way == "from" else "parent"
        columns, join, head = "l.parent, l.path, l.child", "", []
        if ends is not None:  # objects has no column named like one of links'
            data_of = f"CASE WHEN o.kind IN ({_marks(ends)}) THEN o.data END" if ends else "NULL"
            columns += f", o.id, o.kind, o.storage, {data_of}"
            join, head = f" LEFT JOIN objects AS o ON o.id = l.{end}", ends
        one = "SELECT parent, path, child FROM links WHERE child = {} ORDER BY parent, path"
        if limit is not None:
            one += f" LIMIT {int(limit)}"
        for batch in batches([d.hex for d in out.links],
                             _UNION_BATCH if way == "to" and self._pg is None else BATCH):
            args: list[str] = batch
            if way == "from":
                sql = (f"SELECT {columns} FROM links AS l{join} WHERE l.parent IN "
                       f"({_marks(batch)}) ORDER BY l.parent, l.path")
            elif way == "outputs":
                sql = (f"SELECT {columns} FROM links AS l{join} WHERE l.child IN "
                       f"({_marks(batch)}) AND {OUTPUTS} ORDER BY l.parent, l.path")
            elif self._pg is not None:
                # One LATERAL join over an array of the IDs (char(64), the column's type, so that
                # ix_links_child serves): PostgreSQL plans a UNION ALL of 100 SELECTs in ~20 ms
                # and this in under one. SQLite has no LATERAL; its UNION costs it nothing so.
                sql = (f"SELECT {columns} FROM unnest(CAST(? AS char(64)[])) AS k(id) CROSS JOIN "
                       f"LATERAL ({one.format('k.id')}) AS l{join} "
                       "ORDER BY l.child, l.parent, l.path")
                args = ["{" + ",".join(batch) + "}"]  # an array literal of hex IDs, one value
            else:
                union = " UNION ALL ".join(f"SELECT * FROM ({one.format('?')}) AS q{i}"
                                           for i in range(len(batch)))
                sql = (f"SELECT {columns} FROM ({union}) AS l{join} "
                       "ORDER BY l.child, l.parent, l.path")
            with self._read(snapshot=False) as c:
                rows = c.execute(sql, [*head, *args]).fetchall()
            for row in rows:
                link = Link(parent=Digest(row[0]), path=row[1], child=Digest(row[2]))
                out.links[link.parent if way == "from" else link.child].append(link)
                if ends is not None and row[3] is not None:
                    other = link.child if way == "from" else link.parent
                    out.kinds[other] = row[4]
                    if row[4] in ends:
                        out.records[other] = self._record(row[3], row[5], row[6])
        return out

    def kinds_of(self, ids: Iterable[Digest]) -> dict[Digest, str | None]:
        """The kind of each ID that is stored (None: a blob); IDs not stored are left out."""
        return self.kinds_and_records(ids, ())[0]

    def closure(self, roots: Iterable[Digest], *, with_parts: bool = False) -> set[Digest]:
        """Every object reachable from ``roots`` through links (and parts, if asked)."""
        seen: set[str] = set()
        frontier = [d.hex for d in roots]
        with self._read() as c:
            while frontier:
                batch, frontier = frontier[:BATCH], frontier[BATCH:]
                new = [h for h in batch if h not in seen]
                seen.update(new)
                if not new:
                    continue
                marks = _marks(new)
                kids = [r[0] for r in c.execute(
                    f"SELECT child FROM links WHERE parent IN ({marks})", new)]
                if with_parts:
                    kids += [r[0] for r in c.execute(
                        f"SELECT part_id FROM parts WHERE object_id IN ({marks})", new)]
                frontier.extend(k for k in kids if k not in seen)
        return {Digest(h) for h in seen}

    def log(self, *, kind: str | None = None, limit: int = 20, before: int | None = None) -> list[ObjectInfo]:
        """Records, newest first."""
        # `kind IS NOT NULL` as written lets SQLite use the partial indexes on records.
        sql = f"SELECT {_INFO} FROM objects WHERE kind IS NOT NULL"
        args: list[Any] = []
        if kind is not None:
            sql += " AND kind = ?"
            args.append(kind)
        if before is not None:
            sql += " AND seq < ?"
            args.append(before)
        with self._read(snapshot=False) as c:
            rows = c.execute(sql + " ORDER BY seq DESC LIMIT ?", (*args, limit)).fetchall()
        return [_info(r) for r in rows]

    # ------------------------------------------------------------ maintenance

    def iter_objects(self, batch: int = 2000) -> Iterator[ObjectInfo]:
        last = 0
        while True:
            # A statement per batch: a long walk (fsck, gc) does not pin one WAL snapshot.
            with self._read(snapshot=False) as c:
                rows = c.execute(f"SELECT seq, {_INFO} FROM objects WHERE seq > ? ORDER BY seq "
                                 "LIMIT ?", (last, batch)).fetchall()
            if not rows:
                return
            last = rows[-1][0]
            yield from (_info(r[1:]) for r in rows)

    def inline_data(self, oid: Digest) -> bytes | None:
        with self._read(snapshot=False) as c:
            row = c.execute("SELECT data FROM objects WHERE id = ?", (oid.hex,)).fetchone()
        return bytes(row[0]) if row is not None and row[0] is not None else None

    def part_rows(self, oid: Digest) -> list[tuple[int, int, Digest]]:
        with self._read(snapshot=False) as c:
            rows = c.execute('SELECT idx, "offset", part_id FROM parts WHERE object_id = ? '
                             "ORDER BY idx", (oid.hex,)).fetchall()
        return [(idx, off, Digest(part)) for idx, off, part in rows]

    def schema_differences(self) -> list[SchemaDifference]:
        """How the store's tables, indexes and triggers differ from what the migrations create."""
        with self._read() as c:
            if self._pg is not None:
                from nscas.database import pgschema

                return pgschema.schema_differences(c)
            return schema_differences(c)

    def counts(self) -> dict[str, int]:
        with self._read() as c:
            n = c.execute("SELECT count(*) FROM objects").fetchone()[0]
            r = c.execute("SELECT count(*) FROM objects WHERE kind IS NOT NULL").fetchone()[0]
            nrefs = c.execute("SELECT count(*) FROM refs").fetchone()[0]
        return {"objects": n, "records": r, "refs": nrefs}


class _LeafReader(io.RawIOBase):
    def __init__(self, store: StoreReader, oid: Digest) -> None:
        self._it = store.leaves(oid)
        self._store = store
        self._buf = b""
        self._pos = 0
        self._hasher = DualHasher()
        self._oid = oid
        self._done = False

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while self._pos >= len(self._buf):
            nxt = next(self._it, None)
            if nxt is None:
                if not self._done:
                    self._done = True
                    if self._hasher.digest() != self._oid:
                        raise IntegrityError(f"object {self._oid}", str(self._oid), str(self._hasher.digest()))
                return 0
            self._buf = self._store.read_leaf(*nxt)
            self._hasher.update(self._buf)
            self._pos = 0
        n = min(len(b), len(self._buf) - self._pos)
        b[:n] = self._buf[self._pos:self._pos + n]
        self._pos += n
        return n


def _immutable_open(root: Path, exc: sqlite3.Error) -> bool:
    """Whether a read-only open that failed with ``exc`` may be retried ``immutable=1``.

    A WAL-mode database is read through its ``-shm`` file, which SQLite creates when missing;
    on a read-only mount (or a full disk) it cannot. ``immutable=1`` reads the database file
    alone, with no locks: right only when no commit waits in the ``-wal`` file, and when no
    writer has it open (every writer holds the ``-shm`` file, so none exists). A ``-wal`` with
    commits in it is refused: read without them, the store would look older than it is.
    """
    if getattr(exc, "sqlite_errorname", "") not in ("SQLITE_CANTOPEN", "SQLITE_IOERR_SHMSIZE"):
        return False
    db = root / DB_NAME
    if Path(f"{db}-shm").exists():
        return False
    if getattr(exc, "sqlite_errorname", "") == "SQLITE_CANTOPEN" and store_writable(root):
        return False  # not for want of a -shm file
    wal = Path(f"{db}-wal")
    if wal.exists() and wal.stat().st_size > 0:
        raise StoreError(f"the store at {root} is read-only and commits wait in {wal.name}, which "
                         f"SQLite cannot read without {db.name}-shm; open the store once where it "
                         "is writable")
    return True


def _leaves(c: sqlite3.Connection, hex_id: str) -> Iterator[tuple[Digest, str, bytes | None, int]]:
    row = c.execute("SELECT storage, codec, data, size FROM objects WHERE id = ?",
                    (hex_id,)).fetchone()
    if row is None:
        raise NotFound(f"blake3:{hex_id}")
    storage, codec, data, size = row
    if storage == "inline":
        yield Digest(hex_id), codec, bytes(data), size
    elif storage == "file":
        yield Digest(hex_id), codec, None, size
    else:
        subs = [r[0] for r in c.execute(
            "SELECT part_id FROM parts WHERE object_id = ? ORDER BY idx", (hex_id,))]
        for sub in subs:
            yield from _leaves(c, sub)


def _info(row: tuple[Any, ...]) -> ObjectInfo:
    """An ObjectInfo from a row of the ``_INFO`` columns."""
    hex_id, size, sha256, kind, storage, codec, stored_size, created = row
    return ObjectInfo(id=Digest(hex_id), size=size, sha256=sha256, kind=kind, storage=storage,
                      codec=codec, stored_size=stored_size, created=created)


def _marks(items: list[str]) -> str:
    return ", ".join("?" * len(items))


def batches(items: list[str], n: int) -> Iterator[list[str]]:
    for i in range(0, len(items), n):
        yield items[i:i + n]
