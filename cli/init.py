"""``nscas init``: create a store, or check (and with ``--upgrade`` migrate) an existing one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nscas.cli import render
from nscas.cli.common import JsonFlag, command_app, state
from nscas.locating import store_writable
from nscas.opening import open_store
from nscas.store import DB_NAME, STORE_DIR, init_store

app = command_app()


@app.command()
def init(
    ctx: typer.Context,
    path: Annotated[Path | None, typer.Argument(
        show_default=False, file_okay=False,
        help="Where to create .nscas (default: --store, else the current directory).")] = None,
    upgrade: Annotated[bool, typer.Option(
        "--upgrade", help="Migrate an existing store's schema to this version of nscas.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Create an nscas store (a .nscas directory) in PATH.

    Running it again on an existing store changes nothing; a store of another schema version
    is refused unless --upgrade is given.

    Example: nscas init ~/experiments
    """
    target = path or state(ctx).store or Path.cwd()
    root = target if target.name == STORE_DIR else target / STORE_DIR
    existed = (root / DB_NAME).is_file()
    if existed and not upgrade:
        # Refuses another schema version before alembic would touch it; a store at this
        # version has nothing to change, so a read-only one is fine as it is.
        open_store(root, readonly=True).close()
    if upgrade or not existed or store_writable(root):
        init_store(root).close()  # a read-only store to upgrade it refuses in one line
    where = str(root.resolve())
    if as_json:
        render.json_out({"store": where})
    elif existed:
        render.text(f"nscas store already in {where}")
    else:
        render.text(f"initialised an empty nscas store in {where}")
