"""Every statement that reads the store, for both engines, each a named function of a
:class:`~nscas.database.connections.Connection` (the writes are nscas.database.writes's).

Written once with ``?`` placeholders; where the engines differ (a LATERAL join, the schema's
catalogue) the connection's ``dialect`` says which form runs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from nscas.database.connections import Connection
from nscas.database.rows import DeltaRow, Leaf, LinkWay, ObjectInfo, RefEntry, StoredLeaf
from nscas.errors import NotFound
from nscas.objects.digests import Digest

# ObjectInfo's columns: a SHA-256 left out at put time comes from object_sha256 once recorded.
_INFO = ("id, size, COALESCE(sha256, (SELECT s.sha256 FROM object_sha256 s WHERE s.id = objects.id)),"
         " kind, storage, codec, stored_size, created, base")
BATCH = 500  # IDs per IN (...) list, well under SQLite's bound on parameters
_UNION_BATCH = 100  # SELECTs per UNION ALL, well under SQLite's bound of 500 terms
OUTPUTS = "substr(path, 1, 9) = '$.outputs'"
"""The links that name a run's outputs, exactly as the partial index ``ix_links_outputs``
(migration 0005) is defined: a query that names it so reads that index, on both engines."""


def marks(items: Sequence[object]) -> str:
    return ", ".join("?" * len(items))


def batches(items: list[str], n: int = BATCH) -> Iterator[list[str]]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


def _info(row: Sequence[Any]) -> ObjectInfo:
    hex_id, size, sha256, kind, storage, codec, stored_size, created, base = row
    return ObjectInfo(id=Digest(hex_id), size=size, sha256=sha256, kind=kind, storage=storage,
                      codec=codec, stored_size=stored_size, created=created,
                      base=Digest(base) if base else None)


# ------------------------------------------------------------------- objects

def has(c: Connection, hex_id: str) -> bool:
    return c.execute("SELECT 1 FROM objects WHERE id = ?", (hex_id,)).fetchone() is not None


def info(c: Connection, hex_id: str) -> ObjectInfo | None:
    row = c.execute(f"SELECT {_INFO} FROM objects WHERE id = ?", (hex_id,)).fetchone()
    return None if row is None else _info(row)


def stored_leaf(c: Connection, hex_id: str) -> StoredLeaf | None:
    row = c.execute("SELECT size, sha256, storage, codec, stored_size, base FROM objects "
                    "WHERE id = ?", (hex_id,)).fetchone()
    return None if row is None else StoredLeaf(*row)


def delta_row(c: Connection, hex_id: str) -> DeltaRow | None:
    """(codec, size, storage, base) of a stored object, as a delta's chain check reads it."""
    row = c.execute("SELECT codec, size, storage, base FROM objects WHERE id = ?",
                    (hex_id,)).fetchone()
    return None if row is None else DeltaRow(*row)


def present(c: Connection, ids: set[str]) -> set[str]:
    """Which of ``ids`` the objects table holds."""
    out: set[str] = set()
    for batch in batches(sorted(ids)):
        out.update(r[0] for r in c.execute(f"SELECT id FROM objects WHERE id IN ({marks(batch)})",
                                           batch))
    return out


def ids_with_prefix(c: Connection, prefix: str, limit: int) -> list[str]:
    """The first ``limit`` IDs that start with ``prefix`` (lowercase hex), in order."""
    return [r[0] for r in c.execute(
        "SELECT id FROM objects WHERE id >= ? AND id < ? ORDER BY id LIMIT ?",
        (prefix, prefix + "g", limit))]


def log(c: Connection, *, kind: str | None, limit: int, before: int | None) -> list[ObjectInfo]:
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
    return [_info(r) for r in c.execute(sql + " ORDER BY seq DESC LIMIT ?", (*args, limit))]


