"""``nscas init``: create a store, or check (and with ``--upgrade`` migrate) an existing one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nscas.cli import render
from nscas.cli.common import JsonFlag, command_app, state
from nscas.errors import InvalidInput
from nscas.store.config import S3Settings, StoreConfig, check_database_url, check_objects_url
from nscas.store.locating import CONFIG_NAME, store_writable
from nscas.store.opening import open_store
from nscas.store.writer import DB_NAME, STORE_DIR, init_store

app = command_app()


@app.command()
def init(
    ctx: typer.Context,
    path: Annotated[Path | None, typer.Argument(
        show_default=False, file_okay=False,
        help="Where to create .nscas (default: --store, else the current directory).")] = None,
    upgrade: Annotated[bool, typer.Option(
        "--upgrade", help="Migrate an existing store's schema to this version of nscas.")] = False,
    database: Annotated[str | None, typer.Option(
        "--database", show_default=False,
        help="A team store: postgresql://user:password@host:port/dbname (needs --objects).")] = None,
    objects: Annotated[str | None, typer.Option(
        "--objects", show_default=False,
        help="A team store's object data: s3://bucket/prefix or a shared directory.")] = None,
    s3_endpoint: Annotated[str | None, typer.Option(
        "--s3-endpoint", show_default=False,
        help="The S3 service's URL (MinIO, Ceph); default: AWS_ENDPOINT_URL or AWS.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Create an nscas store (a .nscas directory) in PATH.

    Running it again on an existing store changes nothing; a store of another schema version
    is refused unless --upgrade is given.

    Example: nscas init ~/experiments
    Example: nscas init --database postgresql://me:pw@db:5432/nscas --objects s3://lab/nscas
    """
    target = path or state(ctx).store or Path.cwd()
    root = target if target.name == STORE_DIR else target / STORE_DIR
    if target.name == CONFIG_NAME and target.is_file():  # --store .../store.toml: its directory
        root = target.parent
    if database is not None or objects is not None or s3_endpoint is not None:
        if database is None or objects is None:
            raise InvalidInput("a team store needs both --database and --objects")
        config = StoreConfig(database=check_database_url(database),
                             objects=check_objects_url(objects),
                             s3=S3Settings(endpoint_url=s3_endpoint))
        existed = (root / CONFIG_NAME).is_file()
        init_store(root, config).close()
        _report(root, existed, as_json)
        return
    # An SQLite store has its database file; a team store its store.toml (and no database here).
    existed = (root / DB_NAME).is_file() or (root / CONFIG_NAME).is_file()
    if existed and not upgrade:
        # Refuses another schema version before alembic would touch it; a store at this
        # version has nothing to change, so a read-only one is fine as it is.
        open_store(root, readonly=True).close()
    if upgrade or not existed or store_writable(root):
        init_store(root).close()  # a read-only store to upgrade it refuses in one line
    _report(root, existed, as_json)


def _report(root: Path, existed: bool, as_json: bool) -> None:
    where = str(root.resolve())
    if as_json:
        render.json_out({"store": where})
    elif existed:
        render.text(f"nscas store already in {where}")
    else:
        render.text(f"initialised an empty nscas store in {where}")
