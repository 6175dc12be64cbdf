"""``nscas get``: materialise a blob as a file or a tree/1 as a directory; never overwrite."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nscas.cli import render
from nscas.cli.common import IdArgument, JsonFlag, command_app, open_cli_store

app = command_app()


@app.command()
def get(
    ctx: typer.Context,
    id_: IdArgument,
    dest: Annotated[Path, typer.Argument(
        metavar="DEST", show_default=False, help="A path that does not exist yet.")],
    as_json: JsonFlag = False,
) -> None:
    """Write a blob to the new file DEST, or a tree/1 record to the new directory DEST.

    Every byte is checked against its ID on the way; an existing DEST is never overwritten.

    Example: nscas get experiments/coop/base ./restored-model
    """
    with open_cli_store(ctx, readonly=True) as store:
        oid = store.resolve(id_)
        info = store.info(oid)
        store.materialise(oid, dest)
    kind = info.kind or "blob"
    if as_json:
        render.json_out({"id": str(oid), "path": str(dest), "kind": kind})
    else:
        render.text(f"wrote {dest} ({kind} {oid})")
