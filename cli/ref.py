"""``nscas ref set|list|log``: mutable names for IDs, moved by compare-and-swap, logged forever."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from nscas.cli import completion, render
from nscas.cli.common import LIMIT_MAX, IdArgument, JsonFlag, command_app, open_cli_store

app = command_app(
    help="Set, list and trace refs: names for IDs. Names under tags/ never move once set.\n\n"
         "Example: nscas ref set experiments/coop/base 1f3a9c0e",
    no_args_is_help=True,
)

NameArgument = Annotated[str, typer.Argument(
    metavar="NAME", show_default=False, autocompletion=completion.refs, help="A ref name such as experiments/coop/base.")]


@app.command("set")
def set_(
    ctx: typer.Context,
    name: NameArgument,
    id_: IdArgument,
    expect: Annotated[str | None, typer.Option(
        "--expect", metavar="OLD", show_default=False,
        help="Only if NAME still points at OLD; 'none' means NAME must be unset.")] = None,
    message: Annotated[str, typer.Option("--message", "-m", help="Why, for the ref log.")] = "",
    as_json: JsonFlag = False,
) -> None:
    """Point NAME at ID, optionally only if it still holds OLD (compare-and-swap).

    Example: nscas ref set experiments/coop/best 1f3a9c0e --expect 77be02d4
    """
    with open_cli_store(ctx) as store:
        target = store.resolve(id_)
        if expect is None:
            old = store.ref_get(name)  # for the message only; the update itself is unconditional
            store.ref_set(name, target, message=message)
        else:
            old = None if expect.lower() == "none" else store.resolve(expect)
            store.ref_set(name, target, expect=old, message=message)
    if as_json:
        render.json_out({"name": name, "old": str(old) if old else None, "new": str(target)})
    else:
        render.text(f"{name}: {old or 'unset'} -> {target}")


@app.command("list")
def list_(
    ctx: typer.Context,
    prefix: Annotated[str, typer.Option(
        "--prefix", metavar="TEXT", help="Only names starting with this.")] = "",
    as_json: JsonFlag = False,
) -> None:
    """List refs and the IDs they point at.

    Example: nscas ref list --prefix experiments/
    """
    with open_cli_store(ctx, readonly=True) as store:
        items = store.ref_list(prefix)
        kinds = store.kinds_of([target for _, target in items])
    rows = [{"name": name, "id": str(target), "kind": kinds.get(target) or "blob"}
            for name, target in items]
    if as_json:
        render.json_out(rows)
    elif not rows:
        render.text("no refs" + (f" starting with {prefix!r}" if prefix else ""))
    else:
        render.table(["name", "kind", "id"], [[r["name"], r["kind"], r["id"]] for r in rows])


@app.command("log")
def log_(
    ctx: typer.Context,
    name: Annotated[str | None, typer.Argument(
        metavar="[NAME]", show_default=False, autocompletion=completion.refs, help="One ref (default: all refs).")] = None,
    limit: Annotated[int | None, typer.Option(
        "--limit", "-n", min=1, max=LIMIT_MAX, show_default=False, help="At most this many entries.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Every change of a ref, newest first: when, from what, to what, and why.

    Example: nscas ref log experiments/coop/best
    """
    with open_cli_store(ctx, readonly=True) as store:
        entries = store.ref_log(name, limit=limit)
    rows: list[dict[str, Any]] = [
        {"name": e.name, "old": str(e.old) if e.old else None, "new": str(e.new),
         "time": render.iso_time(e.at), "message": e.message} for e in entries]
    if as_json:
        render.json_out(rows)
    elif not rows:
        render.text(f"no ref log entries for {name!r}" if name else "the ref log is empty")
    else:
        render.table(["time", "name", "old", "new", "message"],
                     [[r["time"], r["name"], r["old"] or "unset", r["new"], r["message"]]
                      for r in rows])
