"""``nscas push TARGET [--to NAME]``: send TARGET's closure to a remote, and its ref."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nscas.cli.common import IdArgument, JsonFlag, command_app, open_cli_store
from nscas.cli.remote import store_root
from nscas.cli.transfer import report

app = command_app()


@app.command()
def push(
    ctx: typer.Context,
    target: IdArgument,
    to: Annotated[str | None, typer.Option(
        "--to", metavar="NAME", show_default=False,
        help="The remote (default: the only one, else origin).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Send TARGET and every object it reaches that the remote lacks (for a run's output, with
    the receipt that produced it, so that it can be verified there); a ref named as TARGET
    moves there by compare-and-swap. Resumable: run it again after an interruption.

    Example: nscas push experiments/coop/best --to lab
    """
    from nscas.remotes.transfer import pick_remote, transfer
    from nscas.store.opening import open_store

    remote = pick_remote(store_root(ctx), to)
    with open_cli_store(ctx, readonly=True) as here, open_store(Path(remote.url)) as there:
        done = transfer(here, there, target)
    report(done, f"to {remote.name}", as_json)

