"""``nscas compare``: runs side by side, one row per receipt (nscas.runs.side_by_side decides what)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from nscas.cli import completion, render
from nscas.cli.common import JsonFlag, command_app, open_cli_store
from nscas.errors import InvalidInput

app = command_app()


@app.command("compare")
def compare_(
    ctx: typer.Context,
    targets: Annotated[list[str] | None, typer.Argument(
        metavar="REF|ID...", show_default=False, autocompletion=completion.refs,
        help="Receipts, or outputs of runs (the receipt that produced each is compared): "
             "full IDs, ref names or unique prefixes of 8+ hex digits.")] = None,
    pipeline: Annotated[str | None, typer.Option(
        "--pipeline", metavar="NAME", show_default=False,
        help="Compare the latest succeeded run of each step of this pipeline (the name its "
             "receipts record).")] = None,
    sort: Annotated[str | None, typer.Option(
        "--sort", metavar="COLUMN", show_default=False,
        help="Order the rows by this column: step, recipe, arm, finished, a param or claim "
             "name, or inputs.NAME.")] = None,
    descending: Annotated[bool, typer.Option(
        "--desc", help="With --sort: largest first.")] = False,
    claims: Annotated[str | None, typer.Option(
        "--claims", metavar="NAMES", show_default=False,
        help="Show these headline claims as columns, comma-separated (default: the ones "
             "that differ, for runs of one recipe).")] = None,
    wide: Annotated[bool, typer.Option(
        "--wide", help="Print every table cell whole (full IDs), however wide the terminal.")]
        = False,
    as_json: JsonFlag = False,
) -> None:
    """Compare runs: one row per receipt with its step, variant, recipe, arm, the inputs and
    params that differ between the rows, and the headline claims (rounded here; exact with
    --json); then every input and param that changed, as old -> new, for each run against the
    first run of its step. --pipeline compares the latest run of each step and variant.

    Example: nscas compare experiments/coop/clean-single experiments/coop/clean-pair --sort update_seconds
    """
    from nscas.runs.side_by_side import compare, pipeline_receipts, receipts_of, sort_runs

    if bool(targets) == (pipeline is not None):
        raise InvalidInput("name the runs to compare (REF|ID...) or give --pipeline NAME, "
                           "not both and not neither")
    if descending and sort is None:
        raise InvalidInput("--desc orders by a column: give --sort COLUMN as well")
    wanted = [c.strip() for c in claims.split(",") if c.strip()] if claims is not None else None
    with open_cli_store(ctx, readonly=True) as store:
        named = (pipeline_receipts(store, pipeline) if pipeline is not None
                 else receipts_of(store, targets or []))
        result = compare(store, named, claims=wanted)
    if sort is not None:
        result = sort_runs(result, sort, descending=descending)
    if as_json:
        render.json_out(result.to_json())
        return
    columns = ["receipt", "step"]
    if any(r.variant for r in result.runs):
        columns.append("variant")
    columns.append("recipe")
    if any(r.arm for r in result.runs):
        columns.append("arm")
    columns += [f"inputs.{n}" for n in result.inputs] + list(result.params) + list(result.claims)
    rows = [[_cell(run.value(c)) for c in columns] for run in result.runs]
    if not result.claims and not result.one_recipe:
        columns.append("claims")
        for row, run in zip(rows, result.runs, strict=True):
            row.append(", ".join(f"{k}={render.human(v)}" for k, v in run.headline.items())
                       or "-")
    for row, run in zip(rows, result.runs, strict=True):
        row[1] = run.step or run.named
    render.table(columns, rows, title=f"{len(result.runs)} run(s)"
                 + (f" of pipeline {pipeline}" if pipeline else ""), wide=wide)
    if result.same:
        render.note("The same in every run: " + ", ".join(
            f"{k}={render.human(v)}" for k, v in result.same.items()) + ".")
    label = {r.receipt: f"{r.step or r.named}" + (f" ({r.variant})" if r.variant else "")
             for r in result.runs}
    changed = [[label[c.receipt], str(c.receipt), str(c.against), change.what,
                render.change(change.name, change.old, change.new)]
               for c in result.changes for change in c.changes]
    if changed:
        render.table(["run", "receipt", "against", "what", "old -> new"], changed,
                     title="What changed, against the first run of each step", wide=wide)


def _cell(value: Any) -> str:
    return "-" if value is None else render.human(value)
