"""``nscas fsck``: every finding with its object, then a summary; exit 1 on any error."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

import typer

from nscas.cli import render
from nscas.cli.common import JsonFlag, command_app, open_cli_store
from nscas.fsck import fsck as check_store

app = command_app()


@app.command("fsck")
def fsck_(
    ctx: typer.Context,
    deep: Annotated[bool, typer.Option(
        "--deep", help="Also re-hash every stored byte (reads the whole store).")] = False,
    sample: Annotated[float, typer.Option(
        "--sample", metavar="FRACTION", min=0.0, max=1.0,
        help="With --deep, re-hash only this random fraction of objects.")] = 1.0,
    max_seconds: Annotated[float | None, typer.Option(
        "--max-seconds", metavar="S", min=0.0, show_default=False,
        help="With --deep, stop re-hashing after this long (reported as incomplete).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Check every object row, record, link and ref (and with --deep every byte).

    Reports every finding, not just the first; exits 1 if any is an error.

    Example: nscas fsck --deep --sample 0.1 --max-seconds 60
    """
    with (open_cli_store(ctx, readonly=True) as store,
          render.progress("checking objects", store.counts()["objects"]) as advance):
        report = check_store(store, deep=deep, sample=sample, max_seconds=max_seconds,
                             on_object=advance)
    errors = len(report.errors)
    if as_json:
        render.json_out({"ok": report.ok, "objects": report.objects,
                         "deep_checked": report.deep_checked, "deep_bytes": report.deep_bytes,
                         "complete": report.complete, "seconds": round(report.seconds, 3),
                         "errors": errors, "findings": [asdict(f) for f in report.findings]})
    else:
        for f in report.findings:
            render.text(f"{f.severity}: {f.problem}: {f.object or '-'}: {f.detail}")
        deep_part = (f", {report.deep_checked} re-hashed ({report.deep_bytes} bytes)"
                     f"{'' if report.complete else ', incomplete'}" if deep else "")
        notes = len(report.findings) - errors
        render.text(f"{'ok' if report.ok else 'FAILED'}: {report.objects} objects checked"
                    f"{deep_part}; {errors} error(s), {notes} note(s) in {report.seconds:.1f} s")
    if not report.ok:
        raise typer.Exit(1)
