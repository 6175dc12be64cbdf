"""The store's writes: puts, refs by compare-and-swap, gc deletes, store creation and upgrade.

Its reads it inherits from nscas.store.reading; its statements are nscas.database.writes's, run
through the same connections (nscas.database.connections) as the reads. SQLAlchemy serves only
the migrations that ``init_store`` runs (nscas.database.engines).
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from nscas.database import queries as q
from nscas.database import writes
from nscas.database.connections import Connection, Pool
from nscas.database.revision import known_revisions, newer_schema, refuse_newer
from nscas.database.sqlite import SqliteEngine
from nscas.errors import (
    ClosureError,
    InvalidInput,
    NoSpace,
    NotFound,
    ReadOnlyStore,
    RefConflict,
    StoreError,
    TagImmutable,
)
from nscas.objects import canonical, kinds
from nscas.objects.chunks import INLINE_MAX, ChunkBackend, ChunkFiles
from nscas.objects.digests import Digest, Readable, blake3_hex, sha256_hex
from nscas.objects.segments import LEAF_MAX, Segment, plan_segments
from nscas.store.backends import chunk_backend
from nscas.store.bases import Hints, hints_from, width_hints
from nscas.store.config import StoreConfig, read_config, render_config
from nscas.store.locating import (
    CONFIG_NAME,
    DB_NAME,
    STORE_DIR,
    check_ref_name,
    is_tag,
    store_writable,
)
from nscas.store.protocol import tree_record
from nscas.store.putting import Leaf, Putter
from nscas.store.reading import _UNREAD, Link, ObjectInfo, RefEntry, StoreReader
from nscas.store.workarea import WorkArea, WorkAreas

# The reads live in nscas.store.reading, which imports no SQLAlchemy; their names stay importable here.
# Opening a store (reader or writer) is nscas.store.opening's.
__all__ = ["DB_NAME", "STORE_DIR", "Link", "ObjectInfo", "RefEntry", "Store", "StoreReader",
           "check_ref_name", "init_store"]

_UNSET: Any = object()
_PUT_ATTEMPTS = 3  # a put retries when a concurrent gc removed an object it meant to reuse


class _LeavesVanished(StoreError):
    """A concurrent ``gc`` removed objects this put found stored and meant to reuse."""

    def __init__(self, ids: list[str]) -> None:
        super().__init__(f"{len(ids)} stored object(s) this put reused were removed by a "
                         f"concurrent gc (first: blake3:{ids[0]}); add it again")
        self.ids = ids


def init_store(path: Path, config: StoreConfig | None = None) -> Store:
    """Create (or upgrade) a store at ``path/.nscas``, or at ``path`` if it ends in ``.nscas``;
    with ``config``, a team store (PostgreSQL + object storage) whose ``store.toml`` goes there."""
    from nscas.database.engines import upgrade

    root = path if path.name == STORE_DIR else path / STORE_DIR
    if config is not None or (root / CONFIG_NAME).is_file():
        return _init_team_store(root, config)
    if (root / DB_NAME).is_file() and not store_writable(root):
        raise ReadOnlyStore(str(root))
    with _faults(root):
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise
            raise StoreError(f"cannot create a store at {root}: {exc.strerror}") from None
        if (root / DB_NAME).is_file():
            refuse_newer(root / DB_NAME, root)
        ChunkFiles(root).ensure()
        upgrade(root / DB_NAME)
    return Store(root, config=None)


def _init_team_store(root: Path, config: StoreConfig | None) -> Store:
    """Write (or keep) ``store.toml``, check the object storage, migrate the database."""
    from nscas.database import postgres
    from nscas.database.engines import upgrade_pg

    if (root / DB_NAME).is_file():
        raise InvalidInput(f"{root} holds an SQLite store already; a team store needs a directory "
                           "of its own")
    existing = read_config(root)
    if config is None:
        config = existing
    elif existing is not None and existing != config:
        raise InvalidInput(f"{root / CONFIG_NAME} names another database or object storage; "
                           "remove it first or use another directory")
    assert config is not None
    engine = postgres.PgEngine(config.database, root)
    c = engine.connect()  # unreachable, wrong password: one line
    try:
        rev = postgres.schema_revision(c)
    except engine.errors as exc:
        raise engine.error(exc) from None
    finally:
        c.close()
    if rev is not None and rev not in known_revisions():
        raise newer_schema(rev, root)
    chunks = chunk_backend(root, config)
    chunks.ensure()
    with _faults(root):
        upgrade_pg(config.database)
        root.mkdir(parents=True, exist_ok=True)
        if existing is None:
            tmp = root / f".{CONFIG_NAME}.tmp"
            tmp.write_text(render_config(config), encoding="utf-8")
            tmp.chmod(0o600)  # it may hold a password
            os.replace(tmp, root / CONFIG_NAME)
    return Store(root, config=config, chunks=chunks)


class Store(StoreReader):
    """A content-addressed store. Thread-safe for puts; many processes may share one.

    The reads (and the schema check at open) are :class:`StoreReader`'s; this class adds writes.
    """

    def __init__(self, root: Path, *, readonly: bool = False,
                 config: StoreConfig | None = _UNREAD, chunks: ChunkBackend | None = None) -> None:
        super().__init__(root, config, chunks=chunks)
        self.readonly = readonly
        if not readonly and not store_writable(root):
            self.close()
            raise ReadOnlyStore(str(root))
        # PostgreSQL: the reads' pool, whose BEGIN says read or write (one connection a
        # command); SQLite: connections of their own, opened for writing.
        self._writes = (self._pool if self.config is not None
                        else Pool(SqliteEngine.for_writes(root / DB_NAME, root)))
        if readonly or self.config is not None:  # PostgreSQL: the schema check connected
            return
        try:
            with _faults(root):
                self._writes.open()  # puts the database in WAL mode
        except BaseException:
            self.close()
            raise
        self._share()  # a reader opened immutable (a disk full a moment ago) reads shared now

    @contextmanager
    def _begin(self, *, gc: bool = False) -> Iterator[Connection]:
        """A write transaction (SQLite: BEGIN IMMEDIATE); the database's errors become the store's.

        On PostgreSQL writers run at once: each holds the gc lock shared, and ``gc`` (its
        deletes) holds it alone, as SQLite's one write lock would have it."""
        if self.readonly:
            raise StoreError("store opened read-only")
        with _faults(self.root), self._writes.write() as c:
            writes.lock_writers(c, gc=gc)
            yield c

    def close(self) -> None:
        super().close()  # read-only connections first: the writer's last close checkpoints the WAL
        writes = getattr(self, "_writes", None)  # None: closed before it was made
        if writes is not None:
            writes.close()

    def __enter__(self) -> Store:
        return self

    # -------------------------------------------------------------------- puts

    def put_bytes(self, data: bytes | bytearray | memoryview) -> Digest:
        view = memoryview(data)
        with _faults(self.root):
            return _retry_vanished(lambda: self._put_leaf(view, width_hints), lambda: None)

    def _put_leaf(self, data: memoryview, hints: Hints) -> Digest:
        putter = self._putter(hints)
        leaf = putter.leaf(data, putter.hint(Segment(offset=0, length=len(data)), 0, len(data)))
        self._insert([leaf], [], [])
        return Digest(leaf.hex)

    def put_stored(self, oid: Digest, codec: str, size: int, stored: bytes, *,
                   base: Digest | None) -> None:
        """A chunk-file leaf as another store keeps it (a push or pull brings it): its stored
        bytes in ``codec``, a delta's ``base`` already here. Checked like a read (codec, base,
        chain: docs/format.md §5.5.1), then decoded and re-hashed as it is written."""
        if not INLINE_MAX < size <= LEAF_MAX:
            raise InvalidInput(f"{oid}: a chunk-file leaf of {size} bytes (it must be "
                               f"{INLINE_MAX + 1} to {LEAF_MAX})")
        with _faults(self.root):
            delta = self.leaf_base(oid, codec, arriving=(base, size))
            if self.has(oid):
                return
            sha = self.chunks.write(oid, stored, codec, size=size, base=delta)
            self._insert([Leaf(hex=oid.hex, size=size, sha256=sha, storage="file", codec=codec,
                               stored_size=len(stored),
                               base=None if delta is None else delta.id.hex)], [], [])

    def put_record(self, value: dict[str, Any] | bytes) -> Digest:
        """Validate (canonical bytes, schema of the kind, closure) and store a record."""
        return self.put_records([value])[0]

    def put_records(self, values: Iterable[dict[str, Any] | bytes]) -> list[Digest]:
        """Validate and store many records in one transaction: all of them or none.

        A record may link to records earlier in the same batch (bulk imports, benchmarks).
        """
        leaves: list[Leaf] = []
        link_rows: list[dict[str, Any]] = []
        require: set[str] = set()
        for value in values:
            if isinstance(value, bytes | bytearray | memoryview):
                data = bytes(value)
                record = canonical.decode(data)
            else:
                record = value
                data = canonical.encode(value)
            kind = kinds.validate(record)
            hex_id = blake3_hex(data)
            leaves.append(Leaf(hex=hex_id, size=len(data), sha256=sha256_hex(data),
                               storage="inline", stored_size=len(data), data=data, kind=kind))
            for path, d in canonical.iter_links(record):
                link_rows.append({"parent": hex_id, "path": path, "child": d.hex})
                require.add(d.hex)
        if leaves:
            with _faults(self.root):
                self._insert(leaves, [], link_rows, require=require)
        return [Digest(leaf.hex) for leaf in leaves]

    def put_file(self, path: Path, *, base: Digest | None = None) -> Digest:
        """Stream a file into the store; safetensors files are cut at tensor boundaries. With
        ``base`` (a stored file: this one's earlier version) each new piece is also tried as a
        delta to the base's piece of the same tensor or place (docs/format.md §5.5.2)."""
        try:
            st = path.stat()
            f = path.open("rb")
        except FileNotFoundError:
            raise InvalidInput(f"no such file: {path}") from None
        except IsADirectoryError:
            raise InvalidInput(f"{path} is a directory; use put_tree") from None
        except PermissionError:
            raise InvalidInput(f"cannot read {path}: permission denied") from None
        with f:
            hints = width_hints if base is None else hints_from(self, base)
            segments = plan_segments(path, st.st_size)
            if segments is None:
                view = memoryview(f.read())
                with _faults(self.root):
                    return _retry_vanished(lambda: self._put_leaf(view, hints), lambda: None)
            with _faults(self.root):
                return _retry_vanished(lambda: self._put_segments(f, segments, hints),
                                       lambda: f.seek(0))

    def _put_segments(self, f: Readable, segments: list[Segment], hints: Hints) -> Digest:
        made = self._putter(hints).segments(f, segments)
        self._insert(made.leaves, made.part_rows, [])
        return Digest(made.hex)

    def _putter(self, hints: Hints = width_hints) -> Putter:
        return Putter(chunks=self.chunks, lookup=self._stored_leaf, hint=hints)

    def _stored_leaf(self, hex_id: str) -> Leaf | None:
        """The stored object with this ID, if it can be reused as it is.

        A chunk file or parts (the same bytes came in as a large file) both serve; a row of
        storage "file" whose chunk file is gone is not reused, so the caller rewrites the file.
        """
        # A read connection, as every read: a put looks up each of its pieces from worker
        # threads, and through SQLAlchemy a lookup took 7x the time (156 vs 21 us), all of it
        # holding the GIL the other threads need between their hash calls.
        with self._read(snapshot=False) as c:
            row = q.stored_leaf(c, hex_id)
        if row is None or (row.storage == "file" and not self.chunks.exists(Digest(hex_id))):
            return None
        return Leaf(hex=hex_id, size=row.size, sha256=row.sha256, storage=row.storage,
                    codec=row.codec, stored_size=row.stored_size, reused=True, base=row.base)

    def sha256(self, oid: Digest) -> str:
        """The object's SHA-256; one not known yet is computed from its bytes and recorded
        (``object_sha256``, insert-only), unless this store was opened read-only."""
        known = self.info(oid).sha256
        if known is not None:
            return known
        sha = self._compute_sha256(oid)
        if not self.readonly:
            with self._begin() as c:
                writes.record_sha256(c, oid.hex, sha)
        return sha

    def _insert(self, leaves: list[Leaf], part_rows: list[dict[str, Any]],
                link_rows: list[dict[str, Any]], require: Iterable[str] = ()) -> None:
        if self.readonly:
            raise StoreError("store opened read-only")
        now = time.time()
        rows = [(lf.hex, lf.size, lf.sha256, lf.kind, lf.storage, lf.codec, lf.stored_size,
                 lf.data, now, lf.base) for lf in leaves]
        for attempt in range(_PUT_ATTEMPTS):
            try:
                return self._insert_rows(rows, leaves, part_rows, link_rows, require)
            except self._writes.engine.retryable:  # PostgreSQL writers waiting on each other
                if attempt == _PUT_ATTEMPTS - 1:
                    raise

    def _insert_rows(self, rows: list[tuple[Any, ...]], leaves: list[Leaf],
                     part_rows: list[dict[str, Any]], link_rows: list[dict[str, Any]],
                     require: Iterable[str]) -> None:
        with self._begin() as c:
            needed = set(require) - {lf.hex for lf in leaves}
            if needed:
                missing = sorted(needed - q.present(c, needed))
                if missing:
                    raise ClosureError([f"blake3:{m}" for m in missing])
            # A reused object must still be stored now, inside this write transaction: a gc that
            # committed since the lookup may have removed it (and its chunk file). Inserting the
            # row again would name a chunk file that is gone.
            reused = {lf.hex for lf in leaves if lf.reused}
            if reused:
                vanished = sorted(reused - q.present(c, reused))
                if vanished:
                    raise _LeavesVanished(vanished)
            # Parts before their parents, links after their record: insert order = dependency order.
            if rows:
                writes.insert_objects(c, rows)
            if part_rows:
                writes.insert_parts(c, part_rows)
            if link_rows:
                writes.insert_links(c, link_rows)

    def put_whole(self, oid: Digest, part_list: list[tuple[int, Digest]], *,
                  sha256: str | None) -> None:
        """An object stored as parts this store already holds (a push or pull brings one): the
        caller has checked ``oid`` against the parts' bytes in order (nscas.remotes.transfer). The parts
        must tile the object from offset 0, each where the one before ends."""
        if not part_list:
            raise InvalidInput(f"{oid}: an object of parts needs at least one part")
        sizes = {d: self.info(d).size for _, d in part_list}  # NotFound for an absent part
        end = 0
        for off, d in part_list:
            if off != end:
                raise InvalidInput(f"{oid}: part {d} at offset {off}, expected {end}")
            end += sizes[d]
        leaf = Leaf(hex=oid.hex, size=end, sha256=sha256, storage="parts")
        rows = [{"object_id": oid.hex, "idx": i, "offset": off, "part_id": d.hex}
                for i, (off, d) in enumerate(part_list)]
        with _faults(self.root):
            self._insert([leaf], rows, [], require={d.hex for _, d in part_list})

    def put_tree(self, path: Path, *, base: Digest | None = None) -> Digest:
        """A directory as a tree/1 record of its regular files (links are refused). With
        ``base`` (a stored tree/1) each file is put with the base's file of the same path as
        its base, where there is one."""
        if not path.is_dir():
            raise InvalidInput(f"no such directory: {path}")
        theirs: dict[str, Digest] = {}
        if base is not None:
            record = self.get_record(base)
            if record.get("nscas") != "tree/1":
                raise InvalidInput(f"{base} is a {record.get('nscas')} record; a tree's delta "
                                   "base is a tree/1")
            theirs = {rel: Digest.parse(e["id"]) for rel, e in record["entries"].items()}
        files: dict[str, Digest] = {}
        for file in sorted(_walk(path)):
            rel = file.relative_to(path).as_posix()
            files[rel] = self.put_file(file, base=theirs.get(rel))
        return self.put_record(tree_record(self, files))

    # -------------------------------------------------------------------- refs

    def ref_set(self, name: str, target: Digest, *, expect: Digest | None = _UNSET,
                message: str = "") -> None:
        """Point ``name`` at ``target``; with ``expect``, only if it still holds that value."""
        check_ref_name(name)
        now = time.time()
        with self._begin() as c:
            writes.lock_ref(c, name)  # compare-and-swap: one writer of this ref at a time
            if not q.has(c, target.hex):
                raise NotFound(str(target))
            old_hex = q.ref_target(c, name)
            old = Digest(old_hex) if old_hex else None
            if expect is not _UNSET and expect != old:
                raise RefConflict(name, str(expect) if expect else None, str(old) if old else None)
            if old == target:
                return
            if is_tag(name) and old is not None:
                raise TagImmutable(name, str(old))
            writes.set_ref(c, name, old_hex, target.hex, at=now, message=message)

    # -------------------------------------------------------------- work areas

    def work_area(self, action: Digest, *, action_claimed: bool = False) -> WorkArea:
        """Hold the work area of ``action`` (``work/<hex>/``) for this process: its persistent
        directory survives a crash, for a later run of the action to resume from; its scratch
        directory starts empty. Raises ``WorkAreaBusy`` while a live process holds it (or one
        on another host, unless ``action_claimed``: this process holds the action's claim)."""
        if self.readonly:
            raise StoreError("store opened read-only")
        with _faults(self.root):
            return WorkAreas(self.root).claim(action, action_claimed=action_claimed)

    def release_work_area(self, area: WorkArea, *, keep: bool) -> None:
        """End the hold: scratch goes; the persistent directory stays only with ``keep``."""
        WorkAreas(self.root).release(area, keep=keep)

    def shared_tree(self, area: WorkArea, tree: Digest) -> Path:
        """The tree/1 ``tree`` materialised once under ``work/shared/``, read-only, for every
        run that reads it from files (``area``'s, kept while that area is)."""
        return WorkAreas(self.root).shared_tree(area, tree, lambda dest: self.materialise(tree, dest))

    def unshare_tree(self, area: WorkArea, tree: Digest) -> None:
        """``area``'s run is done with the shared ``tree``: removed unless another run's area
        still uses it."""
        WorkAreas(self.root).unshare(area, tree)

    # ------------------------------------------------------------ maintenance

    def delete_objects(self, ids: list[Digest], *,
                       files_before: float | None = None) -> list[Digest]:
        """Remove objects, their parts and links, inside one gc transaction (triggers allow it).

        The caller chose ``ids`` before this transaction began; a put that committed since may
        have made some of them parts or children of its new objects. Those stay, with all they
        reach. Chunk files go after the commit, only those last written before ``files_before``
        (a put may be writing the same bytes afresh). Returns the IDs actually removed.
        """
        doomed = {d.hex for d in ids}
        with self._begin(gc=True) as c:
            doomed -= writes.rescued(c, doomed)
            gone = sorted(doomed)
            writes.delete_objects(c, gone)
        removed = [Digest(h) for h in gone]
        for d in removed:
            self.chunks.remove(d, before=files_before)
        return removed

    def execute_raw(self, sql: str) -> None:
        """For tests of the database's own guards only (the driver's own errors come out)."""
        c = self._writes.engine.connect()
        try:
            self._writes.engine.begin(c, write=True)
            c.execute(sql)
            c.execute("COMMIT")
        finally:
            c.close()


@contextmanager
def _faults(root: Path) -> Iterator[None]:
    """The store's own errors for a full disk and a read-only mount, each one line naming the
    store (the database's errors are the connection pool's to say)."""
    try:
        yield
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise NoSpace(str(root)) from None
        if exc.errno == errno.EROFS:
            raise ReadOnlyStore(str(root)) from None
        raise


def _retry_vanished(put: Callable[[], Digest], rewind: Callable[[], object]) -> Digest:
    """Run a put again if a concurrent gc removed objects it reused: they are gone now, so the
    next attempt writes those bytes afresh."""
    for _ in range(_PUT_ATTEMPTS - 1):
        try:
            return put()
        except _LeavesVanished:
            rewind()
    return put()


def _walk(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in dirnames:
            if (Path(dirpath) / name).is_symlink():
                raise InvalidInput(f"{Path(dirpath) / name} is a symbolic link; nscas stores regular files only")
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if p.is_symlink() or not p.is_file():
                raise InvalidInput(f"{p} is not a regular file; nscas stores regular files only")
            yield p
