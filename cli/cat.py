"""``nscas cat``: an object's bytes on stdout, never wrong ones."""

from __future__ import annotations

import typer

from nscas.cli import render
from nscas.cli.common import IdArgument, command_app, open_cli_store

app = command_app()

# Objects up to this size are read and checked whole before the first byte is written, so a
# corrupt object prints nothing. Larger ones stream, each leaf checked before it is written.
_CHECK_FIRST_MAX = 64 << 20
_BLOCK = 1 << 20


@app.command()
def cat(ctx: typer.Context, id_: IdArgument) -> None:
    """Write an object's bytes to stdout, checked against its ID.

    Example: nscas cat experiments/coop/base > checkpoint.json
    """
    with open_cli_store(ctx, readonly=True) as store:
        oid = store.resolve(id_)
        if store.info(oid).size <= _CHECK_FIRST_MAX:
            render.raw([store.get_bytes(oid)])
            return
        with store.open(oid) as f:
            render.raw(iter(lambda: f.read(_BLOCK), b""))
