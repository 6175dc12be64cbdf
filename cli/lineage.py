"""``nscas lineage``: the link graph around an object, as a tree, JSON or Graphviz dot. The work
is nscas.cli.reads.lineage."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from nscas.cli import fast, reads
from nscas.cli.common import IdArgument, JsonFlag, command_app, state
from nscas.store.lineage import HIDE_CLASSES, MAX_NODES

app = command_app()


Format = StrEnum("Format", {f: f for f in fast.LINEAGE_FORMATS})  # the fast parser's choices


@app.command("lineage")
def lineage_(
    ctx: typer.Context,
    id_: IdArgument,
    up: Annotated[bool, typer.Option(
        "--up/--down",
        help="--up: what ID was made from (its links and the run that produced it); --down: "
             "what was made from ID.")] = True,
    depth: Annotated[int | None, typer.Option(
        "--depth", min=0, show_default=False, help="Stop this many links away.")] = None,
    hide: Annotated[str, typer.Option(
        "--hide", metavar="CLASSES", show_default=False,
        help="Leave out these classes of object, comma-separated: "
             + "; ".join(f"{k}: {v}" for k, v in HIDE_CLASSES.items()) + ".")] = "",
    max_nodes: Annotated[int, typer.Option(
        "--max-nodes", min=1, max=fast.LINEAGE_MAX_NODES,
        help="Show at most this many objects, nearest first; the rest are counted.")
    ] = MAX_NODES,
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.tree,
    as_json: JsonFlag = False,
) -> None:
    """Show what an object was made from (--up, the default) or what was made from it (--down).

    Going up from an output reaches the receipt of the run that produced it, that run's
    action, its inputs and their producers in turn. Each object is labelled with its kind,
    recipe, pipeline step and ref names. Objects reached twice are listed again but not
    expanded ("seen").

    Example: nscas lineage experiments/coop/clean-pair --hide blobs,code,params --format dot | dot -Tsvg
    """
    reads.lineage(state(ctx).store, id_=id_, up=up, depth=depth, hide=hide, max_nodes=max_nodes,
                  fmt=fmt.value, as_json=as_json)
