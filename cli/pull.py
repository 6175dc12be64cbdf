"""``nscas pull TARGET [--from NAME]``: bring TARGET's closure from a remote, and its ref."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nscas.cli.common import JsonFlag, command_app, open_cli_store
from nscas.cli.remote import store_root
from nscas.cli.transfer import report

app = command_app()


@app.command()
def pull(
    ctx: typer.Context,
    target: Annotated[str, typer.Argument(
        metavar="TARGET", show_default=False,
        help="An ID, unique prefix or ref name of the remote.")],
    from_: Annotated[str | None, typer.Option(
        "--from", metavar="NAME", show_default=False,
        help="The remote (default: the only one, else origin).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Bring TARGET and every object it reaches that this store lacks (for a run's output, with
    the receipt that produced it, so that it can be verified here); a ref named as TARGET
    moves here by compare-and-swap. Resumable: run it again after an interruption.

    Example: nscas pull experiments/coop/best --from lab
    """
    from nscas.remotes.transfer import pick_remote, transfer
    from nscas.store.opening import open_store

    remote = pick_remote(store_root(ctx), from_)
    with open_store(Path(remote.url), readonly=True) as there, open_cli_store(ctx) as here:
        done = transfer(there, here, target)
    report(done, f"from {remote.name}", as_json)
