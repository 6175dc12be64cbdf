"""Reading a store: every read method of :class:`StoreReader`, through the one query layer
(nscas.database.queries over nscas.database.connections) on either engine.

Read-only commands (``log``, ``show``, ``lineage``, ``fsck``, ``cat``, ``export``) open a
:class:`StoreReader` and never import SQLAlchemy, whose import alone costs more than the 0.2 s
such a command may take. The writer, :class:`nscas.store.writer.Store`, inherits these reads; it
adds the writes (nscas.database.writes). This module never imports the writer:
nscas.store.opening picks one or the other.
"""

from __future__ import annotations

import io
import re
import sqlite3
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

from nscas.database import queries as q
from nscas.database.connections import Connection, Pool
from nscas.database.queries import BATCH, OUTPUTS, batches
from nscas.database.revision import (
    SchemaDifference,
    check_revision,
    database_error,
    schema_differences,
)
from nscas.database.rows import Link, Linked, LinkWay, ObjectInfo, RefEntry
from nscas.database.sqlite import SqliteEngine
from nscas.errors import (
    AmbiguousPrefix,
    CodecError,
    IntegrityError,
    InvalidInput,
    NotFound,
    StoreError,
)
from nscas.objects import canonical, codecs
from nscas.objects.chunks import ChunkBackend, ChunkFiles
from nscas.objects.codecs import Base
from nscas.objects.digests import Digest, DualHasher, blake3_hex, parse_prefix
from nscas.store.backends import chunk_backend
from nscas.store.chains import base_of, chain_depth, stored_chain
from nscas.store.config import StoreConfig, read_config
from nscas.store.locating import DB_NAME, HEXISH, REF_NAME, immutable_open_ok
from nscas.store.materialising import LeafReader, materialise
from nscas.store.protocol import UNREAD, Unread
from nscas.suggestions import did_you_mean

__all__ = ["BATCH", "OUTPUTS", "Link", "LinkWay", "Linked", "ObjectInfo", "RefEntry",
           "StoreReader", "batches"]

_UNREAD: Any = object()
# The writer's methods: asked of a reader, they fail as a read-only store's writes always did.
_WRITES = frozenset({"put_bytes", "put_record", "put_records", "put_file", "put_tree",
                     "put_whole", "put_stored", "ref_set", "delete_objects", "execute_raw", "work_area",
                     "release_work_area", "shared_tree", "unshare_tree"})


