"""The refs ``nscas import BUNDLE --ref PREFIX`` restores (docs/bundle.md, "Refs").

A bundle holds no refs (its paths never depend on them), so they are derived from what it
does hold: each succeeded receipt's step name (else the name of its file in the bundle,
``receipts/<name>.json``), variant and outputs
give the refs a pipeline's ``refs = PREFIX`` would have given that run (docs/format.md §6.3,
§6.10): ``PREFIX[/variants/<variant>]/<step>/<output>`` and ``.../<step>/receipt``; and
``PREFIX/target`` names the bundle's target.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from nscas.errors import InvalidInput, NscasError
from nscas.objects.digests import Digest
from nscas.runs.variants import NAME, step_refs
from nscas.store.locating import check_ref_name

TARGET = "target"
"""``PREFIX/target``: the bundle's target."""


def bundle_refs(prefix: str, target: Digest, records: Mapping[Digest, Mapping[str, Any]],
                files: Mapping[Digest, str]) -> dict[str, Digest]:
    """Ref name -> ID for a bundle whose target, records and object files (``files``: ID ->
    path in the bundle) are these. Of several succeeded receipts of one step and variant, the
    newest (by ``finished``, then ID) names them. A prefix or step that makes an invalid ref
    name is an ``InvalidInput`` naming it."""
    _check(prefix, "--ref")
    newest: dict[tuple[str | None, str], tuple[str, Digest]] = {}
    for oid, rec in records.items():
        if rec.get("nscas") != "receipt/1" or rec.get("status") != "succeeded":
            continue
        step = rec.get("step")
        if not isinstance(step, str):
            path = PurePosixPath(files.get(oid, f"receipts/{oid.short}.json"))
            step = path.stem if path.parent.name == "receipts" else oid.short
        variant = rec.get("variant")
        variant = variant if isinstance(variant, str) and NAME.fullmatch(variant) else None
        mark = (str(rec.get("finished")), oid)
        key = (variant, step)
        if key not in newest or mark > (newest[key][0], newest[key][1]):
            newest[key] = (mark[0], oid)
    out: dict[str, Digest] = {f"{prefix}/{TARGET}": target}
    for (variant, step), (_, oid) in sorted(newest.items(), key=lambda i: (i[0][0] or "", i[0][1])):
        outputs = records[oid]["outputs"]
        targets = {**{k: Digest.parse(v) for k, v in outputs.items()}, "receipt": oid}
        for output, ref in step_refs(prefix, variant, step, tuple(outputs)):
            _check(ref, f"step {step!r}")
            out[ref] = targets[output]
    return out


def _check(name: str, what: str) -> None:
    try:
        check_ref_name(name)
    except NscasError as exc:
        raise InvalidInput(f"--ref: {what} gives no ref: {exc.message}") from None
