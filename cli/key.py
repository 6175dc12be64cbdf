"""``nscas key``: make a signing key pair (ECDSA P-256) for signed receipts and models."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nscas.cli import render
from nscas.cli.common import JsonFlag, command_app

app = command_app(
    help="Signing keys (ECDSA P-256) for signed receipts and model signatures.\n\n"
         "Example: nscas key new keys/alice.key",
    no_args_is_help=True,
)


@app.callback()
def key() -> None:
    """Signing keys (a group: ``nscas key new``)."""


@app.command("new")
def new(
    file: Annotated[Path | None, typer.Argument(
        metavar="[FILE]", show_default=False, dir_okay=False,
        help="The private key file to create (never overwritten); the public key goes to "
             "FILE.pub. Default: $XDG_CONFIG_HOME/nscas/signing.key.")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", metavar="FILE", show_default=False, dir_okay=False,
        help="The same as FILE (kept for scripts that name it so).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Create an ECDSA P-256 key pair: FILE (PEM, mode 0600) and FILE.pub (PEM).

    The private key stays outside every store and bundle; hand FILE.pub to whoever verifies
    (nscas verify TARGET --trust FILE.pub; model_signing verify key DIR --public_key FILE.pub).

    Example: nscas key new keys/alice.key
    """
    from nscas.signing.signatures import default_key_path, new_key

    if file is not None and out is not None:
        raise typer.BadParameter("give the key file as FILE or as --out FILE, not both",
                                 param_hint="--out")
    chosen = file if file is not None else out
    made = new_key(chosen if chosen is not None else default_key_path())
    if as_json:
        render.json_out({"private": str(made.private), "public": str(made.public),
                         "keyid": made.keyid})
        return
    render.text(f"wrote private key {made.private} (mode 0600) and public key {made.public}")
    render.text(f"key id {made.keyid}")
