"""The lineage page draws the graph ``nscas lineage --format dot`` gives: same nodes, same
labels, same edges; and its layout keeps boxes apart."""

from __future__ import annotations

import itertools
import re

import pytest

from nscas.store.lineage import lineage, to_dot
from nscas.ui.graph import BOX_W, build_graph, drawn_edges
from tests.ui.conftest import Demo

NODE = re.compile(r'^  "([^"]+)" \[label="((?:[^"\\]|\\.)*)"', re.M)
EDGE = re.compile(r'^  "([^"]+)" -> "([^"]+)" \[label="((?:[^"\\]|\\.)*)"\];$', re.M)


def dot_graph(text: str) -> tuple[dict[str, tuple[str, ...]], set[tuple[str, str, str]]]:
    nodes = {k: tuple(unescape(x) for x in label.split("\\n")) for k, label in NODE.findall(text)}
    return nodes, {(a, b, unescape(label)) for a, b, label in EDGE.findall(text)}


def unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


@pytest.mark.parametrize("case", ["up", "down", "hidden", "small"])
def test_same_graph_as_dot(demo: Demo, case: str) -> None:
    oid, kwargs = {
        "up": (demo.receipt("eval-again"), {}),
        "down": (demo.output("prepare", "test"), {"direction": "down"}),
        "hidden": (demo.output("train", "checkpoint"), {"hide": {"code", "params"}}),
        "small": (demo.receipt("train"), {"max_nodes": 6, "depth": 2}),
    }[case]
    root = lineage(demo.store, oid, **kwargs)
    nodes, edges = dot_graph(to_dot(root))
    graph = build_graph([(root, 0)])
    assert {n.key: n.lines if not n.blobs else (f"{n.blobs} blobs",) for n in graph.nodes} == nodes
    assert {(e.source, e.target, e.label) for e in graph.edges} == edges
    assert sum(n.root for n in graph.nodes) == 1


def test_layout_keeps_boxes_apart(demo: Demo) -> None:
    graph = build_graph([(lineage(demo.store, demo.receipt("eval-again")), 0)])
    by_column: dict[float, list[tuple[float, float]]] = {}
    for n in graph.nodes:
        by_column.setdefault(n.x, []).append((n.y, n.y + n.height))
        assert n.x >= 0 and n.x + BOX_W <= graph.width and n.y + n.height <= graph.height
    for spans in by_column.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    assert len(drawn_edges(graph)) == len(graph.edges)
