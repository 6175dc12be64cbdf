"""``nscas gc``: remove what no ref, tag or receipt reaches, and leftovers of interrupted writes."""

from __future__ import annotations

from typing import Annotated

import typer

from nscas.cli import render
from nscas.cli.common import JsonFlag, command_app, open_cli_store
from nscas.fsck import gc as collect

app = command_app()


@app.command("gc")
def gc_(
    ctx: typer.Context,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Only say what would be removed.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Remove objects that no ref, tag or receipt reaches, temporary files and orphan chunks.

    Example: nscas gc --dry-run
    """
    with open_cli_store(ctx, readonly=dry_run) as store:
        report = collect(store, dry_run=dry_run)
    if as_json:
        render.json_out({"dry_run": report.dry_run, "objects": len(report.objects),
                         "bytes": report.bytes, "temporary_files": len(report.temporary_files),
                         "orphan_chunks": len(report.orphan_chunks),
                         "removed": [str(d) for d in report.objects]})
        return
    verb = "would remove" if dry_run else "removed"
    for oid in report.objects:
        render.text(f"{verb} {oid}")
    render.text(f"{verb} {len(report.objects)} object(s) ({report.bytes} bytes stored), "
                f"{len(report.temporary_files)} temporary file(s), "
                f"{len(report.orphan_chunks)} orphan chunk file(s)")
