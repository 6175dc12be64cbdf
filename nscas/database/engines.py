"""The alembic upgrade of either engine's database (versions: nscas.database.revision): the one
use of SQLAlchemy outside the migrations themselves. The store's queries run on the plain
drivers (nscas.database.connections)."""

from __future__ import annotations

from pathlib import Path

from nscas.database.revision import migrations_dir


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
