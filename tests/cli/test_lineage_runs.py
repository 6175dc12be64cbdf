"""``nscas lineage`` answers "what made this?": up from an output to the run that produced
it, its action, inputs and code; labels; ``--hide``; ``--max-nodes``; the dot text."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import Nscas, assert_user_error
from tests.cli.example_recipe import wordcount

__all__ = ["wordcount"]

_PIPELINE = """name = "words"
[[step]]
name = "count"
recipe = "wordcount"
inputs = { text = "texts/a" }
outputs = { counts = "words/count" }
"""


@pytest.fixture
def ran(nscas: Nscas, tmp_path: Path, wordcount: str) -> dict[str, Any]:
    (tmp_path / "a.txt").write_text("the cat and the dog\n")
    text = nscas("add", str(tmp_path / "a.txt"), "--ref", "texts/a", "--json").json()[0]["id"]
    (tmp_path / "words.toml").write_text(_PIPELINE)
    (step,) = nscas("run", str(tmp_path / "words.toml"), "--json").json()
    return {"text": text, **step}


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node, *(n for c in node.get("children", []) for n in _nodes(c))]


def test_up_from_an_output_reaches_its_run(nscas: Nscas, ran: dict[str, Any]) -> None:
    root = nscas("lineage", "words/count", "--json").json()
    assert (root["id"], root["kind"], root["refs"]) == (ran["outputs"]["counts"], None,
                                                        ["words/count"])
    (receipt,) = root["children"]  # a blob links nothing: its producer is all there is
    assert receipt == {**receipt, "id": ran["receipt"], "kind": "receipt/1",
                       "via": "$.outputs.counts", "linked_from": True, "recipe": "wordcount@1",
                       "pipeline": "words", "step": "count", "status": "succeeded"}
    below = {c["via"]: c for c in receipt["children"]}
    assert set(below) == {"$.action", "$.environment"}  # its outputs are not followed up
    action = below["$.action"]
    assert (action["id"], action["recipe"]) == (ran["action"], "wordcount@1")
    inputs = {c["via"]: c for c in action["children"]}
    assert inputs["$.inputs.text"]["id"] == ran["text"]
    assert inputs["$.inputs.text"]["refs"] == ["texts/a"]
    assert inputs["$.code"]["kind"] == "tree/1"
    # Going down from the input reaches the action and, through it, the receipt.
    down = nscas("lineage", "texts/a", "--down", "--json").json()
    assert ran["receipt"] in {n["id"] for n in _nodes(down)}


def test_hide_leaves_out_classes_and_counts_them(nscas: Nscas, ran: dict[str, Any]) -> None:
    full = _nodes(nscas("lineage", "words/count", "--json").json())
    hidden = nscas("lineage", "words/count", "--hide", "code,environment", "--json").json()
    kept = _nodes(hidden)
    assert not any(n["kind"] == "environment/1" for n in kept)
    assert len(kept) < len(full) - 10  # the code tree and its files are gone
    receipt = hidden["children"][0]
    action = receipt["children"][0]
    assert (receipt["hidden"], action["hidden"]) == (1, 1)
    assert [c["via"] for c in action["children"]] == ["$.inputs.text"]
    tree = nscas("lineage", "words/count", "--hide", "blobs,code").stdout
    action_line = next(line for line in tree.splitlines() if "action/1" in line)
    assert action_line.endswith("via $.action  (2 hidden)")  # its code and its text input
    assert_user_error(nscas("lineage", "words/count", "--hide", "code,tensors"),
                      "cannot hide 'tensors'", "blobs, code")


def test_tree_labels_name_kind_recipe_step_and_refs(nscas: Nscas, ran: dict[str, Any]) -> None:
    lines = nscas("lineage", "words/count", "--depth", "2").stdout.splitlines()
    assert lines[0] == f"blob {ran['outputs']['counts']}  [ref words/count]"
    assert lines[1].startswith(f"`-- receipt/1 (succeeded) {ran['receipt']}  "
                               "[wordcount@1, step words/count]  produced it as $.outputs.counts")


def test_dot_is_well_formed_and_labelled(nscas: Nscas, ran: dict[str, Any]) -> None:
    dot = nscas("lineage", "words/count", "--format", "dot").stdout
    assert dot.startswith("digraph lineage {\n") and dot.endswith("}\n")
    declared = set(re.findall(r'^  "([^"]+)" \[label=', dot, re.M))
    edges = re.findall(r'^  "([^"]+)" -> "([^"]+)" \[label="([^"]*)"\];', dot, re.M)
    assert edges and all(a in declared and b in declared for a, b, _ in edges)
    # Edges run from the record holding a link to what it names: receipt -> its output.
    assert (ran["receipt"], ran["outputs"]["counts"], "outputs.counts") in edges
    assert (ran["action"], ran["text"], "inputs.text") in edges
    receipt = re.search(rf'^  "{ran["receipt"]}" \[label="([^"]+)"', dot, re.M)
    assert receipt is not None
    assert receipt.group(1).split("\\n") == ["receipt/1 (succeeded)", "wordcount@1",
                                             "step words/count", ran["receipt"][7:19]]
    # The code tree's many files are one node, not one each.
    assert re.search(r'\[label="\d+ blobs"', dot)
    assert dot.count("shape=box, fontsize=9") < 6


def test_a_large_graph_stops_at_max_nodes(nscas: Nscas, tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.mkdir()
    for i in range(300):
        (big / f"f{i:03}.txt").write_text(f"file {i}\n")
    nscas("add", str(big), "--ref", "big")
    root = nscas("lineage", "big", "--json").json()
    assert len(_nodes(root)) == 200
    assert root["more"] == 101  # 300 files, 199 shown beside the root
    small = nscas("lineage", "big", "--max-nodes", "10", "--json").json()
    assert (len(_nodes(small)), small["more"]) == (10, 291)
    dot = nscas("lineage", "big", "--format", "dot").stdout
    assert dot.count("[label=") < 10  # 199 leaf files drawn as one node
    assert '[label="199 blobs"' in dot and "+101 more" in dot
