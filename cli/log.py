"""``nscas log``: records, newest first; receipts also show their run: recipe, status,
pipeline, step and variant, and headline claims."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from nscas.cli import completion, render
from nscas.cli.common import LIMIT_MAX, JsonFlag, command_app, open_cli_store
from nscas.objects.digests import Digest

app = command_app()

_CLAIMS_SHOWN = 4  # headline claims per receipt in the table (--json has them all, exact)


@app.command()
def log(
    ctx: typer.Context,
    kind: Annotated[str | None, typer.Option(
        "--kind", metavar="KIND", show_default=False, autocompletion=completion.kinds,
        help="Only records of this kind, e.g. receipt/1.")] = None,
    limit: Annotated[int, typer.Option(
        "--limit", "-n", min=1, max=LIMIT_MAX, help="At most this many.")] = 20,
    as_json: JsonFlag = False,
) -> None:
    """List records, newest first: ID, kind, time, size; for receipts also the recipe, status,
    pipeline, step and variant (a run with --set), and headline claims (numbers, rounded here;
    exact with --json).

    Example: nscas log --kind receipt/1 --limit 5
    """
    if kind is not None:
        _check_kind(kind)
    entries: list[dict[str, Any]] = []
    with open_cli_store(ctx, readonly=True) as reader:
        infos = reader.log(kind=kind, limit=limit)
        # The receipts, then their actions: two reads for the whole listing, not two a receipt.
        receipts = reader.get_records(i.id for i in infos if i.kind == "receipt/1")
        actions = reader.get_records(Digest.parse(r["action"]) for r in receipts.values())
        if receipts:
            from nscas.runs.side_by_side import headline_claims
        for info in infos:
            entry: dict[str, Any] = {"id": str(info.id), "kind": info.kind,
                                     "time": render.iso_time(info.created), "size": info.size}
            if info.kind == "receipt/1":
                receipt = receipts[info.id]
                entry["status"] = receipt["status"]
                entry["recipe"] = actions[Digest.parse(receipt["action"])]["recipe"]
                for key in ("pipeline", "step", "variant"):
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
    with_receipts = any("recipe" in e for e in entries)
    with_variants = any(e.get("variant") for e in entries)
    if with_receipts:
        columns += ["step", *(["variant"] if with_variants else []), "recipe", "status", "claims"]
    rows = []
    for e in entries:
        row = [str(e[c]) for c in ("time", "kind", "size", "id")]
        if with_receipts:
            row.append(_step(e))
            if with_variants:
                row.append(e.get("variant") or ("-" if "recipe" in e else ""))
            row += [e.get("recipe", ""), e.get("status", ""), _claims(e)]
        rows.append(row)
    render.table(columns, rows)


def _check_kind(kind: str) -> None:
    """Refuse a kind no record can have (a typo lists nothing, which reads as "none stored")."""
    from nscas.objects.kinds import KINDS

    if kind not in KINDS:
        from nscas.errors import InvalidInput
        from nscas.suggestions import closest

        # Matched on the name, so that 'receipt' and 'receipt/2' also find 'receipt/1'.
        by_name = {known.partition("/")[0]: known for known in KINDS}
        found = closest(kind.partition("/")[0], by_name)
        hint = f"; did you mean {by_name[found]!r}?" if found else ""
        raise InvalidInput(f"--kind: unknown record kind {kind!r}{hint} "
                           f"(kinds: {', '.join(KINDS)})")


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
