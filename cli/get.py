"""``nscas get``: materialise a blob as a file, a tree/1 as a directory, a checkpoint/1 as its
model directory; never overwrite."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nscas.cli import render
from nscas.cli.common import IdArgument, JsonFlag, command_app, open_cli_store
from nscas.objects.digests import Digest

app = command_app()


@app.command()
def get(
    ctx: typer.Context,
    id_: IdArgument,
    dest: Annotated[Path, typer.Argument(
        metavar="DEST", show_default=False,
        help="A path that does not exist yet (for a tree or checkpoint, or an empty directory).")],
    as_json: JsonFlag = False,
) -> None:
    """Write a blob to the new file DEST, a tree/1 to the new directory DEST, or a
    checkpoint/1 as its model directory (every file of its tree: config, weights, tokenizer),
    which transformers loads and `nscas import-hf` stores as the same files and params.

    Every byte is checked against its ID on the way; everything is written beside DEST and
    renamed into place, so a failure leaves nothing; an existing DEST is never overwritten.

    Example: nscas get experiments/coop/base ./restored-model
    """
    with open_cli_store(ctx, readonly=True) as store:
        oid = store.resolve(id_)
        info = store.info(oid)
        written = Digest.parse(store.get_record(oid)["files"]) if info.kind == "checkpoint/1" \
            else oid
        store.materialise(written, dest)
    kind = info.kind or "blob"
    if as_json:
        render.json_out({"id": str(oid), "path": str(dest), "kind": kind}
                        | ({"files": str(written)} if written != oid else {}))
    elif written != oid:
        render.text(f"wrote {dest} ({kind} {oid}: the model directory, tree/1 {written})")
    else:
        render.text(f"wrote {dest} ({kind} {oid})")
