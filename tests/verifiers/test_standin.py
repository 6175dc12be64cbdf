"""``verify`` rebuilds prepare's replay and retention sets from the params (or the inputs).

A prepare run without conversation inputs makes the stand-in sets from ``standin_seed``,
``replay_count`` and ``retention_count``; a receipt whose params say otherwise than its sets,
or whose sets say otherwise than the params, fails ``<prepare>.<kind>.regenerated``. With an
input the set must be that input, line for line. Expectations come from nscas core.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nscas.recipes.common.conversations import conversations_jsonl, standin_conversations
from nscas.runs.runner import run_file
from nscas.verifiers.core.results import Report
from nscas.verifiers.verify import exit_code, verify
from tests.pipelines import prepare_step, run_pipeline

from .conftest import Pipeline

REPLAY, RETENTION = 6, 5


def failed(report: Report) -> set[str]:
    return {c.name for c in report.checks if c.status == "failed"}


def passed(report: Report) -> set[str]:
    return {c.name for c in report.checks if c.status == "passed"}


def label(receipt: str) -> str:
    return f"prepare.{receipt[7:15]}"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    root = tmp_path_factory.mktemp("standin")
    store, steps = run_pipeline(root, prepare_step(replay=REPLAY, retention=RETENTION))
    yield Pipeline(root=root, store=store, steps=steps)
    store.close()


def with_params(p: Pipeline, receipt: str, **changes: Any) -> str:
    """The receipt re-put with its action's params changed (all else as it was)."""
    action = p.record(receipt)["action"]
    params = {**p.record(action)["params"], **changes}
    return p.reput(receipt, action=p.reput(action, params=params))


def test_the_honest_receipt_passes_both_regenerations(prepared: Pipeline) -> None:
    receipt = prepared.receipt("prepare")
    report = verify(receipt, store=prepared.store_dir)
    assert exit_code(report) == 0, failed(report)
    name = label(receipt)
    assert {f"{name}.replay.regenerated", f"{name}.retention.regenerated"} <= passed(report)
    # The run really is the stand-in set nscas makes for these params.
    replay = prepared.record(prepared.output("prepare", "replay"))
    assert replay["standin"] is True
    assert replay["ids"] == [r["id"] for r in standin_conversations("replay", REPLAY, 20260913)]


@pytest.mark.parametrize(("param", "value", "kinds"), [
    ("replay_count", REPLAY + 1, {"replay"}),
    ("replay_count", REPLAY - 1, {"replay"}),
    ("retention_count", RETENTION + 2, {"retention"}),
    ("retention_count", 0, {"retention"}),
    ("standin_seed", 20260914, {"replay", "retention"}),
    ("replay_weight", 2, {"replay"}),
])
def test_a_changed_param_fails_the_regeneration(prepared: Pipeline, param: str, value: int,
                                                kinds: set[str]) -> None:
    tampered = with_params(prepared, prepared.receipt("prepare"), **{param: value})
    report = verify(tampered, store=prepared.store_dir)
    assert exit_code(report) == 1
    name = label(tampered)
    regenerated = {f"{name}.{kind}.regenerated" for kind in ("replay", "retention")}
    assert failed(report) & regenerated == {f"{name}.{kind}.regenerated" for kind in kinds}


def test_a_bad_standin_param_fails_rather_than_crashes(prepared: Pipeline) -> None:
    tampered = with_params(prepared, prepared.receipt("prepare"), standin_seed="20260913")
    report = verify(tampered, store=prepared.store_dir)
    name = label(tampered)
    assert {f"{name}.replay.regenerated", f"{name}.retention.regenerated"} <= failed(report)


def _rewrite_set(p: Pipeline, receipt: str, kind: str, lines: list[dict[str, Any]],
                 **record_changes: Any) -> str:
    """The receipt with output ``kind`` replaced by ``lines``, everything else made consistent:
    the tasks/1 record's count and ids, the prepared commitment and the count claim."""
    rec = p.record(receipt)
    outputs = dict(rec["outputs"])
    blob = str(p.store.put_bytes(conversations_jsonl(lines)))
    outputs[kind] = p.reput(outputs[kind], records=blob, count=len(lines),
                            ids=[line["id"] for line in lines], **record_changes)
    subjects = {**p.record(outputs["prepared"])["subjects"], kind: outputs[kind]}
    outputs["prepared"] = p.reput(outputs["prepared"], subjects=subjects)
    claims = dict(rec["claims"])
    claims[f"{kind}_count"] = {**claims[f"{kind}_count"], "value": len(lines)}
    return p.reput(receipt, outputs=outputs, claims=claims)


