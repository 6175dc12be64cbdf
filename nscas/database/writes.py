"""Every statement that changes the store, for both engines, each a named function of a
:class:`~nscas.database.connections.Connection` inside a write transaction (nscas.database.queries
has the reads).

The tables are insert-only but for refs (triggers refuse the rest, migration 0001); gc's deletes
go through while ``gc_session`` holds a row, inside gc's own transaction. On PostgreSQL, where
writers run at once, advisory locks serialise what SQLite's one write lock would.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from nscas.database.connections import Connection
from nscas.database.queries import batches, children, marks, parents

_GC_LOCK = 0x6E736361  # PostgreSQL advisory lock: writers share it, gc's deletes hold it alone
_REF_LOCK = 0x6E737266  # with hashtext(name): one ref's compare-and-swap at a time

OBJECT_COLUMNS = ("id", "size", "sha256", "kind", "storage", "codec", "stored_size", "data",
                  "created", "base")
"""The columns of a row :func:`insert_objects` takes, in order."""


def lock_writers(c: Connection, *, gc: bool = False) -> None:
    """A writer's share of the gc lock (gc's deletes: all of it), until the transaction ends."""
    if c.dialect == "postgresql":
        c.execute(f"SELECT pg_advisory_xact_lock{'' if gc else '_shared'}(?)", (_GC_LOCK,))


def lock_ref(c: Connection, name: str) -> None:
    """One compare-and-swap of ``name`` at a time, until the transaction ends."""
    if c.dialect == "postgresql":
        c.execute("SELECT pg_advisory_xact_lock(?, hashtext(?))", (_REF_LOCK, name))


def insert_objects(c: Connection, rows: Sequence[Sequence[Any]]) -> None:
    """Object rows of :data:`OBJECT_COLUMNS`; one already stored is left as it is."""
    c.executemany(f"INSERT INTO objects ({', '.join(OBJECT_COLUMNS)}) VALUES "
                  f"({marks(OBJECT_COLUMNS)}) ON CONFLICT (id) DO NOTHING", rows)


def insert_parts(c: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
    """Rows of ``object_id``, ``idx``, ``offset``, ``part_id``, after the parts' own objects."""
    c.executemany('INSERT INTO parts (object_id, idx, "offset", part_id) VALUES (?, ?, ?, ?) '
                  "ON CONFLICT DO NOTHING",
                  [(r["object_id"], r["idx"], r["offset"], r["part_id"]) for r in rows])


def insert_links(c: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
    """Rows of ``parent``, ``path``, ``child``, after their records."""
    c.executemany("INSERT INTO links (parent, path, child) VALUES (?, ?, ?) "
                  "ON CONFLICT DO NOTHING", [(r["parent"], r["path"], r["child"]) for r in rows])


def record_sha256(c: Connection, hex_id: str, sha256: str) -> None:
    """The SHA-256 of an object put without one, while the object is still stored (a gc may
    have removed it meanwhile); a value recorded already stays."""
    c.execute("INSERT INTO object_sha256 (id, sha256) SELECT ?, ? WHERE EXISTS "
              "(SELECT 1 FROM objects WHERE id = ?) ON CONFLICT DO NOTHING",
              (hex_id, sha256, hex_id))


def set_ref(c: Connection, name: str, old: str | None, new: str, *, at: float,
            message: str) -> None:
    """Point ``name`` (now at ``old``, None: no such ref) at ``new``, and log the change."""
    if old is None:
        c.execute("INSERT INTO refs (name, target, updated) VALUES (?, ?, ?)", (name, new, at))
    else:
        c.execute("UPDATE refs SET target = ?, updated = ? WHERE name = ?", (new, at, name))
    c.execute("INSERT INTO ref_log (name, old, new, at, message) VALUES (?, ?, ?, ?, ?)",
              (name, old, new, at, message))


def rescued(c: Connection, doomed: set[str]) -> set[str]:
    """Doomed objects that an object outside ``doomed`` links to or holds as a part, and all
    that those reach: they gained a parent after gc computed what is unreachable."""
    out: set[str] = set()
    for batch in batches(sorted(doomed)):
        out.update(child for child, parent in parents(c, batch) if parent not in doomed)
    frontier = sorted(out)
    while frontier:
        below: set[str] = set()
        for batch in batches(frontier):
            below.update(children(c, batch, with_parts=True))
        frontier = sorted((below & doomed) - out)
        out.update(frontier)
    return out


def delete_objects(c: Connection, gone: list[str]) -> None:
    """Remove objects with their parts, links and recorded SHA-256s, in gc's session (the
    insert-only triggers let these deletes through while it holds its row)."""
    c.execute("INSERT INTO gc_session (token) VALUES (1)")
    for batch in batches(gone):
        for sql in ("DELETE FROM links WHERE parent IN ({})",
                    "DELETE FROM parts WHERE object_id IN ({})",
                    "DELETE FROM object_sha256 WHERE id IN ({})"):
            c.execute(sql.format(marks(batch)), batch)
    # Parts may be shared: delete objects only once nothing still points at them.
    for batch in batches(gone):
        c.execute(f"DELETE FROM objects WHERE id IN ({marks(batch)})", batch)
    c.execute("DELETE FROM gc_session")


def hold_session_lock(c: Connection, kind: int, key: int) -> None:
    """Wait for and take a PostgreSQL advisory lock of this session (released by
    :func:`release_session_lock`, or when the session ends)."""
    c.execute("SELECT pg_advisory_lock(?, ?)", (kind, key))


def release_session_lock(c: Connection, kind: int, key: int) -> None:
    c.execute("SELECT pg_advisory_unlock(?, ?)", (kind, key))
