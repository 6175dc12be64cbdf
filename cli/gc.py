"""``nscas gc``: remove what no ref, tag or receipt reaches, and leftovers of interrupted writes."""

from __future__ import annotations

from typing import Annotated

import typer

from nscas.cli import render
from nscas.cli.common import JsonFlag, command_app, finite, open_cli_store
from nscas.upkeep.fsck import DEFAULT_MIN_AGE
from nscas.upkeep.fsck import gc as collect

app = command_app()
_REASONS = {"succeeded": "its action has succeeded", "process-gone": "its process is gone",
            "unowned": "no run holds it", "incomplete": "left by an interrupted create or remove",
            "alive": "its process is running", "other-host": "held by a process on another host"}


@app.command("gc")
def gc_(
    ctx: typer.Context,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Only say what would be removed.")] = False,
    min_age: Annotated[float, typer.Option(
        "--min-age", metavar="SECONDS", min=0.0, callback=finite,
        help="Keep objects, temporary files and chunk files younger than this: a put running in "
             "another process may still need them. Must exceed the longest put; 0 only when "
             "nothing else writes to the store.")] = DEFAULT_MIN_AGE,
    as_json: JsonFlag = False,
) -> None:
    """Remove objects that no ref, tag or receipt reaches, temporary files and orphan chunks,
    and work areas whose action has succeeded or whose process is gone.

    Anything younger than --min-age stays (an object with everything it reaches), so that a
    put in another process, which writes chunk files before their rows and names its objects
    only after storing them, is never broken.

    Example: nscas gc --dry-run --min-age 86400
    """
    with open_cli_store(ctx, readonly=dry_run) as store:
        report = collect(store, dry_run=dry_run, min_age=min_age)
    if as_json:
        render.json_out({"dry_run": report.dry_run, "min_age": report.min_age,
                         "objects": len(report.objects), "bytes": report.bytes,
                         "temporary_files": len(report.temporary_files),
                         "orphan_chunks": len(report.orphan_chunks),
                         "young_objects": report.young_objects, "young_files": report.young_files,
                         "removed": [str(d) for d in report.objects],
                         "work_areas": [{"path": str(a.path), "removed": a.removed,
                                         "reason": a.reason,
                                         "action": str(a.action) if a.action else None}
                                        for a in report.work_areas]})
        return
    verb = "would remove" if dry_run else "removed"
    areas = (f", {sum(a.removed for a in report.work_areas)} work area(s)"
             if report.work_areas else "")
    for oid in report.objects:
        render.text(f"{verb} {oid}")
    for area in report.work_areas:
        what = f"work area of action {area.action}" if area.action else f"work area {area.path.name}"
        render.text(f"{verb if area.removed else 'kept'} {what} ({_REASONS[area.reason]})")
    render.text(f"{verb} {len(report.objects)} object(s) ({report.bytes} bytes stored), "
                f"{len(report.temporary_files)} temporary file(s), "
                f"{len(report.orphan_chunks)} orphan chunk file(s)"
                f"{areas}; kept "
                f"{report.young_objects} object(s) and {report.young_files} file(s) younger "
                f"than {report.min_age:g} s")