class StoreReader:
    """A store opened for reading. Thread-safe; any number of readers and writers may share it.

    Every method sees one committed state of the store: a method of one statement runs it
    alone (a statement is atomic on both engines), one of several statements reads in one
    transaction of its own (WAL, or PostgreSQL's REPEATABLE READ: a writer committing meanwhile
    changes nothing of what it sees). On PostgreSQL a transaction costs two round trips more
    (BEGIN, ROLLBACK), so the many small reads of ``log`` and ``lineage`` are single statements.
    """

    readonly = True  # the writer sets its own

    def __init__(self, root: Path, config: StoreConfig | None = _UNREAD, *,
                 chunks: ChunkBackend | None = None) -> None:
        """``config``: the store's ``store.toml`` as already read (None: an SQLite store), so
        that a command reads it once; left out, it is read here. ``chunks``: a team store's
        object storage as already opened for ``config`` (init_store checked it), so that its
        client is made once (an S3 client costs 0.1-0.3 s of CPU)."""
        self.root = root
        self.config = read_config(root) if config is _UNREAD else config
        """A team store's config (PostgreSQL + object storage); None for an SQLite store."""
        self.immutable = False
        """True when the database was opened ``immutable=1``: a read-only store without the
        ``-shm`` file that a WAL-mode read needs (see :func:`nscas.store.locating.immutable_open_ok`)."""
        if self.config is not None:
            self._open_team_store(self.config, chunks)
            return
        db = root / DB_NAME
        if not db.is_file():
            raise StoreError(f"{root} is not an nscas store (no {DB_NAME})")
        self.chunks: ChunkBackend = ChunkFiles(root)
        self._pool = Pool(SqliteEngine.reader(db, root))
        try:
            self._check_revision()
        except sqlite3.Error as exc:
            if not immutable_open_ok(root, exc):
                raise database_error(exc, root) from None
            self._pool = Pool(SqliteEngine.reader(db, root, immutable=True))
            self.immutable = True
            try:
                self._check_revision()
            except sqlite3.Error as again:
                raise database_error(again, root) from None

    def _open_team_store(self, config: StoreConfig, chunks: ChunkBackend | None) -> None:
        """PostgreSQL through psycopg (nscas.database.postgres), object data where the config
        says (``chunks``, when the caller has it open already)."""
        from nscas.database import postgres

        self.chunks = chunks if chunks is not None else chunk_backend(self.root, config)
        self._pool = Pool(postgres.PgEngine(config.database, self.root))
        c = self._pool.engine.connect()
        try:
            check_revision(c, self.root, postgres.schema_revision(c))
        except postgres.PgEngine.errors as exc:
            c.close()
            raise self._pool.engine.error(exc) from None
        except BaseException:
            c.close()
            raise
        self._pool.release(c)  # the first read's connection: one connect per command, not two

    def _share(self) -> None:
        """Read through the ``-shm`` file from now on (a writer of this process has created
        it): ``immutable=1`` is right only while nothing can write."""
        if self.immutable:
            self._pool.close()
            self._pool = Pool(SqliteEngine.reader(self.root / DB_NAME, self.root))
            self.immutable = False

    def _check_revision(self) -> None:
        """Refuse another schema version; raises SQLite's own error, for the caller to judge."""
        c = self._pool.engine.connect()
        try:
            c.execute("BEGIN")
            check_revision(c, self.root)
        finally:
            c.close()

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> NoReturn:
        if name in _WRITES:
            raise StoreError(f"store opened read-only: {name} needs open_store(readonly=False)")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @contextmanager
    def _read(self, *, snapshot: bool = True) -> Iterator[Connection]:
        """A connection inside a read transaction (``snapshot=False``: a read of one
        statement, which needs none); the database's errors become the store's, in one line."""
        with self._pool.read(snapshot=snapshot) as c:
            yield c

    # ----------------------------------------------------------------- lookups

    def has(self, oid: Digest) -> bool:
        with self._read(snapshot=False) as c:
            return q.has(c, oid.hex)

    def info(self, oid: Digest) -> ObjectInfo:
        with self._read(snapshot=False) as c:
            found = q.info(c, oid.hex)
        if found is None:
            raise NotFound(str(oid))
        return found

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
                rows = q.lazy_sha256_after(c, last, 2000)
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
            rows = q.ids_with_prefix(c, prefix, 11)
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
            data = b"".join(self.read_leaf(*leaf) for leaf in q.leaves(c, oid.hex))
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
                rows = q.records_of(c, batch)
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
        todo = list(batches(list(dict.fromkeys(d.hex for d in ids)), BATCH))
        if not todo:
            return kinds_, records
        with self._read(snapshot=len(todo) > 1) as c:
            for batch in todo:
                for hex_id, kind, storage, data in q.kinds_with_data(c, batch, wanted):
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
        return io.BufferedReader(LeafReader(self, oid), buffer_size=1 << 20)

    def leaves(self, oid: Digest) -> Iterator[tuple[Digest, str, bytes | None, int, Digest | None]]:
        """(ID, codec, inline data or None, recorded size) of an object's leaves in order."""
        with self._read() as c:
            yield from q.leaves(c, oid.hex)

    def read_leaf(self, oid: Digest, codec: str, inline: bytes | None, size: int,
                  base: Digest | Unread | None = UNREAD) -> bytes:
        """A leaf's plain bytes, checked against its ID; a chunk decodes to at most ``size``
        (its row's) bytes, whatever its stored bytes claim. ``base``: the base its row names,
        as ``leaves`` gives it (then no further statement is needed for a leaf that is not a
        delta); left out, it is read from the row."""
        if inline is not None:
            got = blake3_hex(inline)
            if got != oid.hex:
                raise IntegrityError(f"object {oid}", str(oid), f"blake3:{got}")
            return inline
        return self.chunks.read(oid, codec, size, base=self.leaf_base(oid, codec, row_base=base))

    def leaf_base(self, oid: Digest, codec: str, *,
                  arriving: tuple[Digest | None, int] | None = None,
                  row_base: Digest | Unread | None = UNREAD) -> Base | None:
        """The base of a leaf in ``codec`` (None unless a delta), once its chain passes every
        check of docs/format.md §5.5.1 on the rows, before any byte is decoded: the base its
        row names, or for a leaf not stored yet (a transfer brings it) ``arriving`` = (the
        base it names, its plain size). The base's bytes load, checked against its ID, only
        when the decoder asks for them."""
        codecs.check_known(oid, codec)
        if not codecs.is_delta(codec):
            other = (arriving[0] if arriving is not None
                     else self._row_base(oid) if isinstance(row_base, Unread) else row_base)
            if other is not None:  # a base column on a leaf of another codec: forged
                raise CodecError(oid, f"no base for a {codec} leaf", f"base {other}",
                                 problem="bad-base")
            return None
        with self._read() as c:
            found = stored_chain(c, oid, arriving)
        return base_of(self, found[0], found[1], found[2])

    def _row_base(self, oid: Digest) -> Digest | None:
        with self._read(snapshot=False) as c:
            row = q.delta_row(c, oid.hex)
        return Digest(row.base) if row is not None and row.base is not None else None

    def chain_depth(self, oid: Digest) -> int:
        """How many deltas deep a stored leaf is (0: not a delta); a broken chain is a
        :class:`CodecError`."""
        with self._read() as c:
            return chain_depth(c, oid)

    def materialise(self, oid: Digest, dest: Path) -> None:
        """Write a blob to a new file, or a tree/1 to a new (or empty) directory; never
        overwrite (nscas.store.materialising)."""
        materialise(self, oid, dest)

    def part_ids(self, oid: Digest) -> list[tuple[int, Digest]]:
        """(offset, part ID) of an object stored as parts; empty for other objects."""
        return [(off, part) for _, off, part in self.part_rows(oid)]

    def part_rows(self, oid: Digest) -> list[tuple[int, int, Digest]]:
        with self._read(snapshot=False) as c:
            rows = q.part_rows(c, oid.hex)
        return [(idx, off, Digest(part)) for idx, off, part in rows]

    # -------------------------------------------------------------------- refs

    def ref_get(self, name: str) -> Digest | None:
        with self._read(snapshot=False) as c:
            target = q.ref_target(c, name)
        return Digest(target) if target else None

    def ref_list(self, prefix: str = "") -> list[tuple[str, Digest]]:
        with self._read(snapshot=False) as c:
            rows = q.refs(c, prefix)
        return [(name, Digest(target)) for name, target in rows]

    def ref_log(self, name: str | None = None, limit: int | None = None) -> list[RefEntry]:
        with self._read(snapshot=False) as c:
            return q.ref_log(c, name, limit)

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
        todo = [d.hex for d in out.links]
        size: int | None = None
        while todo:
            with self._read(snapshot=False) as c:
                size = size or q.link_batch(c, way)
                batch, todo = todo[:size], todo[size:]
                rows = q.links(c, batch, way, limit, ends)
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

    def closure(self, roots: Iterable[Digest], *, with_parts: bool = False,
                with_bases: bool | None = None) -> set[Digest]:
        """Every object reachable from ``roots`` through links (and parts and the delta bases
        of leaves, if asked: ``with_bases`` defaults to ``with_parts``)."""
        seen: set[str] = set()
        frontier = [d.hex for d in roots]
        with self._read() as c:
            while frontier:
                batch, frontier = frontier[:BATCH], frontier[BATCH:]
                new = [h for h in batch if h not in seen]
                seen.update(new)
                if new:
                    frontier.extend(k for k in q.children(c, new, with_parts=with_parts,
                                                          with_bases=with_bases)
                                    if k not in seen)
        return {Digest(h) for h in seen}

    def log(self, *, kind: str | None = None, limit: int = 20, before: int | None = None) -> list[ObjectInfo]:
        """Records, newest first."""
        with self._read(snapshot=False) as c:
            return q.log(c, kind=kind, limit=limit, before=before)

    # ------------------------------------------------------------ maintenance

    def iter_objects(self, batch: int = 2000) -> Iterator[ObjectInfo]:
        last = 0
        while True:
            # A statement per batch: a long walk (fsck, gc) does not pin one WAL snapshot.
            with self._read(snapshot=False) as c:
                rows = q.objects_after(c, last, batch)
            if not rows:
                return
            last = rows[-1][0]
            yield from (found for _, found in rows)

    def inline_data(self, oid: Digest) -> bytes | None:
        with self._read(snapshot=False) as c:
            return q.inline_data(c, oid.hex)

    def schema_differences(self) -> list[SchemaDifference]:
        """How the store's tables, indexes and triggers differ from what the migrations create."""
        with self._read() as c:
            if c.dialect == "postgresql":
                from nscas.database import pgschema

                return pgschema.schema_differences(c)
            return schema_differences(c)  # type: ignore[arg-type]

    def counts(self) -> dict[str, int]:
        with self._read() as c:
            return q.counts(c)
