"""``nscas log``: records, newest first; receipts also show their run: recipe, status,
pipeline, step and variant, and headline claims. The work is nscas.cli.reads.log."""

from __future__ import annotations

from typing import Annotated

import typer

from nscas.cli import completion, fast, reads
from nscas.cli.common import JsonFlag, command_app, state

app = command_app()


@app.command()
def log(
    ctx: typer.Context,
    kind: Annotated[str | None, typer.Option(
        "--kind", metavar="KIND", show_default=False, autocompletion=completion.kinds,
        help="Only records of this kind, e.g. receipt/1.")] = None,
    limit: Annotated[int, typer.Option(
        "--limit", "-n", min=1, max=fast.LIMIT_MAX, help="At most this many.")] = 20,
    as_json: JsonFlag = False,
) -> None:
    """List records, newest first: ID, kind, time, size; for receipts also the recipe, status,
    pipeline, step and variant (a run with --set), and headline claims (numbers, rounded here;
    exact with --json).

    Example: nscas log --kind receipt/1 --limit 5
    """
    reads.log(state(ctx).store, kind=kind, limit=limit, as_json=as_json)
