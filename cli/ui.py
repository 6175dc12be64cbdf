"""``nscas ui``: browse a store in a web browser (read-only, loopback by default)."""

from __future__ import annotations

import dataclasses
import sys
from typing import Annotated

import typer

from nscas.cli import render
from nscas.cli.common import command_app, open_cli_store

app = command_app()


@app.command("ui")
def ui(
    ctx: typer.Context,
    port: Annotated[int, typer.Option(
        "--port", min=0, max=65535, help="TCP port; 0 picks a free one.")] = 8765,
    host: Annotated[str, typer.Option(
        "--host", help="Address to listen on. Anything but loopback lets other machines "
                       "read the whole store (a warning says so).")] = "127.0.0.1",
    max_connections: Annotated[int, typer.Option(
        "--max-connections", min=1, max=100_000,
        help="Open connections at most; one more gets 503 with Retry-After.")] = 128,
    header_timeout: Annotated[float, typer.Option(
        "--header-timeout", min=0.001, max=86_400,
        help="Seconds a connection may take to send a request's line and headers, from its "
             "opening or its last answer (so also how long an idle one is kept).")] = 10.0,
) -> None:
    """Serve a read-only web app over the store: experiments, receipts, lineage, objects and
    comparisons, with a button that runs the independent verification.

    Prints 'listening http://HOST:PORT/' once ready; stops on Ctrl-C or SIGTERM. Nothing is
    ever written to the store (it is opened read-only; only GET and HEAD are served).

    Example: nscas ui --port 8765, then open http://127.0.0.1:8765/
    """
    from nscas.ui.app import LIMITS, is_loopback, serve

    if header_timeout != header_timeout:  # nan passes typer's bounds
        raise typer.BadParameter("must be a number of seconds", param_hint="--header-timeout")
    limits = dataclasses.replace(LIMITS, max_connections=max_connections,
                                 header_timeout=header_timeout)

    if not host or host != host.strip():
        raise typer.BadParameter(f"{host!r} is not an address", param_hint="--host")
    store = open_cli_store(ctx, readonly=True)
    if not is_loopback(host):
        sys.stderr.write(f"nscas: warning: --host {host} is not loopback: anyone who can reach "
                         "this address can read every object in the store\n")
    try:
        def ready(url: str) -> None:
            render.text(f"listening {url}")
            sys.stdout.flush()

        try:
            serve(store, host=host, port=port, on_ready=ready, limits=limits)
        except OSError as exc:
            raise typer.BadParameter(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                                     param_hint="--port") from None
    finally:
        store.close()
