"""The migrations build exactly the tables of ``nscas.database.schema``, and the code knows their head."""

from __future__ import annotations

from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine

from nscas.database.revision import SCHEMA_HEAD, migrations_dir
from nscas.database.schema import INSERT_ONLY, metadata
from nscas.store.writer import Store
from tests.store.helpers import raw_db


def _script() -> ScriptDirectory:
    cfg = Config()
    cfg.set_main_option("script_location", migrations_dir())
    return ScriptDirectory.from_config(cfg)


def _defaults_differ(_ctx, _col, _meta_col, inspected: str | None, meta_default: Any,
                     _rendered: str | None) -> bool:
    """Compare server defaults as SQL literals. SQLite reflects DEFAULT '' as "('')", which
    alembic's own comparison reports as a change although both are the empty string."""
    while inspected is not None and inspected.startswith("(") and inspected.endswith(")"):
        inspected = inspected[1:-1]
    arg = None if meta_default is None else meta_default.arg
    expected = "'" + arg.replace("'", "''") + "'" if isinstance(arg, str) else arg
    return inspected != expected


def test_schema_head_is_the_migrations_head() -> None:
    assert _script().get_heads() == [SCHEMA_HEAD]


def test_migrated_store_has_exactly_the_declared_schema(store: Store) -> None:
    engine = create_engine(f"sqlite:///{store.root / 'nscas.db'}")
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True,
                                                         "compare_server_default": _defaults_differ})
            assert compare_metadata(ctx, metadata) == []
            assert ctx.get_current_revision() == SCHEMA_HEAD
    finally:
        engine.dispose()


def test_migrations_install_the_insert_only_triggers(store: Store) -> None:
    con = raw_db(store)
    try:
        names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
    finally:
        con.close()
    assert names == {f"{t}_no_{verb}" for t in INSERT_ONLY for verb in ("update", "delete")}


def test_a_store_of_the_first_schema_upgrades_in_place(tmp_path) -> None:
    """A store made by an older nscas is refused until `nscas init --upgrade`, then keeps
    every object it held and gains the new indexes."""
    import hashlib
    import sqlite3

    import blake3
    import pytest
    from alembic import command

    from nscas.errors import StoreError
    from nscas.objects.chunks import ChunkFiles
    from nscas.objects.digests import Digest
    from nscas.store.opening import open_store
    from nscas.store.writer import init_store

    root = tmp_path / ".nscas"
    root.mkdir()
    ChunkFiles(root).ensure()
    cfg = Config()
    cfg.set_main_option("script_location", migrations_dir())
    cfg.set_main_option("sqlalchemy.url", f"sqlite:///{root / 'nscas.db'}")
    command.upgrade(cfg, "0001_initial")
    data = b"written under the first schema"
    hex_id = blake3.blake3(data).hexdigest()
    with sqlite3.connect(root / "nscas.db", isolation_level=None) as db:
        db.execute("INSERT INTO objects (id, size, sha256, kind, storage, codec, stored_size, data,"
                   " created) VALUES (?, ?, ?, NULL, 'inline', 'raw', ?, ?, 0)",
                   (hex_id, len(data), hashlib.sha256(data).hexdigest(), len(data), data))
    with pytest.raises(StoreError, match="init --upgrade"):
        open_store(tmp_path)
    init_store(tmp_path).close()
    with open_store(tmp_path) as store:
        assert store.get_bytes(Digest(hex_id)) == data
        with raw_db(store) as db:
            names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {"ix_links_child", "ix_objects_record_seq"} <= names