def objects_after(c: Connection, seq: int, limit: int) -> list[tuple[int, ObjectInfo]]:
    """(seq, info) of the next ``limit`` objects after ``seq``, in the order they were put."""
    return [(r[0], _info(r[1:])) for r in c.execute(
        f"SELECT seq, {_INFO} FROM objects WHERE seq > ? ORDER BY seq LIMIT ?", (seq, limit))]


def lazy_sha256_after(c: Connection, hex_id: str, limit: int) -> list[tuple[str, str]]:
    """(ID, SHA-256) recorded after their objects' puts, the next ``limit`` after ``hex_id``."""
    return [(h, sha) for h, sha in c.execute(
        "SELECT id, sha256 FROM object_sha256 WHERE id > ? ORDER BY id LIMIT ?", (hex_id, limit))]


def inline_data(c: Connection, hex_id: str) -> bytes | None:
    row = c.execute("SELECT data FROM objects WHERE id = ?", (hex_id,)).fetchone()
    return bytes(row[0]) if row is not None and row[0] is not None else None


def records_of(c: Connection, batch: list[str]) -> dict[str, tuple[str | None, str, Any]]:
    """(kind, storage, inline data) of each stored ID of ``batch``."""
    return {r[0]: r[1:] for r in c.execute(
        f"SELECT id, kind, storage, data FROM objects WHERE id IN ({marks(batch)})", batch)}


def kinds_with_data(c: Connection, batch: list[str], wanted: list[str]
                    ) -> list[tuple[str, str | None, str, Any]]:
    """(ID, kind, storage, inline data if the kind is one of ``wanted``) of each stored ID."""
    data_of = f"CASE WHEN kind IN ({marks(wanted)}) THEN data END" if wanted else "NULL"
    return c.execute(f"SELECT id, kind, storage, {data_of} FROM objects "
                     f"WHERE id IN ({marks(batch)})", [*wanted, *batch]).fetchall()


def counts(c: Connection) -> dict[str, int]:
    return {"objects": c.execute("SELECT count(*) FROM objects").fetchone()[0],
            "records": c.execute("SELECT count(*) FROM objects WHERE kind IS NOT NULL").fetchone()[0],
            "refs": c.execute("SELECT count(*) FROM refs").fetchone()[0]}


# --------------------------------------------------------------------- parts

def leaves(c: Connection, hex_id: str) -> Iterator[Leaf]:
    """The leaves of an object in order; NotFound for one not stored."""
    row = c.execute("SELECT storage, codec, data, size, base FROM objects WHERE id = ?",
                    (hex_id,)).fetchone()
    if row is None:
        raise NotFound(f"blake3:{hex_id}")
    storage, codec, data, size, base = row
    named = Digest(base) if base is not None else None
    if storage == "inline":
        yield Digest(hex_id), codec, bytes(data), size, named
    elif storage == "file":
        yield Digest(hex_id), codec, None, size, named
    else:
        for _, _, sub in part_rows(c, hex_id):
            yield from leaves(c, sub)


def part_rows(c: Connection, hex_id: str) -> list[tuple[int, int, str]]:
    """(index, offset, part ID) of an object stored as parts, in order; empty for others."""
    return c.execute('SELECT idx, "offset", part_id FROM parts WHERE object_id = ? ORDER BY idx',
                     (hex_id,)).fetchall()


# ---------------------------------------------------------------------- refs

def ref_target(c: Connection, name: str) -> str | None:
    row = c.execute("SELECT target FROM refs WHERE name = ?", (name,)).fetchone()
    return row[0] if row and row[0] else None


def refs(c: Connection, prefix: str) -> list[tuple[str, str]]:
    """(name, target) of the refs whose names start with ``prefix``, sorted by code point (a
    PostgreSQL database's collation may order otherwise)."""
    sql = "SELECT name, target FROM refs"
    args: tuple[int, str] | tuple[()] = ()
    if prefix:
        # Case-sensitive on both engines, as ref names are (SQLite's LIKE ignores ASCII case,
        # PostgreSQL's does not): the name's first characters equal the prefix exactly.
        sql, args = sql + " WHERE substr(name, 1, ?) = ?", (len(prefix), prefix)
    return sorted(c.execute(sql, args).fetchall())


