"""``nscas lineage``: the link graph around an object, as a tree, JSON or Graphviz dot."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from nscas.cli import render
from nscas.cli.common import IdArgument, JsonFlag, command_app, open_cli_store
from nscas.lineage import Node, lineage, to_dot

app = command_app()


class Format(StrEnum):
    tree = "tree"
    json = "json"
    dot = "dot"


@app.command("lineage")
def lineage_(
    ctx: typer.Context,
    id_: IdArgument,
    up: Annotated[bool, typer.Option(
        "--up/--down",
        help="--up: what ID was made from (its links); --down: what was made from ID.")] = True,
    depth: Annotated[int | None, typer.Option(
        "--depth", min=0, show_default=False, help="Stop this many links away.")] = None,
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.tree,
    as_json: JsonFlag = False,
) -> None:
    """Show what an object was made from (--up, the default) or what was made from it (--down).

    Objects reached twice are listed again but not expanded ("seen").

    Example: nscas lineage experiments/coop/best --down --depth 2 --format dot | dot -Tsvg
    """
    direction = "up" if up else "down"
    with open_cli_store(ctx, readonly=True) as store:
        root = lineage(store, store.resolve(id_), direction=direction, depth=depth)
    if as_json or fmt is Format.json:
        render.json_out(root.to_json())
    elif fmt is Format.dot:
        render.raw([to_dot(root, direction=direction).encode()])
    else:
        render.tree(_branch(root))


def _branch(node: Node) -> render.Branch:
    label = f"{node.kind or 'blob'} {node.id}"
    if node.via is not None:
        label += f"  via {node.via}"
    if node.seen:
        label += "  (seen)"
    if node.more:
        label += f"  (+{node.more} more)"
    return render.Branch(label=label, children=tuple(_branch(c) for c in node.children))
