"""Alembic environment: the URL comes from nscas (the store being opened), never from alembic.ini."""

from __future__ import annotations

import os
from pathlib import Path

from alembic import context
from sqlalchemy import create_engine, text

from nscas.database.schema import metadata

config = context.config
MIGRATION_LOCK = 0x6E736D67  # PostgreSQL advisory lock key: one migration of a database at a time


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if url:
        return url
    store = os.environ.get("NSCAS_STORE")
    if not store:
        raise SystemExit("set NSCAS_STORE to the store directory to migrate")
    return f"sqlite:///{Path(store) / 'nscas.db'}"


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = create_engine(_url())
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
        with context.begin_transaction():
            if connection.dialect.name == "postgresql":
                # Two `nscas init` on one empty database: one migrates, the other waits here and
                # then finds the schema at head (the lock ends with the migration's transaction).
                connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK})
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
