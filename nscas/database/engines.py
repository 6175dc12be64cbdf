"""The SQLite engine with nscas's PRAGMAs, the PostgreSQL engine (psycopg 3) of a team store,
and the alembic upgrade of either (versions: nscas.database.revision)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine, create_engine, event

from nscas.database.revision import migrations_dir
from nscas.store.locating import BUSY_TIMEOUT_MS


def make_engine(db_path: Path, *, readonly: bool = False, writer: bool = True) -> Engine:
    """An engine whose transactions begin IMMEDIATE (``writer``) or deferred (readers)."""
    url = f"sqlite:///{db_path}"
    if readonly:
        url = f"sqlite:///file:{db_path}?mode=ro&uri=true"
    engine = create_engine(url, future=True, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000})

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
        # Let SQLAlchemy's transactions map onto SQLite's: BEGIN IMMEDIATE for writers is issued
        # explicitly by the store, so autocommit mode here and explicit BEGIN there.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        if not readonly:
            cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn) -> None:  # type: ignore[no-untyped-def]
        conn.exec_driver_sql("BEGIN IMMEDIATE" if writer and not readonly else "BEGIN")

    return engine


def make_pg_engine(url: str) -> Engine:
    """A team store's engine: psycopg 3, READ COMMITTED; the store serialises what must be
    serial with advisory locks (nscas.store.writer)."""
    from nscas.database.postgres import CONNECT_TIMEOUT_S, sqlalchemy_url

    return create_engine(sqlalchemy_url(url), future=True, pool_pre_ping=True,
                         connect_args={"connect_timeout": CONNECT_TIMEOUT_S,
                                       "application_name": "nscas"})


def upgrade(db_path: Path) -> None:
    """Create or upgrade the schema to head, through alembic only."""
    _upgrade(f"sqlite:///{db_path}")


def upgrade_pg(url: str) -> None:
    """The same migrations on a team store's PostgreSQL database."""
    from nscas.database.postgres import sqlalchemy_url

    _upgrade(sqlalchemy_url(url))


def _upgrade(url: str) -> None:
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", migrations_dir())
    # ConfigParser interpolation: a '%' in a password must reach alembic as it is.
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    command.upgrade(cfg, "head")
