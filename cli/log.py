"""``nscas log``: records, newest first; receipts also show their run: recipe, status,
pipeline and step, and headline claims."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from nscas.cli import render
from nscas.cli.common import LIMIT_MAX, JsonFlag, command_app, iso_time, open_cli_store
from nscas.digests import Digest

app = command_app()

_CLAIMS_SHOWN = 4  # headline claims per receipt in the table (--json has them all, exact)


@app.command()
def log(
    ctx: typer.Context,
    kind: Annotated[str | None, typer.Option(
        "--kind", metavar="KIND", show_default=False,
        help="Only records of this kind, e.g. receipt/1.")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=LIMIT_MAX, help="At most this many.")] = 20,
    as_json: JsonFlag = False,
) -> None:
    """List records, newest first: ID, kind, time, size; for receipts also the recipe, status,
    pipeline and step, and headline claims (numbers, rounded here; exact with --json).

    Example: nscas log --kind receipt/1 --limit 5
    """
    from nscas.comparing import headline_claims

    entries: list[dict[str, Any]] = []
    with open_cli_store(ctx, readonly=True) as store:
        infos = store.log(kind=kind, limit=limit)
        # The receipts, then their actions: two reads for the whole listing, not two a receipt.
        receipts = store.get_records(i.id for i in infos if i.kind == "receipt/1")
        actions = store.get_records(Digest.parse(r["action"]) for r in receipts.values())
        for info in infos:
            entry: dict[str, Any] = {"id": str(info.id), "kind": info.kind,
                                     "time": iso_time(info.created), "size": info.size}
            if info.kind == "receipt/1":
                receipt = receipts[info.id]
                entry["status"] = receipt["status"]
                entry["recipe"] = actions[Digest.parse(receipt["action"])]["recipe"]
                for key in ("pipeline", "step"):
                    value = receipt.get(key)
                    entry[key] = value if isinstance(value, str) else None
                entry["claims"] = headline_claims(receipt["claims"])
            entries.append(entry)
    if as_json:
        render.json_out(entries)
        return
    if not entries:
        render.text("No records" + (f" of kind {kind}" if kind else "") + " are stored.")
        return
    columns = ["time", "kind", "size", "id"]
    receipts = any("recipe" in e for e in entries)
    if receipts:
        columns += ["step", "recipe", "status", "claims"]
    rows = []
    for e in entries:
        row = [str(e[c]) for c in ("time", "kind", "size", "id")]
        if receipts:
            row += [_step(e), e.get("recipe", ""), e.get("status", ""), _claims(e)]
        rows.append(row)
    render.table(columns, rows)


def _step(entry: dict[str, Any]) -> str:
    step, pipeline = entry.get("step"), entry.get("pipeline")
    if step is None:
        return "-" if "recipe" in entry else ""
    return f"{pipeline}/{step}" if pipeline else step


def _claims(entry: dict[str, Any]) -> str:
    if "claims" not in entry:
        return ""
    claims = entry["claims"]
    shown = [f"{k}={render.human(v)}" for k, v in list(claims.items())[:_CLAIMS_SHOWN]]
    if len(claims) > _CLAIMS_SHOWN:
        shown.append(f"+{len(claims) - _CLAIMS_SHOWN} more")
    return ", ".join(shown) or "-"
