"""The store: the only module with queries. Objects, records, links, refs and their log."""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import blake3
from sqlalchemy import Connection, delete, func, insert, select, text
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from nscas import canonical, kinds
from nscas.chunks import INLINE_MAX, ChunkFiles, Segment, plan_segments, split_ranges
from nscas.db import check_revision, make_engine, refuse_unknown_revision, upgrade
from nscas.digests import Digest, DualHasher, blake3_hex, parse_prefix, sha256_hex
from nscas.errors import (
    AmbiguousPrefix,
    ClosureError,
    DestinationExists,
    IntegrityError,
    InvalidInput,
    NotFound,
    RefConflict,
    StoreError,
    TagImmutable,
)
from nscas.schema import gc_session, links, objects, parts, ref_log, refs

STORE_DIR = ".nscas"
DB_NAME = "nscas.db"
ENV_VAR = "NSCAS_STORE"
_REF = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*(/[A-Za-z0-9_][A-Za-z0-9._-]*)*")
_HEXISH = re.compile(r"(blake3:)?[0-9a-f]{8,}")
_UNSET: Any = object()
_PUT_ATTEMPTS = 3  # a put retries when a concurrent gc removed an object it meant to reuse


@dataclass(frozen=True, slots=True, kw_only=True)
class ObjectInfo:
    id: Digest
    size: int
    sha256: str
    kind: str | None  # record kind, or None for a blob
    storage: str
    codec: str
    stored_size: int
    created: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RefEntry:
    name: str
    old: Digest | None
    new: Digest
    at: float
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    parent: Digest
    path: str
    child: Digest


@dataclass(slots=True)
class _Leaf:
    """An object about to be stored: rows are inserted after every chunk file is durable."""

    hex: str
    size: int
    sha256: str
    storage: str
    codec: str = "raw"
    stored_size: int = 0
    data: bytes | None = None
    kind: str | None = None
    reused: bool = False  # already stored: its row must still be there when this put commits


@dataclass(slots=True)
class _SplitHash:
    """Hashes of a tensor stored as several pieces; SHA-256 only once it is known to be new."""

    b3: Any = field(default_factory=blake3.blake3)
    sha: Any = None  # hashlib.sha256() when needed


class _LeavesVanished(StoreError):
    """A concurrent ``gc`` removed objects this put found stored and meant to reuse."""

    def __init__(self, ids: list[str]) -> None:
        super().__init__(f"{len(ids)} stored object(s) this put reused were removed by a "
                         f"concurrent gc (first: blake3:{ids[0]}); add it again")
        self.ids = ids


def find_store(start: Path | None = None) -> Path:
    """The store directory: ``$NSCAS_STORE``, else ``.nscas`` here or in a parent."""
    env = os.environ.get(ENV_VAR)
    if env:
        return store_dir_of(Path(env))
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / STORE_DIR / DB_NAME).is_file():
            return d / STORE_DIR
    raise StoreError("no nscas store here or in any parent directory (run 'nscas init' or pass --store)")


def store_dir_of(path: Path) -> Path:
    """Accept either a store directory or a directory holding ``.nscas``."""
    if (path / DB_NAME).is_file():
        return path
    if (path / STORE_DIR / DB_NAME).is_file():
        return path / STORE_DIR
    raise StoreError(f"{path} is not an nscas store (no {DB_NAME} in it or in {path / STORE_DIR})")


def init_store(path: Path) -> Store:
    """Create (or upgrade) a store at ``path/.nscas``, or at ``path`` if it ends in ``.nscas``."""
    root = path if path.name == STORE_DIR else path / STORE_DIR
    root.mkdir(parents=True, exist_ok=True)
    if (root / DB_NAME).is_file():
        refuse_unknown_revision(make_engine(root / DB_NAME, readonly=True, writer=False), root)
    ChunkFiles(root).ensure()
    upgrade(root / DB_NAME)
    return Store(root)


def open_store(path: Path | None = None, *, readonly: bool = False) -> Store:
    return Store(store_dir_of(path) if path is not None else find_store(), readonly=readonly)


