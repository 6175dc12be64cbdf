"""``nscas fsck``: every finding with its object, then a summary; exit 1 on any error."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

import typer

from nscas.cli import render
from nscas.cli.common import JsonFlag, command_app, open_cli_store
from nscas.errors import StoreError
from nscas.upkeep.fsck import fsck as check_store

app = command_app()


@app.command("fsck")
def fsck_(
    ctx: typer.Context,
    deep: Annotated[bool, typer.Option(
        "--deep", help="Also read every stored leaf (chunk file or inline row) once and check "
                       "that it hashes (BLAKE3) to its ID and has its recorded size.")] = False,
    full: Annotated[bool, typer.Option(
        "--full", help="Implies --deep. Instead re-read every top-level object through its "
                       "parts and check its BLAKE3, SHA-256 and size (slower).")] = False,
    sample: Annotated[float, typer.Option(
        "--sample", metavar="FRACTION", min=0.0, max=1.0,
        help="With --deep or --full, check only this random fraction of them.")] = 1.0,
    max_seconds: Annotated[float | None, typer.Option(
        "--max-seconds", metavar="S", min=0.0, show_default=False,
        help="With --deep or --full, stop after this long (reported as incomplete).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Check every object row, record, link and ref (and with --deep or --full the bytes).

    What each mode proves:

    \b
    (no flag)  reads no stored bytes: every inline row holds its size in
               bytes; every chunk file exists with its recorded stored size;
               every parts list tiles its object (no gap or overlap, every
               part present, sizes summing to the object's); every record is
               canonical and valid for its kind, its links indexed and
               present; every ref names a present object. Always also: the
               schema is the migrations' own (tables, columns, indexes, the
               insert-only triggers) and every ref agrees with its ref log
               (set when the log says, pointing where its last entry does;
               no tag ever moved).
    --deep     also the stored bytes: each leaf (chunk file, zstd decoded,
               or inline row) is read once and must hash with BLAKE3 to its
               ID and have its recorded size. Every stored byte is in exactly
               one leaf, so any change to what a leaf holds is found; about
               one BLAKE3 pass over the store. Checks no SHA-256, and of a
               parts row only that its part exists with the right size.
    --full     instead re-reads every top-level object (one that is no part
               of another) through its parts and checks its BLAKE3 (the ID),
               recorded SHA-256 and size, each leaf's ID on the way: also
               proves that the parts rows assemble the right bytes and that
               the top-level objects' SHA-256 values hold. Costs a SHA-256
               pass (about 3 x BLAKE3) and a read per object using a part.

    Reports every finding, not just the first; exits 1 if any is an error.

    Example: nscas fsck --deep --sample 0.1 --max-seconds 60
    """
    with open_cli_store(ctx, readonly=True) as store:
        try:
            total: int | None = store.counts()["objects"]
        except StoreError:  # a table dropped by hand: the check reports it as a finding
            total = None
        with render.progress("checking objects", total) as advance:
            report = check_store(store, deep=deep, full=full, sample=sample,
                                 max_seconds=max_seconds, on_object=advance)
    errors = len(report.errors)
    if as_json:
        render.json_out({"ok": report.ok, "mode": report.mode, "objects": report.objects,
                         "deep_checked": report.deep_checked, "deep_bytes": report.deep_bytes,
                         "complete": report.complete, "seconds": round(report.seconds, 3),
                         "errors": errors, "findings": [asdict(f) for f in report.findings]})
    else:
        for f in report.findings:
            render.text(f"{f.severity}: {f.problem}: {f.object or '-'}: {f.detail}")
        what = "leaves" if report.mode == "deep" else "objects in full"
        deep_part = ""
        if report.mode != "rows":
            deep_part = (f", {report.deep_checked} {what} re-hashed ({report.deep_bytes} bytes)"
                         f"{'' if report.complete else ', incomplete'}")
        notes = len(report.findings) - errors
        render.text(f"{'ok' if report.ok else 'FAILED'}: {report.objects} objects checked"
                    f"{deep_part}; {errors} error(s), {notes} note(s) in {report.seconds:.1f} s")
    if not report.ok:
        raise typer.Exit(1)
