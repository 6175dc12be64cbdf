"""``nscas lineage``: the link graph around an object, as a tree, JSON or Graphviz dot."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from nscas.cli import render
from nscas.cli.common import IdArgument, JsonFlag, command_app, open_cli_store
from nscas.store.lineage import HIDE_CLASSES, MAX_NODES

if TYPE_CHECKING:
    from nscas.store.lineage import Node

app = command_app()

NODES_MAX = 1_000_000  # --max-nodes' ceiling


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
        help="--up: what ID was made from (its links and the run that produced it); --down: "
             "what was made from ID.")] = True,
    depth: Annotated[int | None, typer.Option(
        "--depth", min=0, show_default=False, help="Stop this many links away.")] = None,
    hide: Annotated[str, typer.Option(
        "--hide", metavar="CLASSES", show_default=False,
        help="Leave out these classes of object, comma-separated: "
             + "; ".join(f"{k}: {v}" for k, v in HIDE_CLASSES.items()) + ".")] = "",
    max_nodes: Annotated[int, typer.Option(
        "--max-nodes", min=1, max=NODES_MAX,
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
    from nscas.store import lineage as graph

    hidden = graph.parse_hide(hide)
    direction: Literal["up", "down"] = "up" if up else "down"
    with open_cli_store(ctx, readonly=True) as reader:
        root = graph.lineage(reader, reader.resolve(id_), direction=direction, depth=depth,
                             hide=hidden, max_nodes=max_nodes)
    if as_json or fmt is Format.json:
        render.json_out(root.to_json())
    elif fmt is Format.dot:
        render.raw([graph.to_dot(root, direction=direction).encode()])
    else:
        render.tree(_branch(root))


def _branch(node: Node) -> render.Branch:
    from nscas.store.lineage import describe

    words = describe(node)
    label = " ".join([*words[:1], str(node.id)])
    if len(words) > 1:
        label += "  [" + ", ".join(words[1:]) + "]"
    if node.via is not None:
        produced = node.linked_from and node.via.startswith("$.outputs.")
        label += f"  {'produced it as' if produced else 'via'} {node.via}"
    if node.seen:
        label += "  (seen)"
    if node.more:
        label += f"  (+{node.more} more)"
    if node.hidden:
        label += f"  ({node.hidden} hidden)"
    return render.Branch(label=label, children=tuple(_branch(c) for c in node.children))
