"""The SQLite engine with nscas's PRAGMAs, and schema-version checks."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine, create_engine, event, inspect, text

from nscas.locating import BUSY_TIMEOUT_MS, newer_schema
from nscas.locating import SCHEMA_HEAD as SCHEMA_HEAD  # defined where readers need it


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


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        if not inspect(conn).has_table("alembic_version"):
            return None
        return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()


def refuse_unknown_revision(engine: Engine, where: Path) -> None:
    """Refuse a store written by a newer nscas before alembic sees it."""
    try:
        rev = current_revision(engine)
    finally:
        engine.dispose()
    if rev is not None and rev not in known_revisions():
        raise newer_schema(rev, where)


def known_revisions() -> set[str]:
    """Every revision the migrations know (alembic walks its scripts)."""
    from alembic.script import ScriptDirectory

    return {s.revision for s in ScriptDirectory(migrations_dir()).walk_revisions()}


def migrations_dir() -> str:
    import nscas.migrations

    return str(Path(nscas.migrations.__file__).parent)


def upgrade(db_path: Path) -> None:
    """Create or upgrade the schema to head, through alembic only."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", migrations_dir())
    cfg.set_main_option("sqlalchemy.url", f"sqlite:///{db_path}")
    cfg.attributes["db_path"] = str(db_path)
    command.upgrade(cfg, "head")
