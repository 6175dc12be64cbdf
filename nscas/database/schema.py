"""The store's tables: the only table definitions. Alembic migrations create them."""

from __future__ import annotations

from sqlalchemy import (
    CHAR,
    BigInteger,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    text,
)

metadata = MetaData()

# Every object, blob or record, by BLAKE3 hex ID. `storage` says where its bytes are:
# inline (in `data`), file (one chunk file in `codec`, docs/format.md §5.5.1) or parts (rows in
# `parts`). `base` names the base leaf of a delta (codec xorW; 0006), NULL otherwise.
objects = Table(
    "objects",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", CHAR(64), nullable=False, unique=True),
    Column("size", BigInteger, nullable=False),
    # NULL only for a tensor object put without its SHA-256 (docs/format.md §1.2): computed
    # later, on demand, and then recorded in `object_sha256`, never here (this table is insert-only).
    Column("sha256", CHAR(64), nullable=True),
    Column("kind", String(64), nullable=True),
    Column("storage", String(8), nullable=False),
    Column("codec", String(8), nullable=False, server_default="raw"),
    Column("stored_size", BigInteger, nullable=False),
    Column("data", LargeBinary, nullable=True),
    Column("created", Float, nullable=False),
    Column("base", CHAR(64), nullable=True),
    Index("ix_objects_records", "kind", "seq", sqlite_where=text("kind IS NOT NULL")),
    Index("ix_objects_record_seq", "seq", sqlite_where=text("kind IS NOT NULL")),
    Index("ix_objects_base", "base", sqlite_where=text("base IS NOT NULL"),
          postgresql_where=text("base IS NOT NULL")),
)

# The ordered pieces of an object stored as parts (tensors of a safetensors file, fixed-size
# chunks of a large file); each part is an object of its own.
parts = Table(
    "parts",
    metadata,
    Column("object_id", CHAR(64), ForeignKey("objects.id"), primary_key=True),
    Column("idx", Integer, primary_key=True),
    Column("offset", BigInteger, nullable=False),
    Column("part_id", CHAR(64), ForeignKey("objects.id"), nullable=False),
    Index("ix_parts_part", "part_id"),
)

# Record -> linked object, with the JSON path of the link; indexed both ways.
links = Table(
    "links",
    metadata,
    Column("parent", CHAR(64), ForeignKey("objects.id"), primary_key=True),
    Column("path", Text, primary_key=True),
    Column("child", CHAR(64), ForeignKey("objects.id"), nullable=False),
    Index("ix_links_child", "child", "parent", "path"),
    # The links that name a run's outputs (0005): finding producers is a lookup.
    Index("ix_links_outputs", "child", "parent", "path",
          sqlite_where=text("substr(path, 1, 9) = '$.outputs'"),
          postgresql_where=text("substr(path, 1, 9) = '$.outputs'")),
)

# The SHA-256 of an object put without one (objects.sha256 NULL), recorded the first time a
# writer needed it. Insert-only like `objects`: a value, once known, never changes.
object_sha256 = Table(
    "object_sha256",
    metadata,
    Column("id", CHAR(64), ForeignKey("objects.id"), primary_key=True),
    Column("sha256", CHAR(64), nullable=False),
)

refs = Table(
    "refs",
    metadata,
    Column("name", String(255), primary_key=True),
    Column("target", CHAR(64), ForeignKey("objects.id"), nullable=False),
    Column("updated", Float, nullable=False),
)

ref_log = Table(
    "ref_log",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("name", String(255), nullable=False),
    Column("old", CHAR(64), nullable=True),
    Column("new", CHAR(64), nullable=False),
    Column("at", Float, nullable=False),
    Column("message", Text, nullable=False, server_default=""),
    Index("ix_ref_log_name", "name", "seq"),
)

# Holds one row only inside a `gc` transaction: the insert-only triggers let deletes through
# while it exists, and no other connection ever sees it.
gc_session = Table(
    "gc_session",
    metadata,
    Column("token", Integer, primary_key=True),
)

INSERT_ONLY = ("objects", "parts", "links", "ref_log", "object_sha256")