def ref_log(c: Connection, name: str | None, limit: int | None) -> list[RefEntry]:
    sql = "SELECT name, old, new, at, message FROM ref_log"
    args: list[Any] = []
    if name is not None:
        sql += " WHERE name = ?"
        args.append(name)
    sql += " ORDER BY seq DESC"
    if limit is not None:
        sql += " LIMIT ?"
        args.append(limit)
    return [RefEntry(name=n, old=Digest(old) if old else None, new=Digest(new), at=at,
                     message=message) for n, old, new, at, message in c.execute(sql, args)]


# --------------------------------------------------------------------- links

def link_batch(c: Connection, way: LinkWay) -> int:
    """How many IDs one :func:`links` statement takes."""
    return _UNION_BATCH if way == "to" and c.dialect == "sqlite" else BATCH


def links(c: Connection, batch: list[str], way: LinkWay, limit: int | None,
          ends: list[str] | None) -> list[tuple[Any, ...]]:
    """The links of ``way`` of each ID of ``batch`` (``to``: at most ``limit`` of each), as
    (parent, path, child) ordered by the asked end, then (parent, path); with ``ends``, each
    row goes on with (ID, kind, storage, inline data if the kind is one of ``ends``) of the
    object at the link's other end, all None for an end not stored."""
    end = "child" if way == "from" else "parent"
    columns, join, head = "l.parent, l.path, l.child", "", []
    if ends is not None:  # objects has no column named like one of links'
        data_of = f"CASE WHEN o.kind IN ({marks(ends)}) THEN o.data END" if ends else "NULL"
        columns += f", o.id, o.kind, o.storage, {data_of}"
        join, head = f" LEFT JOIN objects AS o ON o.id = l.{end}", ends
    one = "SELECT parent, path, child FROM links WHERE child = {} ORDER BY parent, path"
    if limit is not None:
        one += f" LIMIT {int(limit)}"
    args: list[str] = batch
    if way == "from":
        sql = (f"SELECT {columns} FROM links AS l{join} WHERE l.parent IN "
               f"({marks(batch)}) ORDER BY l.parent, l.path")
    elif way == "outputs":
        sql = (f"SELECT {columns} FROM links AS l{join} WHERE l.child IN "
               f"({marks(batch)}) AND {OUTPUTS} ORDER BY l.parent, l.path")
    elif c.dialect == "postgresql":
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
    return c.execute(sql, [*head, *args]).fetchall()


def children(c: Connection, batch: list[str], *, with_parts: bool,
             with_bases: bool | None = None) -> list[str]:
    """The IDs ``batch`` links to (and, if asked, holds as parts and needs as delta bases:
    ``with_bases`` defaults to ``with_parts``)."""
    kids = [r[0] for r in c.execute(f"SELECT child FROM links WHERE parent IN ({marks(batch)})",
                                    batch)]
    if with_parts:
        kids += [r[0] for r in c.execute(
            f"SELECT part_id FROM parts WHERE object_id IN ({marks(batch)})", batch)]
    if with_parts if with_bases is None else with_bases:
        kids += [r[0] for r in c.execute(
            f"SELECT base FROM objects WHERE id IN ({marks(batch)}) AND base IS NOT NULL",
            batch)]
    return kids


def parents(c: Connection, batch: list[str]) -> list[tuple[str, str]]:
    """(child, parent) of every link to an ID of ``batch``, (part, whole) of every part row
    naming one, and (base, delta) of every leaf stored as a delta of one."""
    return (c.execute(f"SELECT child, parent FROM links WHERE child IN ({marks(batch)})",
                      batch).fetchall()
            + c.execute(f"SELECT part_id, object_id FROM parts WHERE part_id IN ({marks(batch)})",
                        batch).fetchall()
            + c.execute(f"SELECT base, id FROM objects WHERE base IN ({marks(batch)})",
                        batch).fetchall())
