"""Lineage: what an object was made from (up) and what was made from it (down).

Up follows a record's links and, for an object a run produced, the receipt that produced it
(``nscas.store.provenance``), then that receipt's action, its inputs and their producers in turn,
so ``lineage --up`` from a checkpoint answers "what made this?", not only "what does it link".
A receipt's own outputs are what it made, so going up does not follow them back down.

The walk is breadth-first: the objects nearest the root are shown first, and a graph stops
growing at ``max_nodes`` (the rest are counted, not drawn), so a picture stays legible.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from nscas.errors import InvalidInput, NotFound
from nscas.objects.digests import Digest
from nscas.store.provenance import producers_of

if TYPE_CHECKING:
    from nscas.store.reading import StoreReader

Direction = Literal["up", "down"]
_MAX_FANOUT = 200  # children listed per node before the rest are summarised
MAX_NODES = 200
"""Objects drawn by default: beyond about this many a picture is no longer readable."""

HIDE_CLASSES: Mapping[str, str] = {
    "blobs": "objects that are not records (file contents, tensors)",
    "code": "the recipes' code trees (an action's $.code) and what they hold",
    "environment": "environment/1 records",
    "journals": "journal/1 records",
    "params": "params/1 records (the tensor lists of checkpoints)",
    "files": "the model directories of checkpoints (a checkpoint's $.files)",
    "trees": "every tree/1 record",
}
"""What ``--hide`` accepts: a class of object, left out together with what only it reaches."""


class Node(NamedTuple):
    id: Digest
    kind: str | None
    via: str | None  # the JSON path of the link that led here
    linked_from: bool = False
    """True when this object links to the node above it (going down, and up from an output
    to the receipt that produced it); False when the node above links to this one."""
    children: tuple[Node, ...] = ()
    seen: bool = False  # already shown elsewhere in this graph: not expanded again
    more: int = 0  # links not expanded because of the depth limit, node limit or fan-out cap
    hidden: int = 0  # links left out by ``hide``
    recipe: str | None = None  # receipts and actions: "<name>@<version>"
    pipeline: str | None = None  # receipts that record it
    step: str | None = None  # receipts that record it
    status: str | None = None  # receipts
    refs: tuple[str, ...] = ()  # ref names that point at this object

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": str(self.id), "kind": self.kind}
        for key in ("recipe", "pipeline", "step", "status"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.refs:
            out["refs"] = list(self.refs)
        if self.via is not None:
            out["via"] = self.via
        if self.linked_from:
            out["linked_from"] = True
        if self.seen:
            out["seen"] = True
        if self.more:
            out["more"] = self.more
        if self.hidden:
            out["hidden"] = self.hidden
        if self.children:
            out["children"] = [c.to_json() for c in self.children]
        return out


def parse_hide(text: str) -> frozenset[str]:
    """``blobs,code`` -> the classes; an unknown one is bad input naming the known ones."""
    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    unknown = sorted(names - HIDE_CLASSES.keys())
    if unknown:
        raise InvalidInput(f"cannot hide {', '.join(map(repr, unknown))}: the classes are "
                           f"{', '.join(HIDE_CLASSES)}")
    return names


class _Edge(NamedTuple):
    via: str
    target: Digest
    linked_from: bool


_LABELLED = frozenset({"receipt/1", "action/1"})  # records read for their labels


def lineage(store: StoreReader, oid: Digest, *, direction: Direction = "up",
            depth: int | None = None, hide: Collection[str] = (),
            max_nodes: int | None = MAX_NODES) -> Node:
    """A tree of links from ``oid``, breadth first: up follows a record's links and the
    receipt that produced an object; down finds the records that link to it.

    ``hide``: classes of ``HIDE_CLASSES`` to leave out (counted in ``hidden``); ``depth``:
    links from the root; ``max_nodes``: objects shown at most (None: no limit).

    The store is read a level at a time, whatever its width: up, two statements a level (its
    links, and the producers of its outputs, each with the kinds of what they reach and the
    records of the receipts and actions among them), down one (the links to it, the same
    way); not a few per object: on PostgreSQL each statement is a round trip."""
    kinds: dict[Digest, str | None] = {}
    records: dict[Digest, dict[str, Any]] = {}

    def learn_kinds(ids: list[Digest]) -> None:
        # Records already read name their kind; the rest are read with their labels at once.
        for i in ids:
            if i not in kinds and i in records:
                kinds[i] = records[i].get("nscas")
        unknown = [i for i in dict.fromkeys(ids) if i not in kinds]
        found, labelled = store.kinds_and_records(unknown, _LABELLED)
        records.update(labelled)
        for i in unknown:
            if i not in found:
                raise NotFound(str(i))
            kinds[i] = found[i]

    def learn_records(ids: list[Digest]) -> None:
        records.update(store.get_records([i for i in dict.fromkeys(ids) if i not in records]))

    def level_edges(level: list[Digest]) -> dict[Digest, list[_Edge]]:
        # Each read also learns the kinds of what its links reach, with the labelled records
        # (so the next level's receipts and actions are read already).
        if direction == "down":
            parents = store.linked(level, "to", _LABELLED, limit=_MAX_FANOUT + 1)
            kinds.update(parents.kinds)
            records.update(parents.records)
            return {n: [_Edge(via=lk.path, target=lk.parent, linked_from=True) for lk in found]
                    for n, found in parents.links.items()}
        out: dict[Digest, list[_Edge]] = {n: [] for n in level}
        made = producers_of(store, [n for n in level if kinds[n] != "receipt/1"], records)
        firsts = {n: p.first for n, p in made.items() if p.first is not None}
        for n, receipt in firsts.items():
            outputs = records[receipt]["outputs"]
            name = min(k for k, v in outputs.items() if v == str(n))
            out[n].append(_Edge(via=f"$.outputs.{name}", target=receipt, linked_from=True))
        children = store.linked([n for n in level if kinds[n] is not None], "from", _LABELLED)
        kinds.update(children.kinds)
        records.update(children.records)
        for n, found in children.links.items():
            out[n] += [_Edge(via=lk.path, target=lk.child, linked_from=False) for lk in found
                       if not (kinds[n] == "receipt/1" and lk.path.startswith("$.outputs."))]
        return out

    def hidden(edge: _Edge) -> bool:
        if not hide:
            return False
        if "code" in hide and edge.via == "$.code" and not edge.linked_from:
            return True
        if "files" in hide and edge.via == "$.files" and not edge.linked_from:
            return True
        kind = kinds[edge.target]
        return (("blobs" in hide and kind is None)
                or ("environment" in hide and kind == "environment/1")
                or ("journals" in hide and kind == "journal/1")
                or ("params" in hide and kind == "params/1")
                or ("trees" in hide and kind == "tree/1"))

    # Breadth first: which links each object shows, and who shows an object first.
    shown: dict[Digest, list[_Edge]] = {}
    counts: dict[Digest, tuple[int, int]] = {}  # (more, hidden)
    owner: dict[Digest, Digest | None] = {oid: None}
    learn_kinds([oid])
    level, n_level = [oid], 0
    while level:
        found_edges = level_edges(level)
        learn_kinds([e.target for edges in found_edges.values() for e in edges])
        following: list[Digest] = []
        for node_id in level:
            visible = [e for e in found_edges[node_id] if not hidden(e)]
            n_hidden = len(found_edges[node_id]) - len(visible)
            if depth is not None and n_level >= depth:
                shown[node_id], counts[node_id] = [], (len(visible), n_hidden)
                continue
            keep: list[_Edge] = []
            for edge in visible[:_MAX_FANOUT]:
                if edge.target not in owner:
                    if max_nodes is not None and len(owner) >= max_nodes:
                        continue
                    owner[edge.target] = node_id
                    following.append(edge.target)
                keep.append(edge)
            shown[node_id], counts[node_id] = keep, (len(visible) - len(keep), n_hidden)
        level, n_level = following, n_level + 1

    # Every shown receipt is labelled with its action's recipe.
    learn_records([Digest.parse(records[n]["action"]) for n in owner
                   if kinds[n] == "receipt/1" and isinstance(records[n].get("action"), str)])
    refs: dict[Digest, list[str]] = {}
    for name, target in store.ref_list():
        if target in owner:
            refs.setdefault(target, []).append(name)

    def build(node_id: Digest, via: str | None, linked_from: bool, parent: Digest | None) -> Node:
        kind = kinds[node_id]
        base: dict[str, Any] = {"id": node_id, "kind": kind, "via": via,
                                "linked_from": linked_from,
                                "refs": tuple(sorted(refs.get(node_id, ()))),
                                **_labels(kind, records.get(node_id) if kind in _LABELLED else None,
                                        records)}
        if owner.get(node_id, "") != parent or node_id not in shown:
            # shown under another object (or not expanded at all: beyond the node limit)
            return Node(**base, seen=node_id in shown)
        more, n_hidden = counts[node_id]
        children = tuple(build(e.target, e.via, e.linked_from, node_id)
                         for e in shown[node_id])
        return Node(**base, children=children, more=more, hidden=n_hidden)

    return build(oid, None, False, None)


def _labels(kind: str | None, rec: dict[str, Any] | None,
            records: Mapping[Digest, dict[str, Any]]) -> dict[str, Any]:
    if rec is None:
        return {}
    if kind == "action/1":
        return {"recipe": rec.get("recipe")}
    action = rec.get("action")
    recipe = None
    if isinstance(action, str):
        recipe = records[Digest.parse(action)].get("recipe")
    return {"recipe": recipe, "status": rec.get("status"),
            "pipeline": rec.get("pipeline") if isinstance(rec.get("pipeline"), str) else None,
            "step": rec.get("step") if isinstance(rec.get("step"), str) else None}


def describe(node: Node) -> list[str]:
    """The lines that name a node for people: kind (and status), recipe, step, refs."""
    head = node.kind or "blob"
    if node.status is not None:
        head += f" ({node.status})"
    lines = [head]
    if node.recipe is not None:
        lines.append(node.recipe)
    if node.step is not None:
        lines.append(f"step {node.pipeline}/{node.step}" if node.pipeline else f"step {node.step}")
    lines += [f"ref {r}" for r in node.refs]
    return lines


_STYLE = {
    "receipt/1": 'shape=box, style="rounded,filled,bold", fillcolor="#d9f2d9"',
    "action/1": 'shape=box, style="rounded,filled", fillcolor="#dde8f7"',
    "checkpoint/1": 'shape=box3d, style=filled, fillcolor="#fff2cc"',
    "tasks/1": 'shape=note, style=filled, fillcolor="#f3e5f5"',
    "commitment/1": 'shape=octagon, style=filled, fillcolor="#ffe0cc"',
    None: 'shape=box, fontsize=9, color="#999999", fontcolor="#555555"',
}
_BLOBS_DRAWN = 3  # more leaf blobs than this under one object are drawn as one node
_FAILED = 'shape=box, style="rounded,filled,bold", fillcolor="#f8d0d0"'


def to_dot(root: Node, *, direction: Direction = "up") -> str:
    """Graphviz dot: one node per object, labelled with kind, recipe, step and refs; one edge
    per link, drawn from the record that holds it to what it names, labelled with its path
    (``direction`` is kept for callers; edges follow the links either way)."""
    del direction
    lines = ["digraph lineage {", "  rankdir=LR;", "  ranksep=0.4; nodesep=0.15;",
             '  node [shape=box, fontname="Helvetica", fontsize=11, margin="0.12,0.05"];',
             '  edge [fontname="Helvetica", fontsize=9, color="#666666", fontcolor="#444444"];']
    nodes: dict[str, str] = {}
    edges: list[str] = []

    def node_line(n: Node) -> None:
        key = str(n.id)
        if key in nodes and not n.children:
            return
        extra = [f"+{n.more} more"] if n.more else []
        extra += [f"{n.hidden} hidden"] if n.hidden else []
        lines = [*describe(n), n.id.short] + ([f"({', '.join(extra)})"] if extra else [])
        label = "\\n".join(_escape(x) for x in lines)
        style = _FAILED if n.status == "failed" else _STYLE.get(n.kind, "shape=box")
        if n is root:
            style += ", penwidth=3"
        nodes[key] = f'  "{key}" [label="{label}", {style}];'

    def visit(n: Node) -> None:
        node_line(n)
        leaves = [c for c in n.children if c.kind is None and not c.children and not c.refs]
        if len(leaves) > _BLOBS_DRAWN:  # one node for many blobs: tensors, a tree's files
            stub = f"{n.id}/blobs"
            nodes[stub] = (f'  "{stub}" [label="{len(leaves)} blobs", {_STYLE[None]}, '
                           'style=dashed];')
            edges.append(f'  "{n.id}" -> "{stub}" [label="{len(leaves)} links"];')
        else:
            leaves = []
        for c in n.children:
            if any(c is leaf for leaf in leaves):
                continue
            node_line(c)
            a, b = (c.id, n.id) if c.linked_from else (n.id, c.id)
            edges.append(f'  "{a}" -> "{b}" [label="{_escape(_short_path(c.via or ""))}"];')
            visit(c)

    visit(root)
    return "\n".join([*lines, *nodes.values(), *dict.fromkeys(edges), "}"]) + "\n"


def _short_path(path: str) -> str:
    return path[2:] if path.startswith("$.") else path


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')
