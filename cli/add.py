"""``nscas add``: files become blobs, directories tree/1 records; optionally name one with a ref."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, TypedDict

import typer

from nscas.cli import render
from nscas.cli.common import JsonFlag, command_app, open_cli_store
from nscas.errors import InvalidInput
from nscas.models.checkpoints import delta_base
from nscas.store.writer import check_ref_name

app = command_app()


class _Added(TypedDict):
    """One added path, as --json prints it."""

    path: str
    id: str
    sha256: str
    size: int
    kind: str


@app.command()
def add(
    ctx: typer.Context,
    paths: Annotated[list[Path], typer.Argument(
        metavar="PATH", show_default=False, help="Files and directories to store.")],
    ref: Annotated[str | None, typer.Option(
        "--ref", metavar="NAME", show_default=False,
        help="Point this ref at the stored object (exactly one PATH).")] = None,
    delta_from: Annotated[str | None, typer.Option(
        "--delta-from", metavar="REF", show_default=False,
        help="An earlier version (file, tree or checkpoint; exactly one PATH): pieces are "
             "also tried as deltas to its pieces of the same tensor or place.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Store files as blobs and directories as tree/1 records, and print their IDs.

    Every PATH is checked before anything is stored: one missing path and nothing is added.

    Example: nscas add checkpoints/step-200/ --delta-from experiments/coop/base
    """
    # Check everything first so that bad input writes nothing.
    if ref is not None:
        if len(paths) != 1:
            raise InvalidInput(f"--ref names one object, but {len(paths)} paths were given")
        check_ref_name(ref)
    if delta_from is not None and len(paths) != 1:
        raise InvalidInput(f"--delta-from names the base of one PATH, but {len(paths)} paths "
                           "were given")
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise InvalidInput(f"no such file or directory: {', '.join(missing)}; nothing was added")
    special = [str(p) for p in paths if not (p.is_file() or p.is_dir())]
    if special:  # a FIFO, socket or device: its bytes are not a file's to content-address
        raise InvalidInput(f"not a regular file or directory: {', '.join(special)}; "
                           "nothing was added")
    rows: list[_Added] = []
    with open_cli_store(ctx) as store:
        base = None if delta_from is None else delta_base(store, delta_from, tree=paths[0].is_dir())
        for path in paths:
            oid = (store.put_tree(path, base=base) if path.is_dir()
                   else store.put_file(path, base=base))
            info = store.info(oid)
            rows.append({"path": str(path), "id": str(oid), "sha256": store.sha256(oid),
                         "size": info.size, "kind": info.kind or "blob"})
        if ref is not None:
            store.ref_set(ref, oid, message=f"nscas add {paths[0]}")
    if as_json:
        render.json_out(rows)
        return
    render.table(["path", "kind", "size", "id"],
                 [[r["path"], r["kind"], str(r["size"]), r["id"]] for r in rows])
    if ref is not None:
        render.text(f"{ref} -> {rows[0]['id']}")
