"""``nscas log``: records, newest first; receipts also show their recipe and status."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from nscas.cli import render
from nscas.cli.common import LIMIT_MAX, JsonFlag, command_app, iso_time, open_cli_store
from nscas.digests import Digest

app = command_app()


@app.command()
def log(
    ctx: typer.Context,
    kind: Annotated[str | None, typer.Option(
        "--kind", metavar="KIND", show_default=False,
        help="Only records of this kind, e.g. receipt/1.")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=LIMIT_MAX, help="At most this many.")] = 20,
    as_json: JsonFlag = False,
) -> None:
    """List records, newest first: ID, kind, time, size (and recipe and status for receipts).

    Example: nscas log --kind receipt/1 --limit 5
    """
    entries: list[dict[str, Any]] = []
    with open_cli_store(ctx, readonly=True) as store:
        for info in store.log(kind=kind, limit=limit):
            entry: dict[str, Any] = {"id": str(info.id), "kind": info.kind,
                                     "time": iso_time(info.created), "size": info.size}
            if info.kind == "receipt/1":
                # Two small inline reads per receipt: cheap enough for a listing.
                receipt = store.get_record(info.id)
                entry["status"] = receipt["status"]
                entry["recipe"] = store.get_record(Digest.parse(receipt["action"]))["recipe"]
            entries.append(entry)
    if as_json:
        render.json_out(entries)
        return
    if not entries:
        render.text("no records" + (f" of kind {kind}" if kind else ""))
        return
    columns = ["time", "kind", "size", "id"]
    if any("recipe" in e for e in entries):
        columns += ["recipe", "status"]
    render.table(columns, [[str(e.get(c, "")) for c in columns] for e in entries])
