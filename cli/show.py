"""``nscas show``: one object's metadata, its record, its links and what links to it. The work
is nscas.cli.reads.show."""

from __future__ import annotations

import typer

from nscas.cli import reads
from nscas.cli.common import IdArgument, JsonFlag, command_app, state

app = command_app()


@app.command()
def show(ctx: typer.Context, id_: IdArgument, as_json: JsonFlag = False) -> None:
    """Show an object: size, SHA-256, storage; for a record, its JSON, links and referrers.

    Example: nscas show experiments/coop/base
    """
    reads.show(state(ctx).store, id_=id_, as_json=as_json)
