"""Lineage: what an object was made from (up) and what was made from it (down)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from nscas.digests import Digest

if TYPE_CHECKING:
    from nscas.reading import StoreReader

Direction = Literal["up", "down"]
_MAX_FANOUT = 200  # children listed per node before the rest are summarised


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    id: Digest
    kind: str | None
    via: str | None  # the JSON path of the link that led here
    children: tuple[Node, ...] = field(default=())
    seen: bool = False  # already shown elsewhere in this graph: not expanded again
    more: int = 0  # links not expanded because of the depth limit or fan-out cap

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": str(self.id), "kind": self.kind}
        if self.via is not None:
            out["via"] = self.via
        if self.seen:
            out["seen"] = True
        if self.more:
            out["more"] = self.more
        if self.children:
            out["children"] = [c.to_json() for c in self.children]
        return out


def lineage(store: StoreReader, oid: Digest, *, direction: Direction = "up", depth: int | None = None) -> Node:
    """A tree of links from ``oid``: up follows a record's links, down finds records linking to it."""
    seen: set[Digest] = set()

    def walk(node_id: Digest, via: str | None, level: int) -> Node:
        kind = store.info(node_id).kind
        if node_id in seen:
            return Node(id=node_id, kind=kind, via=via, seen=True)
        seen.add(node_id)
        if direction == "up":
            edges = [(lk.path, lk.child) for lk in store.links_from(node_id)] if kind else []
        else:
            edges = [(lk.path, lk.parent) for lk in store.links_to(node_id, limit=_MAX_FANOUT + 1)]
        if depth is not None and level >= depth:
            return Node(id=node_id, kind=kind, via=via, more=len(edges))
        shown = edges[:_MAX_FANOUT]
        children = tuple(walk(target, path, level + 1) for path, target in shown)
        return Node(id=node_id, kind=kind, via=via, children=children, more=len(edges) - len(shown))

    return walk(oid, None, 0)


def to_dot(root: Node, *, direction: Direction = "up") -> str:
    """Graphviz dot: one node per object, one edge per link, labelled with its JSON path."""
    lines = ["digraph lineage {", "  rankdir=LR;", '  node [shape=box, fontname="monospace"];']
    nodes: dict[Digest, str] = {}
    edges: list[str] = []

    def visit(n: Node) -> None:
        if n.id not in nodes:
            label = f"{n.kind or 'blob'}\\n{n.id.short}"
            nodes[n.id] = f'  "{n.id}" [label="{label}"];'
        for c in n.children:
            a, b = (n.id, c.id) if direction == "up" else (c.id, n.id)
            edges.append(f'  "{a}" -> "{b}" [label="{_escape(c.via or "")}"];')
            visit(c)

    visit(root)
    return "\n".join([*lines, *nodes.values(), *dict.fromkeys(edges), "}"]) + "\n"


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')
