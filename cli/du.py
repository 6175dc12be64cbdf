"""``nscas du``: what objects cost the store, plain and stored (codecs, deltas: format.md §5.5.1)."""

from __future__ import annotations

from typing import Annotated

import typer

from nscas.cli import render
from nscas.cli.common import JsonFlag, command_app, open_cli_store
from nscas.store.usage import usage

app = command_app()


@app.command()
def du(
    ctx: typer.Context,
    ids: Annotated[list[str], typer.Argument(
        metavar="ID", show_default=False, help="Objects: IDs, unique prefixes or refs.")],
    as_json: JsonFlag = False,
) -> None:
    """Show each object's raw and stored bytes: the leaves it reaches, each counted once, and
    the delta bases they need besides (held for another object, such as a parent checkpoint).

    Example: nscas du experiments/coop/base experiments/coop/tuned
    """
    with open_cli_store(ctx, readonly=True) as reader:
        oids = [reader.resolve(text) for text in ids]
        rows = [(text, oid, usage(reader, oid)) for text, oid in zip(ids, oids, strict=True)]
    if as_json:
        render.json_out([{"name": text, "id": str(oid), "leaves": u.leaves, "raw": u.raw,
                          "stored": u.stored, "bases": u.bases} for text, oid, u in rows])
        return
    render.table(["name", "leaves", "raw", "stored", "stored/raw", "bases", "id"],
                 [[text, str(u.leaves), str(u.raw), str(u.stored), f"{u.ratio:.3f}",
                   str(u.bases), str(oid)] for text, oid, u in rows])
