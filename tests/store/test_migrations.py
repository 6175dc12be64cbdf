"""The migrations build exactly the tables of ``nscas.schema``, and the code knows their head."""

from __future__ import annotations

from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine

from nscas.db import SCHEMA_HEAD, migrations_dir
from nscas.schema import INSERT_ONLY, metadata
from nscas.store import Store
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
