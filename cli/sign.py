"""``nscas sign``: sign a receipt (or the receipt that produced an output) with a private key."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from nscas.cli import completion, render
from nscas.cli.common import JsonFlag, command_app, open_cli_store
from nscas.errors import InvalidInput

app = command_app()


@app.command("sign")
def sign(
    ctx: typer.Context,
    target: Annotated[str, typer.Argument(
        metavar="TARGET", show_default=False, autocompletion=completion.refs,
        help="A receipt, or an output a run produced (its receipt is signed): a full ID, a "
             "ref name, or a unique prefix of at least 8 hex digits.")],
    key: Annotated[Path | None, typer.Option(
        "--key", metavar="FILE", show_default=False, dir_okay=False,
        help="The private key file (mode 0600); default: $NSCAS_SIGNING_KEY.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Sign a receipt: store a signature/1 record (a DSSE envelope over an in-toto statement
    about the receipt) that links it. The receipt's ID does not change; signing again with
    the same key gives the same record (deterministic ECDSA).

    Example: nscas sign experiments/coop/report --key ~/.config/nscas/signing.key
    """
    from nscas.signing.signatures import KEY_ENV, KeySigner, load_key
    from nscas.store.provenance import producers

    if key is None:
        env = os.environ.get(KEY_ENV)
        if not env:
            raise InvalidInput(f"no key: pass --key FILE or set {KEY_ENV}")
        key = Path(env)
    signer = KeySigner(load_key(key))  # before the store opens: a bad key writes nothing
    with open_cli_store(ctx) as store:
        named = store.resolve(target)
        receipt = named
        if store.info(named).kind != "receipt/1":
            found = producers(store, named).first
            if found is None:
                kind = store.info(named).kind
                raise InvalidInput(f"{target} is {'a ' + kind if kind else 'a blob'} that no "
                                   "succeeded receipt produced: nothing to sign")
            receipt = found
        signature = signer.sign(store, receipt)
    if as_json:
        render.json_out({"receipt": str(receipt), "named": str(named),
                         "signature": str(signature), "keyid": signer.key.keyid})
        return
    what = "" if receipt == named else f" (which produced {target})"
    render.text(f"signed receipt {receipt}{what} with key {signer.key.keyid[:16]}: "
                f"signature {signature}")
