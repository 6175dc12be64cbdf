"""``nscas import``: check a bundle completely, then add its objects to the store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nscas.bundle.importing import import_bundle
from nscas.bundle.unpacking import ImportLimits
from nscas.cli import render
from nscas.cli.common import JsonFlag, command_app, open_cli_store

app = command_app()
_DEFAULT = ImportLimits()


@app.command("import")
def import_(
    ctx: typer.Context,
    source: Annotated[Path, typer.Argument(
        metavar="DIR|FILE.tar.gz", show_default=False,
        help="A bundle directory, or a bundle's measurements.tar.gz.")],
    max_manifest_bytes: Annotated[int, typer.Option(
        "--max-manifest-bytes", min=1, max=2**53, metavar="BYTES",
        help="Refuse a manifest.json or SHA256SUMS larger than this.")] = _DEFAULT.manifest_bytes,
    max_bytes: Annotated[int, typer.Option(
        "--max-bytes", min=1, max=2**53, metavar="BYTES",
        help="Refuse a tar whose files unpack to more than this.")] = _DEFAULT.unpacked_bytes,
    max_members: Annotated[int, typer.Option(
        "--max-members", min=1, max=2**53, metavar="N",
        help="Refuse a tar or directory of more entries than this.")] = _DEFAULT.members,
    ref: Annotated[str | None, typer.Option(
        "--ref", metavar="PREFIX", show_default=False,
        help="Also set refs under PREFIX: PREFIX/<step>/<output> and PREFIX/<step>/receipt for "
             "each run in the bundle (PREFIX/variants/<variant>/... for a variant's), and "
             "PREFIX/target.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Add a bundle's objects to the store, with the same IDs.

    Every path, byte and record is checked before the first object is written: a bad bundle
    is refused (exit 2) and nothing is imported. Records that need omitted weights are
    skipped and listed. A tar is unpacked only after its member list and manifest passed;
    the limits bound what a hostile bundle can make import read or unpack (docs/bundle.md).
    --ref PREFIX names the imported runs by their step names, as a pipeline's refs prefix
    does; a ref there that names something else already is refused before anything is
    written.

    Example: nscas import ./coop-bundle --ref imported/coop
    """
    with open_cli_store(ctx) as store:
        report = import_bundle(store, source, limits=ImportLimits(
            manifest_bytes=max_manifest_bytes, unpacked_bytes=max_bytes, members=max_members),
            ref_prefix=ref)
    if as_json:
        out = {"target": str(report.target), "source": str(report.source),
               "complete": report.complete, "imported": len(report.imported),
               "present": report.present, "omitted": [str(d) for d in report.omitted],
               "skipped": [str(d) for d in report.skipped]}
        if ref is not None:
            out["refs"] = {name: str(oid) for name, oid in report.refs}
        render.json_out(out)
        return
    render.text(f"imported {len(report.imported)} object(s) from {report.source} "
                f"({report.present} already present); target {report.target}")
    if report.omitted:
        render.text(f"the bundle omits {len(report.omitted)} weight object(s); "
                    f"{len(report.skipped)} record(s) that need them were not imported")
    if not report.complete:
        render.text("the target is not in the store: it needs omitted objects")
    if ref is not None:
        left = f"; {report.refs_left} not (their objects were not imported)" if report.refs_left else ""
        render.text(f"set {len(report.refs)} ref(s) under {ref}/{left}")