class Store:
    """A content-addressed store. Thread-safe for puts; many processes may share one."""

    def __init__(self, root: Path, *, readonly: bool = False) -> None:
        self.root = root
        self.readonly = readonly
        db = root / DB_NAME
        if not db.is_file():
            raise StoreError(f"{root} is not an nscas store (no {DB_NAME})")
        self._writer = make_engine(db, readonly=readonly, writer=True)
        self._reader = make_engine(db, readonly=readonly, writer=False)
        check_revision(self._reader, root)
        self.chunks = ChunkFiles(root)
        self._lock = threading.Lock()

    def close(self) -> None:
        self._writer.dispose()
        self._reader.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- lookups

    def has(self, oid: Digest) -> bool:
        with self._reader.connect() as c:
            return c.execute(select(objects.c.seq).where(objects.c.id == oid.hex)).first() is not None

    def info(self, oid: Digest) -> ObjectInfo:
        with self._reader.connect() as c:
            row = c.execute(select(objects).where(objects.c.id == oid.hex)).first()
        if row is None:
            raise NotFound(str(oid))
        return _info(row)

    def resolve(self, text_: str) -> Digest:
        """A full ID, a ref name, or a unique prefix of at least 8 hex digits."""
        text_ = text_.strip()
        if text_.startswith("blake3:") and len(text_) == 71:
            oid = Digest.parse(text_)
            if not self.has(oid):
                raise NotFound(str(oid))
            return oid
        if _REF.fullmatch(text_) and not _HEXISH.fullmatch(text_):
            target = self.ref_get(text_)
            if target is None:
                hint = ("; ID prefixes need at least 8 lowercase hex digits"
                        if re.fullmatch(r"(blake3:)?[0-9a-fA-F]{1,64}", text_) else "")
                raise NotFound(f"ref {text_!r}{hint}")
            return target
        prefix = parse_prefix(text_)
        with self._reader.connect() as c:
            rows = c.execute(
                select(objects.c.id)
                .where(objects.c.id >= prefix, objects.c.id < prefix + "g")
                .order_by(objects.c.id)
                .limit(11)
            ).scalars().all()
        if not rows:
            target = self.ref_get(text_) if _REF.fullmatch(text_) else None
            if target is not None:
                return target
            raise NotFound(f"object with ID prefix {prefix}")
        if len(rows) > 1:
            raise AmbiguousPrefix(prefix, [f"blake3:{r}" for r in rows])
        return Digest(rows[0])

    # ------------------------------------------------------------------- reads

    def get_bytes(self, oid: Digest) -> bytes:
        """All bytes of an object, checked against its ID (never wrong bytes)."""
        with self._reader.connect() as c:
            data = self._read(c, oid.hex)
        got = blake3_hex(data)
        if got != oid.hex:
            raise IntegrityError(f"object {oid}", str(oid), f"blake3:{got}")
        return data

    def get_record(self, oid: Digest) -> dict[str, Any]:
        info = self.info(oid)
        if info.kind is None:
            raise InvalidInput(f"{oid} is a blob, not a record")
        return canonical.decode(self.get_bytes(oid))

    def open(self, oid: Digest) -> BinaryIO:
        """A reader over an object's bytes, each leaf checked as it is read."""
        if not self.has(oid):  # fail at open, not at the first read
            raise NotFound(str(oid))
        return io.BufferedReader(_LeafReader(self, oid), buffer_size=1 << 20)

    def leaves(self, oid: Digest) -> Iterator[tuple[str, str, bytes | None]]:
        """(hex, codec, inline data or None) of an object's leaves in order."""
        with self._reader.connect() as c:
            yield from self._leaves(c, oid.hex)

    def read_leaf(self, hex_id: str, codec: str, inline: bytes | None) -> bytes:
        if inline is not None:
            got = blake3_hex(inline)
            if got != hex_id:
                raise IntegrityError(f"object blake3:{hex_id}", f"blake3:{hex_id}", f"blake3:{got}")
            return inline
        return self.chunks.read(hex_id, codec)

    def _leaves(self, c: Connection, hex_id: str) -> Iterator[tuple[str, str, bytes | None]]:
        row = c.execute(
            select(objects.c.storage, objects.c.codec, objects.c.data).where(objects.c.id == hex_id)
        ).first()
        if row is None:
            raise NotFound(f"blake3:{hex_id}")
        if row.storage == "inline":
            yield hex_id, row.codec, bytes(row.data)
        elif row.storage == "file":
            yield hex_id, row.codec, None
        else:
            subs = c.execute(
                select(parts.c.part_id).where(parts.c.object_id == hex_id).order_by(parts.c.idx)
            ).scalars().all()
            for sub in subs:
                yield from self._leaves(c, sub)

    def _read(self, c: Connection, hex_id: str) -> bytes:
        return b"".join(self.read_leaf(h, codec, data) for h, codec, data in self._leaves(c, hex_id))

    def materialise(self, oid: Digest, dest: Path) -> None:
        """Write a blob to a new file, or a tree/1 to a new directory; never overwrite."""
        if dest.exists() or dest.is_symlink():
            raise DestinationExists(str(dest))
        dest.parent.mkdir(parents=True, exist_ok=True)
        info = self.info(oid)
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
            os.replace(out, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _write_blob(self, oid: Digest, target: Path) -> None:
        h = DualHasher()
        with target.open("wb") as f:
            for hex_id, codec, data in self.leaves(oid):
                chunk = self.read_leaf(hex_id, codec, data)
                h.update(chunk)
                f.write(chunk)
        if h.digest() != oid:
            raise IntegrityError(f"object {oid}", str(oid), str(h.digest()))

    # -------------------------------------------------------------------- puts

    def put_bytes(self, data: bytes | bytearray | memoryview) -> Digest:
        view = memoryview(data)
        return _retry_vanished(lambda: self._put_leaf(view), lambda: None)

    def _put_leaf(self, data: memoryview) -> Digest:
        leaf = self._make_leaf(data)
        self._insert([leaf], [], [])
        return Digest(leaf.hex)

    def put_record(self, value: dict[str, Any] | bytes) -> Digest:
        """Validate (canonical bytes, schema of the kind, closure) and store a record."""
        return self.put_records([value])[0]

    def put_records(self, values: Iterable[dict[str, Any] | bytes]) -> list[Digest]:
        """Validate and store many records in one transaction: all of them or none.

        A record may link to records earlier in the same batch (bulk imports, benchmarks).
        """
        leaves: list[_Leaf] = []
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
            leaves.append(_Leaf(hex=hex_id, size=len(data), sha256=sha256_hex(data),
                                storage="inline", stored_size=len(data), data=data, kind=kind))
            for path, d in canonical.iter_links(record):
                link_rows.append({"parent": hex_id, "path": path, "child": d.hex})
                require.add(d.hex)
        if leaves:
            self._insert(leaves, [], link_rows, require=require)
        return [Digest(leaf.hex) for leaf in leaves]

    def put_file(self, path: Path) -> Digest:
        """Stream a file into the store; safetensors files are cut at tensor boundaries."""
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
            segments = plan_segments(path, st.st_size)
            if segments is None:
                data = f.read()
                return self.put_bytes(data)
            return _retry_vanished(lambda: self._put_segments(f, segments), lambda: f.seek(0))

    def _put_segments(self, f: BinaryIO, segments: list[Segment]) -> Digest:
        # One thread per hash: the put runs four threads already, and BLAKE3's own pool
        # (max_threads=AUTO) only adds CPU time for its hand-offs when no core is idle.
        whole = blake3.blake3()
        whole_sha = hashlib.sha256()
        size = 0
        plan: list[tuple[Segment, list[tuple[int, Future[_Leaf]]], _SplitHash | None]] = []
        # Per piece: its leaf (hashed, looked up, maybe written) and its SHA-256 updates, which
        # one thread of their own applies in file order.
        pending: deque[tuple[Future[Any], ...]] = deque()
        # Two workers make leaves (BLAKE3, lookup; for new bytes SHA-256, compression, durable
        # write) while the whole file's SHA-256, the longest single chain of work, runs on its
        # own thread and this one reads and computes the file's BLAKE3. At most `window` pieces
        # are in flight, so memory stays bounded.
        window = 3
        # `window` read buffers, reused in turn: a fresh 32 MiB bytes object per piece left freed
        # memory in glibc's per-thread arenas, so peak RSS grew with thread timing. Piece n goes
        # into slot n % window, whose previous piece (n - window) is done once fewer than
        # `window` pieces are pending. (On an error the pools' shutdown waits for every task, so
        # no thread reads a buffer after this function returns.)
        slots = [bytearray() for _ in range(window)]
        n = 0
        with (ThreadPoolExecutor(max_workers=2, thread_name_prefix="nscas-put") as pool,
              ThreadPoolExecutor(max_workers=1, thread_name_prefix="nscas-sha") as sha_pool):
            for seg in segments:
                ranges = (split_ranges(seg.length) if seg.tensor is not None
                          else [(0, seg.length)])
                split = _SplitHash() if len(ranges) > 1 else None
                subs: list[tuple[int, Future[_Leaf]]] = []
                for off, length in ranges:
                    while len(pending) >= window:
                        for task in pending.popleft():
                            task.result()
                    if len(slots[n % window]) < length:
                        slots[n % window] = bytearray(length)
                    buf = memoryview(slots[n % window])[:length]
                    n += 1
                    if _read_exactly(f, buf) != length:
                        raise StoreError("file changed size while it was being added")
                    tasks: list[Future[Any]] = [sha_pool.submit(whole_sha.update, buf)]
                    whole.update(buf)
                    size += length
                    leaf = pool.submit(self._make_leaf, buf)
                    if split is not None:
                        split.b3.update(buf)
                        # A large tensor whose first piece is already stored is most likely
                        # stored whole: skip its SHA-256 (the row has it). A new first piece
                        # means new bytes, whose SHA-256 is needed.
                        if off == 0 and not leaf.result().reused:
                            split.sha = hashlib.sha256()
                        if split.sha is not None:
                            tasks.append(sha_pool.submit(split.sha.update, buf))
                    pending.append((leaf, *tasks))
                    subs.append((off, leaf))
                plan.append((seg, subs, split))
            if f.read(1):
                raise StoreError("file grew while it was being added")
        leaves: list[_Leaf] = []
        part_rows: list[dict[str, Any]] = []
        top: list[tuple[int, str]] = []
        for seg, subs, split in plan:
            done = [(off, fut.result()) for off, fut in subs]
            leaves.extend(leaf for _, leaf in done)
            if split is None:
                top.append((seg.offset, done[0][1].hex))
                continue
            seg_hex = split.b3.hexdigest()
            part_rows += [{"object_id": seg_hex, "idx": i, "offset": off, "part_id": leaf.hex}
                          for i, (off, leaf) in enumerate(done)]
            if split.sha is not None:
                sha = split.sha.hexdigest()
            else:
                sha = self._segment_sha256(f, seg, seg_hex)
            leaves.append(_Leaf(hex=seg_hex, size=seg.length, sha256=sha, storage="parts"))
            top.append((seg.offset, seg_hex))
        whole_hex = whole.hexdigest()
        if not (len(top) == 1 and top[0][1] == whole_hex):  # a one-part file is that part
            part_rows += [{"object_id": whole_hex, "idx": i, "offset": off, "part_id": hex_}
                          for i, (off, hex_) in enumerate(top)]
            leaves.append(_Leaf(hex=whole_hex, size=size, sha256=whole_sha.hexdigest(),
                                storage="parts"))
        self._insert(leaves, part_rows, [])
        return Digest(whole_hex)

    def _segment_sha256(self, f: BinaryIO, seg: Segment, hex_id: str) -> str:
        """The SHA-256 of a large tensor whose SHA-256 the put skipped: from its row if it is
        stored, else read again from the file (and checked to be the bytes first read)."""
        with self._reader.connect() as c:
            sha = c.execute(select(objects.c.sha256).where(objects.c.id == hex_id)).scalar()
        if sha is not None:
            return sha
        at = f.tell()
        f.seek(seg.offset)
        h = DualHasher()
        buf = bytearray(4 << 20)
        view = memoryview(buf)
        while h.size < seg.length:
            got = _read_exactly(f, view[:min(len(buf), seg.length - h.size)])
            if not got:
                break
            h.update(view[:got])
        f.seek(at)
        if h.digest().hex != hex_id or h.size != seg.length:
            raise StoreError("file changed while it was being added")
        return h.sha256()

    def _make_leaf(self, data: memoryview) -> _Leaf:
        """Hash, look up, and only for new bytes compute SHA-256, compress and write durably.

        BLAKE3 comes first because it names the leaf: bytes the store already holds (most
        tensors of a second checkpoint) then cost one hash pass and one lookup, their SHA-256
        coming from the row.
        """
        hex_id = blake3.blake3(data).hexdigest()  # one thread: two workers already run
        if len(data) <= INLINE_MAX:
            return _Leaf(hex=hex_id, size=len(data), sha256=sha256_hex(data), storage="inline",
                         stored_size=len(data), data=bytes(data))
        known = self._stored_leaf(hex_id)
        if known is not None:
            return known
        sha = sha256_hex(data)
        codec, stored = self.chunks.encode(data)
        self.chunks.write(hex_id, stored, codec)
        return _Leaf(hex=hex_id, size=len(data), sha256=sha, storage="file", codec=codec,
                     stored_size=len(stored))

    def _stored_leaf(self, hex_id: str) -> _Leaf | None:
        """The stored object with this ID, if it can be reused as it is.

        A chunk file or parts (the same bytes came in as a large file) both serve; a row of
        storage "file" whose chunk file is gone is not reused, so the caller rewrites the file.
        """
        with self._reader.connect() as c:
            row = c.execute(select(objects.c.size, objects.c.sha256, objects.c.storage,
                                   objects.c.codec, objects.c.stored_size)
                            .where(objects.c.id == hex_id)).first()
        if row is None or (row.storage == "file" and not self.chunks.exists(hex_id)):
            return None
        return _Leaf(hex=hex_id, size=row.size, sha256=row.sha256, storage=row.storage,
                     codec=row.codec, stored_size=row.stored_size, reused=True)

    def _insert(self, leaves: list[_Leaf], part_rows: list[dict[str, Any]],
                link_rows: list[dict[str, Any]], require: Iterable[str] = ()) -> None:
        if self.readonly:
            raise StoreError("store opened read-only")
        now = time.time()
        rows = [{"id": lf.hex, "size": lf.size, "sha256": lf.sha256, "kind": lf.kind,
                 "storage": lf.storage, "codec": lf.codec, "stored_size": lf.stored_size,
                 "data": lf.data, "created": now} for lf in leaves]
        with self._writer.begin() as c:
            needed = set(require) - {lf.hex for lf in leaves}
            if needed:
                missing = sorted(needed - _present(c, needed))
                if missing:
                    raise ClosureError([f"blake3:{m}" for m in missing])
            # A reused object must still be stored now, inside this write transaction: a gc that
            # committed since the lookup may have removed it (and its chunk file). Inserting the
            # row again would name a chunk file that is gone.
            reused = {lf.hex for lf in leaves if lf.reused}
            if reused:
                vanished = sorted(reused - _present(c, reused))
                if vanished:
                    raise _LeavesVanished(vanished)
            # Parts before their parents, links after their record: insert order = dependency order.
            if rows:
                c.execute(sqlite_insert(objects).on_conflict_do_nothing(index_elements=["id"]), rows)
            if part_rows:
                c.execute(sqlite_insert(parts).on_conflict_do_nothing(), part_rows)
            if link_rows:
                c.execute(sqlite_insert(links).on_conflict_do_nothing(), link_rows)

    def put_tree(self, path: Path) -> Digest:
        """A directory as a tree/1 record of its regular files (links are refused)."""
        if not path.is_dir():
            raise InvalidInput(f"no such directory: {path}")
        entries: dict[str, dict[str, Any]] = {}
        for file in sorted(_walk(path)):
            rel = file.relative_to(path).as_posix()
            oid = self.put_file(file)
            info = self.info(oid)
            entries[rel] = {"id": str(oid), "size": info.size, "sha256": info.sha256}
        return self.put_record({"nscas": "tree/1", "entries": entries})

    def put_checkpoint(self, hf_dir: Path, *, step: int, parent: Digest | None,
                       extra: dict[str, Any] | None = None) -> Digest:
        """An HF model directory as checkpoint/1 with its params/1 digest (SPEC 4)."""
        from nscas.checkpoints import params_record

        weights = sorted(hf_dir.glob("*.safetensors"))
        if not weights:
            raise InvalidInput(f"{hf_dir} holds no *.safetensors weights")
        tree = self.put_tree(hf_dir)
        entries = self.get_record(tree)["entries"]
        files = [Digest.parse(entries[w.relative_to(hf_dir).as_posix()]["id"]) for w in weights]
        params = self.put_record(params_record(self, files))
        record: dict[str, Any] = {"nscas": "checkpoint/1", "files": str(tree), "params": str(params),
                                  "step": step, "parent": str(parent) if parent else None}
        for key, value in (extra or {}).items():
            if key in record:
                raise InvalidInput(f"checkpoint member {key!r} is set by nscas")
            record[key] = value
        return self.put_record(record)

    def part_ids(self, oid: Digest) -> list[tuple[int, Digest]]:
        """(offset, part ID) of an object stored as parts; empty for other objects."""
        with self._reader.connect() as c:
            rows = c.execute(select(parts.c.offset, parts.c.part_id)
                             .where(parts.c.object_id == oid.hex).order_by(parts.c.idx)).all()
        return [(r.offset, Digest(r.part_id)) for r in rows]

    # -------------------------------------------------------------------- refs

    def ref_get(self, name: str) -> Digest | None:
        with self._reader.connect() as c:
            target = c.execute(select(refs.c.target).where(refs.c.name == name)).scalar()
        return Digest(target) if target else None

    def ref_set(self, name: str, target: Digest, *, expect: Digest | None = _UNSET,
                message: str = "") -> None:
        """Point ``name`` at ``target``; with ``expect``, only if it still holds that value."""
        check_ref_name(name)
        now = time.time()
        with self._writer.begin() as c:
            if c.execute(select(objects.c.seq).where(objects.c.id == target.hex)).first() is None:
                raise NotFound(str(target))
            old_hex = c.execute(select(refs.c.target).where(refs.c.name == name)).scalar()
            old = Digest(old_hex) if old_hex else None
            if expect is not _UNSET and expect != old:
                raise RefConflict(name, str(expect) if expect else None, str(old) if old else None)
            if old == target:
                return
            if name.startswith("tags/") and old is not None:
                raise TagImmutable(name, str(old))
            if old is None:
                c.execute(insert(refs).values(name=name, target=target.hex, updated=now))
            else:
                c.execute(refs.update().where(refs.c.name == name).values(target=target.hex, updated=now))
            c.execute(insert(ref_log).values(name=name, old=old_hex, new=target.hex, at=now, message=message))

    def ref_list(self, prefix: str = "") -> list[tuple[str, Digest]]:
        with self._reader.connect() as c:
            q = select(refs.c.name, refs.c.target).order_by(refs.c.name)
            if prefix:
                q = q.where(refs.c.name.startswith(prefix, autoescape=True))
            return [(r.name, Digest(r.target)) for r in c.execute(q)]

    def ref_log(self, name: str | None = None, limit: int | None = None) -> list[RefEntry]:
        with self._reader.connect() as c:
            q = select(ref_log).order_by(ref_log.c.seq.desc())
            if name is not None:
                q = q.where(ref_log.c.name == name)
            if limit is not None:
                q = q.limit(limit)
            return [RefEntry(name=r.name, old=Digest(r.old) if r.old else None, new=Digest(r.new),
                             at=r.at, message=r.message) for r in c.execute(q)]

    # ------------------------------------------------------------------- links

    def links_from(self, oid: Digest) -> list[Link]:
        with self._reader.connect() as c:
            rows = c.execute(select(links).where(links.c.parent == oid.hex).order_by(links.c.path)).all()
        return [Link(parent=oid, path=r.path, child=Digest(r.child)) for r in rows]

    def links_to(self, oid: Digest, limit: int | None = None) -> list[Link]:
        with self._reader.connect() as c:
            q = select(links).where(links.c.child == oid.hex).order_by(links.c.parent, links.c.path)
            if limit is not None:
                q = q.limit(limit)
            rows = c.execute(q).all()
        return [Link(parent=Digest(r.parent), path=r.path, child=oid) for r in rows]

    def kinds_of(self, ids: Iterable[Digest]) -> dict[Digest, str | None]:
        out: dict[Digest, str | None] = {}
        with self._reader.connect() as c:
            for batch in _batches([d.hex for d in ids], 500):
                for r in c.execute(select(objects.c.id, objects.c.kind).where(objects.c.id.in_(batch))):
                    out[Digest(r.id)] = r.kind
        return out

    def closure(self, roots: Iterable[Digest], *, with_parts: bool = False) -> set[Digest]:
        """Every object reachable from ``roots`` through links (and parts, if asked)."""
        seen: set[str] = set()
        frontier = [d.hex for d in roots]
        with self._reader.connect() as c:
            while frontier:
                batch, frontier = frontier[:500], frontier[500:]
                new = [h for h in batch if h not in seen]
                seen.update(new)
                if not new:
                    continue
                kids = c.execute(select(links.c.child).where(links.c.parent.in_(new))).scalars().all()
                if with_parts:
                    kids += c.execute(select(parts.c.part_id).where(parts.c.object_id.in_(new))).scalars().all()
                frontier.extend(k for k in kids if k not in seen)
        return {Digest(h) for h in seen}

    def log(self, *, kind: str | None = None, limit: int = 20, before: int | None = None) -> list[ObjectInfo]:
        """Records, newest first."""
        with self._reader.connect() as c:
            q = select(objects).where(objects.c.kind.is_not(None))
            if kind is not None:
                q = q.where(objects.c.kind == kind)
            if before is not None:
                q = q.where(objects.c.seq < before)
            rows = c.execute(q.order_by(objects.c.seq.desc()).limit(limit)).all()
        return [_info(r) for r in rows]

    # ------------------------------------------------------------ maintenance

    def iter_objects(self, batch: int = 2000) -> Iterator[ObjectInfo]:
        last = 0
        while True:
            with self._reader.connect() as c:
                rows = c.execute(select(objects).where(objects.c.seq > last)
                                 .order_by(objects.c.seq).limit(batch)).all()
            if not rows:
                return
            last = rows[-1].seq
            yield from (_info(r) for r in rows)

    def inline_data(self, oid: Digest) -> bytes | None:
        with self._reader.connect() as c:
            data = c.execute(select(objects.c.data).where(objects.c.id == oid.hex)).scalar()
        return bytes(data) if data is not None else None

    def part_rows(self, oid: Digest) -> list[tuple[int, int, Digest]]:
        with self._reader.connect() as c:
            rows = c.execute(select(parts.c.idx, parts.c.offset, parts.c.part_id)
                             .where(parts.c.object_id == oid.hex).order_by(parts.c.idx)).all()
        return [(r.idx, r.offset, Digest(r.part_id)) for r in rows]

    def counts(self) -> dict[str, int]:
        with self._reader.connect() as c:
            n = c.execute(select(func.count()).select_from(objects)).scalar() or 0
            r = c.execute(select(func.count()).select_from(objects).where(objects.c.kind.is_not(None))).scalar() or 0
            nrefs = c.execute(select(func.count()).select_from(refs)).scalar() or 0
        return {"objects": n, "records": r, "refs": nrefs}

    def delete_objects(self, ids: list[Digest], *,
                       files_before: float | None = None) -> list[Digest]:
        """Remove objects, their parts and links, inside one gc transaction (triggers allow it).

        The caller chose ``ids`` before this transaction began; a put that committed since may
        have made some of them parts or children of its new objects. Those stay, with all they
        reach. Chunk files go after the commit, only those last written before ``files_before``
        (a put may be writing the same bytes afresh). Returns the IDs actually removed.
        """
        doomed = {d.hex for d in ids}
        with self._writer.begin() as c:
            doomed -= _rescued(c, doomed)
            gone = sorted(doomed)
            c.execute(insert(gc_session).values(token=1))
            for batch in _batches(gone, 500):
                c.execute(delete(links).where(links.c.parent.in_(batch)))
                c.execute(delete(parts).where(parts.c.object_id.in_(batch)))
            # Parts may be shared: delete objects only once nothing still points at them.
            for batch in _batches(gone, 500):
                c.execute(delete(objects).where(objects.c.id.in_(batch)))
            c.execute(delete(gc_session))
        for h in gone:
            self.chunks.remove(h, before=files_before)
        return [Digest(h) for h in gone]

    def execute_raw(self, sql: str) -> None:
        """For tests of the database's own guards only."""
        with self._writer.begin() as c:
            c.execute(text(sql))


class _LeafReader(io.RawIOBase):
    def __init__(self, store: Store, oid: Digest) -> None:
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


def _read_exactly(f: BinaryIO, buf: memoryview) -> int:
    """Fill ``buf`` from ``f``; fewer bytes only at end of file."""
    got = 0
    while got < len(buf):
        n = f.readinto(buf[got:])
        if not n:
            break
        got += n
    return got


def check_ref_name(name: str) -> None:
    if not _REF.fullmatch(name) or ".." in name or len(name) > 255:
        raise InvalidInput(
            f"invalid ref name {name!r}: use letters, digits, '.', '_', '-' in '/'-separated parts"
        )
    if _HEXISH.fullmatch(name):
        raise InvalidInput(f"invalid ref name {name!r}: it would read as an object ID prefix")


def _info(row: Any) -> ObjectInfo:
    return ObjectInfo(id=Digest(row.id), size=row.size, sha256=row.sha256, kind=row.kind,
                      storage=row.storage, codec=row.codec, stored_size=row.stored_size,
                      created=row.created)


def _retry_vanished(put: Callable[[], Digest], rewind: Callable[[], object]) -> Digest:
    """Run a put again if a concurrent gc removed objects it reused: they are gone now, so the
    next attempt writes those bytes afresh."""
    for _ in range(_PUT_ATTEMPTS - 1):
        try:
            return put()
        except _LeavesVanished:
            rewind()
    return put()


def _present(c: Connection, ids: set[str]) -> set[str]:
    """Which of ``ids`` the objects table holds."""
    out: set[str] = set()
    for batch in _batches(sorted(ids), 500):
        out.update(c.execute(select(objects.c.id).where(objects.c.id.in_(batch))).scalars())
    return out


def _rescued(c: Connection, doomed: set[str]) -> set[str]:
    """Doomed objects that an object outside ``doomed`` links to or holds as a part, and all
    that those reach: they gained a parent after gc computed what is unreachable."""
    rescued: set[str] = set()
    for batch in _batches(sorted(doomed), 500):
        for child, parent in c.execute(select(links.c.child, links.c.parent)
                                       .where(links.c.child.in_(batch))):
            if parent not in doomed:
                rescued.add(child)
        for part, whole in c.execute(select(parts.c.part_id, parts.c.object_id)
                                     .where(parts.c.part_id.in_(batch))):
            if whole not in doomed:
                rescued.add(part)
    frontier = sorted(rescued)
    while frontier:
        below: set[str] = set()
        for batch in _batches(frontier, 500):
            below.update(c.execute(select(links.c.child)
                                   .where(links.c.parent.in_(batch))).scalars())
            below.update(c.execute(select(parts.c.part_id)
                                   .where(parts.c.object_id.in_(batch))).scalars())
        frontier = sorted((below & doomed) - rescued)
        rescued.update(frontier)
    return rescued


def _batches(items: list[str], n: int) -> Iterator[list[str]]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


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
