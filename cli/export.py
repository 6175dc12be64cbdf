"""``nscas export``: write a target's closure as a bundle anyone can check offline."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nscas.bundle.exporting import export_bundle
from nscas.cli import completion, render
from nscas.cli.common import JsonFlag, command_app, open_cli_store
from nscas.store.provenance import producers

app = command_app()


@app.command("export")
def export_(
    ctx: typer.Context,
    target: Annotated[str, typer.Argument(
        metavar="TARGET", show_default=False, autocompletion=completion.refs,
        help="What to publish: a receipt, or an output a run produced (its receipt is "
             "exported); a full ID, a ref name, or a unique prefix of at least 8 hex digits.")],
    dest: Annotated[Path, typer.Argument(
        metavar="DIR", show_default=False,
        help="The bundle directory to create; it must not exist or be empty.")],
    no_weights: Annotated[bool, typer.Option(
        "--no-weights", help="Leave out checkpoint weight files (*.safetensors) and their tensors; "
                             "the manifest lists them as omitted.")] = False,
    model_signing: Annotated[Path | None, typer.Option(
        "--model-signing", metavar="KEY", show_default=False, dir_okay=False,
        help="Also sign each model folder models/<arm>/ with this private key file (OpenSSF "
             "Model Signing v1.0, by the model-signing package) into "
             "model-signatures/<arm>.sig, which 'model_signing verify key' checks.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Write TARGET and everything it links to as a bundle directory (docs/bundle.md).

    An object that a run produced (an output ref such as a report or a checkpoint) is
    published with its evidence: the receipt that produced it is exported instead (the
    earliest succeeded one, as the cache picks), and the first line says so. An object no
    run produced is exported alone.

    Every file is exactly an object's bytes; each model folder holds all files of its
    checkpoint, so it loads with transformers. SHA256SUMS, manifest.json and a deterministic
    measurements.tar.gz (everything but the weights) come with them. Exporting the same
    target twice gives byte-identical files; a failed export leaves nothing behind. Every
    signature of every receipt exported comes along (signatures/); model signatures
    (--model-signing) are signed afresh each time, so they differ between exports.

    Example: nscas export experiments/coop/report ./coop-bundle
    (then: cd coop-bundle && sha256sum -c SHA256SUMS && nscas verify .)
    """
    signer = None
    if model_signing is not None:
        from functools import partial

        from nscas.signing.signatures import load_key, sign_model_dir

        load_key(model_signing)  # an exposed or unusable key: one line, nothing written
        signer = partial(sign_model_dir, model_signing)
    with open_cli_store(ctx, readonly=True) as store:
        named = store.resolve(target)
        found = producers(store, named) if store.info(named).kind != "receipt/1" else None
        producer = found.first if found is not None else None
        report = export_bundle(store, producer or named, dest, weights=not no_weights,
                               model_signer=signer)
    if as_json:
        render.json_out({"target": str(report.target), "named": str(named),
                         "producers": [str(r) for r in found.receipts] if found else [],
                         "dir": str(report.dest),
                         "files": report.files, "bytes": report.bytes, "derived": report.derived,
                         "weights": report.weights, "omitted": [str(d) for d in report.omitted],
                         "signatures": report.signatures,
                         "model_signatures": list(report.model_signatures)})
        return
    if found is not None and producer is not None:
        what = named if target == str(named) else f"{target} ({named})"
        count = len(found.receipts)
        render.text(f"exporting receipt {producer} which produced {what}" + (
            f"; the earliest by start of the {count} succeeded receipts that produced it"
            if count > 1 else ""))
    render.text(f"exported {report.target} to {report.dest}: {report.files} files, "
                f"{report.bytes} bytes, {report.derived} tensors as ranges of weight files")
    if report.omitted:
        render.text(f"omitted {len(report.omitted)} weight object(s) (--no-weights)")
    if report.signatures:
        render.text(f"carried {report.signatures} receipt signature(s)")
    for arm in report.model_signatures:
        render.text(f"signed models/{arm}/ as model-signatures/{arm}.sig")