def test_a_consistently_rewritten_standin_set_fails(prepared: Pipeline) -> None:
    receipt = prepared.receipt("prepare")
    lines = prepared.jsonl(prepared.record(prepared.output("prepare", "replay"))["records"])
    # One answer changed.
    edited = json.loads(json.dumps(lines))
    edited[2]["messages"][1]["content"] += " Indeed."
    tampered = _rewrite_set(prepared, receipt, "replay", edited)
    report = verify(tampered, store=prepared.store_dir)
    assert f"{label(tampered)}.replay.regenerated" in failed(report)
    # One conversation dropped, with the params changed to match the new count.
    tampered = with_params(prepared, _rewrite_set(prepared, receipt, "replay", lines[:-1]),
                           replay_count=REPLAY - 1)
    report = verify(tampered, store=prepared.store_dir)
    assert f"{label(tampered)}.replay.regenerated" in failed(report)
    # The set nscas makes for another seed, with that seed in the params: the retention set
    # still comes from the old seed.
    other = [{**r, "weight": 1} for r in standin_conversations("replay", REPLAY, 7)]
    note = (f"stand-in: {REPLAY} synthetic conversations generated by nscas (seed 7); "
            "not the published corpus")
    tampered = with_params(prepared, _rewrite_set(prepared, receipt, "replay", other, note=note),
                           standin_seed=7)
    report = verify(tampered, store=prepared.store_dir)
    name = label(tampered)
    assert f"{name}.replay.regenerated" not in failed(report)
    assert f"{name}.retention.regenerated" in failed(report)
    # The stand-in label dropped from the record.
    tampered = _rewrite_set(prepared, receipt, "retention", prepared.jsonl(
        prepared.record(prepared.output("prepare", "retention"))["records"]), standin=False)
    assert f"{label(tampered)}.retention.regenerated" in failed(
        verify(tampered, store=prepared.store_dir))


def _conversation(cid: str, question: str, answer: str) -> dict[str, Any]:
    return {"id": cid, "messages": [{"role": "user", "content": question},
                                    {"role": "assistant", "content": answer}]}


def test_a_set_given_as_input_must_be_that_input(prepared: Pipeline, tmp_path: Path) -> None:
    given = [_conversation(f"c{i}", f"Question {i}?", f"Answer {i} \u00e9.") for i in range(3)]
    blob = prepared.store.put_bytes(conversations_jsonl(given))
    recipe = tmp_path / "prepare-input.toml"
    recipe.write_text('recipe = "prepare"\n[params]\ncounts = { test = 8, dev = 4, train = 8 }\n'
                      f'replay_count = {REPLAY}\nretention_count = {RETENTION}\n'
                      f'replay_weight = 3\n[inputs]\nreplay = "{blob}"\n')
    (result,) = run_file(prepared.store, recipe)
    receipt = str(result.receipt)
    report = verify(receipt, store=prepared.store_dir)
    assert exit_code(report) == 0, failed(report)
    name = label(receipt)
    assert {f"{name}.replay.regenerated", f"{name}.retention.regenerated"} <= passed(report)
    assert prepared.record(str(result.outputs["replay"]))["count"] == len(given)
    # The count param is unused with an input, as in the recipe.
    tampered = with_params(prepared, receipt, replay_count=REPLAY + 3)
    assert f"{label(tampered)}.replay.regenerated" not in failed(
        verify(tampered, store=prepared.store_dir))
    # A line dropped from the set, everything else made consistent.
    lines = [{**c, "weight": 3} for c in given]
    tampered = _rewrite_set(prepared, receipt, "replay", lines[1:])
    assert f"{label(tampered)}.replay.regenerated" in failed(
        verify(tampered, store=prepared.store_dir))
    # Relabelled as a stand-in set.
    tampered = _rewrite_set(prepared, receipt, "replay", lines, standin=True)
    assert f"{label(tampered)}.replay.regenerated" in failed(
        verify(tampered, store=prepared.store_dir))


@pytest.mark.parametrize("kind", ["replay", "retention"])
@pytest.mark.parametrize("seed", [0, -3, 20260913, 2**70])
def test_the_verifier_generator_matches_nscas_byte_for_byte(kind: str, seed: int) -> None:
    from nscas.verifiers.tasks.standin import jsonl_bytes, standin_set

    for count in (0, 1, 40):
        want = standin_conversations(kind, count, seed)
        got = standin_set(kind, count, seed)
        assert jsonl_bytes({**r, "weight": 2} for r in got) == conversations_jsonl(
            {**r, "weight": 2} for r in want)
