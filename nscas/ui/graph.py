"""The lineage page's graph: ``nscas.store.lineage``'s tree as nodes, edges and a layered layout.

The nodes and edges are exactly those ``nscas.store.lineage.to_dot`` draws for the same tree (one node
per object, first appearance wins unless a later one is expanded; one edge per link from the
record that holds it; more than ``_BLOBS_DRAWN`` leaf blobs under one object as one node), so the
page shows the graph ``nscas lineage --format dot`` gives; tests/ui/test_graph.py holds them
equal. Nothing here walks the store: the walk is ``nscas.store.lineage.lineage``'s.

The layout is a layered one, left to right by distance from the root: each column is ordered by
where its nodes' parents sit, then spaced so that no two boxes overlap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nscas.objects.digests import Digest
from nscas.store.lineage import Node, describe

BLOBS_DRAWN = 3
"""As ``nscas.store.lineage.to_dot``: more leaf blobs than this under one object are one node."""
COLUMN = 300  # px between the left edges of two columns
BOX_W = 232
ROW = 54  # px between the tops of two boxes of a column, at least
LINE = 13  # px per label line
_CHARS = 34  # label characters per line drawn (the full text is in the box's title)


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphNode:
    key: str
    """The object's ID, or ``<ID>/blobs`` for the node standing for many leaf blobs."""
    oid: Digest | None
    """The object drawn (None for a node of many blobs)."""
    lines: tuple[str, ...]
    """Its label, as the dot output writes it: kind (status), recipe, step, refs, short ID,
    and ``(+N more, M hidden)``."""
    kind: str | None
    status: str | None
    more: int
    hidden: int
    root: bool
    blobs: int = 0
    """For a node of many blobs: how many."""
    depth: int = 0
    x: float = 0.0
    y: float = 0.0

    @property
    def css(self) -> str:
        """The box's class: its kind, or failed, or blobs."""
        if self.blobs:
            return "k-blobs"
        if self.status == "failed":
            return "k-failed"
        return "k-" + (self.kind or "blob").replace("/1", "").replace("/", "-")

    @property
    def height(self) -> float:
        return 10 + LINE * len(self.shown_lines)

    @property
    def shown_lines(self) -> tuple[str, ...]:
        cut = [t if len(t) <= _CHARS else t[:_CHARS - 1] + "…" for t in self.lines[:5]]
        if len(self.lines) > 5:
            cut[-1] = f"… {len(self.lines) - 4} more lines"
        return tuple(cut)


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphEdge:
    source: str
    target: str
    label: str
    """The link's path without ``$.`` (``inputs.model``), or ``N links``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Graph:
    nodes: tuple[GraphNode, ...]
    edges: tuple[GraphEdge, ...]
    width: float
    height: float

    def node(self, key: str) -> GraphNode:
        return next(n for n in self.nodes if n.key == key)


@dataclass(slots=True)
class _Draft:
    node: GraphNode
    parent: str | None
    order: int


def build_graph(trees: Sequence[tuple[Node, int]]) -> Graph:
    """The graph of one or more lineage trees (each with the depth its root sits at: an
    expanded node's own tree joins the graph where that node already is), laid out."""
    drafts: dict[str, _Draft] = {}
    edges: dict[tuple[str, str, str], GraphEdge] = {}
    counter = 0
    root_key = str(trees[0][0].id) if trees else None

    def put(n: Node, depth: int, parent: str | None) -> None:
        nonlocal counter
        key = str(n.id)
        if key in drafts and not n.children:
            return
        extra = [f"+{n.more} more"] if n.more else []
        extra += [f"{n.hidden} hidden"] if n.hidden else []
        lines = (*describe(n), n.id.short, *([f"({', '.join(extra)})"] if extra else []))
        old = drafts.get(key)
        node = GraphNode(key=key, oid=n.id, lines=lines, kind=n.kind, status=n.status,
                         more=n.more, hidden=n.hidden, root=key == root_key,
                         depth=old.node.depth if old else depth)
        counter += 1
        drafts[key] = _Draft(node=node, parent=old.parent if old else parent,
                             order=old.order if old else counter)

    def edge(source: str, target: str, label: str) -> None:
        edges.setdefault((source, target, label), GraphEdge(source=source, target=target,
                                                            label=label))

    def visit(n: Node, depth: int) -> None:
        nonlocal counter
        key = str(n.id)
        put(n, depth, None)
        leaves = [c for c in n.children if c.kind is None and not c.children and not c.refs]
        if len(leaves) > BLOBS_DRAWN:
            stub = f"{n.id}/blobs"
            counter += 1
            drafts.setdefault(stub, _Draft(node=GraphNode(
                key=stub, oid=None, lines=(f"{len(leaves)} blobs",), kind=None, status=None,
                more=0, hidden=0, root=False, blobs=len(leaves),
                depth=drafts[key].node.depth + 1), parent=key, order=counter))
            edge(key, stub, f"{len(leaves)} links")
        else:
            leaves = []
        here = drafts[key].node.depth
        for c in n.children:
            if any(c is leaf for leaf in leaves):
                continue
            put(c, here + 1, key)
            a, b = (str(c.id), key) if c.linked_from else (key, str(c.id))
            edge(a, b, _short_path(c.via or ""))
            visit(c, here + 1)

    for tree, depth in trees:
        if str(tree.id) in drafts:
            depth = drafts[str(tree.id)].node.depth
        visit(tree, depth)
    return _layout(drafts, tuple(edges.values()))


def _layout(drafts: dict[str, _Draft], edges: tuple[GraphEdge, ...]) -> Graph:
    columns: dict[int, list[_Draft]] = {}
    for d in drafts.values():
        columns.setdefault(d.node.depth, []).append(d)
    y_of: dict[str, float] = {}
    placed: dict[str, GraphNode] = {}
    height = 0.0
    for depth in sorted(columns):
        column = columns[depth]
        # Where each node would like to be: level with its parent, siblings in walk order.
        column.sort(key=lambda d: (y_of.get(d.parent or "", 0.0), d.order))
        y = 20.0
        for d in column:
            want = y_of.get(d.parent or "", 20.0)
            y = max(y, want)
            y_of[d.node.key] = y
            placed[d.node.key] = _at(d.node, 20.0 + depth * COLUMN, y)
            y += max(ROW, d.node.height + 12)
        height = max(height, y)
    width = 40.0 + (max(columns, default=0) * COLUMN) + BOX_W
    order = sorted(drafts.values(), key=lambda d: d.order)
    return Graph(nodes=tuple(placed[d.node.key] for d in order), edges=edges, width=width,
                 height=height + 20)


def _at(node: GraphNode, x: float, y: float) -> GraphNode:
    return GraphNode(key=node.key, oid=node.oid, lines=node.lines, kind=node.kind,
                     status=node.status, more=node.more, hidden=node.hidden, root=node.root,
                     blobs=node.blobs, depth=node.depth, x=x, y=y)


def _short_path(path: str) -> str:
    return path[2:] if path.startswith("$.") else path


@dataclass(frozen=True, slots=True, kw_only=True)
class DrawnEdge:
    edge: GraphEdge
    d: str
    """The SVG path, from the side of the source box to the side of the target box."""
    label_x: float
    label_y: float


def drawn_edges(graph: Graph) -> tuple[DrawnEdge, ...]:
    """Each edge as a curve between its boxes (left to right, or back when it points back)."""
    at = {n.key: n for n in graph.nodes}
    out = []
    for e in graph.edges:
        a, b = at.get(e.source), at.get(e.target)
        if a is None or b is None:
            continue
        ay, by = a.y + a.height / 2, b.y + b.height / 2
        if b.x >= a.x + BOX_W:
            ax, bx = a.x + BOX_W, b.x
        elif a.x >= b.x + BOX_W:
            ax, bx = a.x, b.x + BOX_W
        else:  # same column: out of the right side and back in
            ax, bx = a.x + BOX_W, b.x + BOX_W
        bend = max(40.0, abs(bx - ax) / 2)
        c1 = ax + (bend if ax <= bx or ax == a.x + BOX_W else -bend)
        c2 = bx - (bend if ax <= bx and bx == b.x else -bend)
        out.append(DrawnEdge(edge=e, d=f"M{ax:.1f},{ay:.1f} C{c1:.1f},{ay:.1f} {c2:.1f},{by:.1f} "
                                       f"{bx:.1f},{by:.1f}",
                             label_x=(ax + bx) / 2, label_y=(ay + by) / 2 - 3))
    return tuple(out)
