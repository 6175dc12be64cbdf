"""``nscas remote add|list|remove``: name other stores to push to and pull from."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nscas.cli import render
from nscas.cli.common import JsonFlag, command_app, state

app = command_app(
    help="Name other stores (a store directory or a team store's store.toml) for push and "
         "pull.\n\nExample: nscas remote add lab /shared/lab/.nscas/store.toml",
    no_args_is_help=True,
)

NameArgument = Annotated[str, typer.Argument(
    metavar="NAME", show_default=False, help="The remote's name, such as origin or lab.")]


def store_root(ctx: typer.Context) -> Path:
    """The directory of the store ``--store`` names (else found upwards), unopened."""
    from nscas.store.locating import find_store, store_dir_of

    given = state(ctx).store
    return store_dir_of(given) if given is not None else find_store()


@app.command()
def add(
    ctx: typer.Context,
    name: NameArgument,
    url: Annotated[str, typer.Argument(
        metavar="URL", show_default=False,
        help="The other store: its directory, a directory holding .nscas, or its store.toml.")],
    as_json: JsonFlag = False,
) -> None:
    """Name another store NAME (it must be a store now).

    Example: nscas remote add origin ~/laptop-store
    """
    from nscas.remotes.transfer import add_remote

    remote = add_remote(store_root(ctx), name, url)
    if as_json:
        render.json_out({"name": remote.name, "url": remote.url})
    else:
        render.text(f"remote {remote.name}: {remote.url}")


@app.command("list")
def list_(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """List the remotes, one per line.

    Example: nscas remote list
    """
    from nscas.remotes.transfer import read_remotes

    remotes = sorted(read_remotes(store_root(ctx)).values(), key=lambda r: r.name)
    if as_json:
        render.json_out([{"name": r.name, "url": r.url} for r in remotes])
    elif not remotes:
        render.text("no remotes")
    else:
        render.table(["name", "url"], [[r.name, r.url] for r in remotes])


@app.command()
def remove(ctx: typer.Context, name: NameArgument, as_json: JsonFlag = False) -> None:
    """Forget the remote NAME (the other store is left as it is).

    Example: nscas remote remove lab
    """
    from nscas.remotes.transfer import remove_remote

    gone = remove_remote(store_root(ctx), name)
    if as_json:
        render.json_out({"removed": gone.name, "url": gone.url})
    else:
        render.text(f"removed remote {gone.name} ({gone.url})")
