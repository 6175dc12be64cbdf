"""``verify`` redoes a conversations selection from the corpus and rechecks a probes run.

Tampering goes through the store API (new, well-formed objects), so integrity holds and only
recomputation can catch it: another selection, another seed, a changed claim; another
prompt, answer or decoding.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from nscas.recipes.common.conversations import conversations_jsonl
from nscas.verifiers.core.results import Report
from nscas.verifiers.verify import exit_code, verify
from tests.pipelines import step, tiny_pipeline
from tests.recipes.test_conversations_select import _run

from .conftest import Pipeline

PIPELINE = (tiny_pipeline()
            + step("select", "conversations",
                   params={"replay_count": 8, "retention_count": 4, "max_length": 256},
                   inputs={"corpus": "data/corpus", "tokenizer": "step.init.checkpoint"})
            + step("probes", "probes", params={"max_new_tokens": 8},
                   inputs={"model": "step.init.checkpoint"}))


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    root = tmp_path_factory.mktemp("select-verify")
    store, steps = _run(root, PIPELINE)
    yield Pipeline(root=root, store=store, steps=steps)
    store.close()


def failed(report: Report) -> set[str]:
    return {c.name for c in report.checks if c.status == "failed"}


def statuses(report: Report) -> dict[str, str]:
    return {c.name: c.status for c in report.checks}


def _name(recipe: str, receipt: str) -> str:
    return f"{recipe}.{receipt[7:15]}"


def _with(p: Pipeline, receipt: str, *, outputs: dict[str, str] | None = None,
          params: dict[str, Any] | None = None, claims: dict[str, Any] | None = None) -> str:
    rec = p.record(receipt)
    changes: dict[str, Any] = {}
    if outputs:
        changes["outputs"] = {**rec["outputs"], **outputs}
    if params:
        action = p.record(rec["action"])
        changes["action"] = p.reput(rec["action"], params={**action["params"], **params})
    if claims:
        changes["claims"] = {k: {**v, "value": claims.get(k, v["value"])}
                             for k, v in rec["claims"].items()}
    return p.reput(receipt, **changes)


def test_honest_runs_pass(ran: Pipeline) -> None:
    for recipe, step_name in (("conversations", "select"), ("probes", "probes")):
        receipt = ran.receipt(step_name)
        report = verify(receipt, store=ran.store_dir)
        assert exit_code(report) == 0, failed(report)
        name = _name(recipe, receipt)
        s = statuses(report)
        if recipe == "conversations":
            assert s[f"{name}.reselected"] == "passed" and s[f"{name}.sets"] == "passed"
            assert s[f"{name}.claims.skipped"] == "passed"
        else:
            assert s[f"{name}.prompts"] == "passed" and s[f"{name}.retention"] == "passed"
            assert s[f"{name}.answers.output_ids"] == "skipped"


def test_another_selection_fails(ran: Pipeline) -> None:
    receipt = ran.receipt("select")
    replay = ran.jsonl(ran.output("select", "replay"))
    retention = ran.jsonl(ran.output("select", "retention"))
    # Swap one replay and one retention conversation: same counts, shapes, lengths.
    swapped = {"replay": [retention[0], *replay[1:]], "retention": [replay[0], *retention[1:]]}
    outputs = {k: str(ran.store.put_bytes(conversations_jsonl(v))) for k, v in swapped.items()}
    report = verify(_with(ran, receipt, outputs=outputs), store=ran.store_dir)
    assert f"{_name('conversations', _with(ran, receipt, outputs=outputs))}.reselected" in failed(report)


@pytest.mark.parametrize("change", [{"seed": 6}, {"min_turns": 2}, {"max_length": 20}])
def test_params_the_selection_does_not_follow_fail(ran: Pipeline, change: dict[str, int]) -> None:
    tampered = _with(ran, ran.receipt("select"), params=change)
    report = verify(tampered, store=ran.store_dir)
    assert exit_code(report) == 1
    bad = failed(report)
    name = _name("conversations", tampered)
    assert f"{name}.reselected" in bad or f"{name}.sets" in bad or f"{name}.selection" in bad


@pytest.mark.parametrize(("claim", "value"), [("eligible", 44), ("skipped", {"bad_id": 9}),
                                              ("considered", 1), ("replay_tokens", 1)])
def test_a_changed_claim_fails(ran: Pipeline, claim: str, value: Any) -> None:
    tampered = _with(ran, ran.receipt("select"), claims={claim: value})
    report = verify(tampered, store=ran.store_dir)
    assert f"{_name('conversations', tampered)}.claims.{claim}" in failed(report)


def test_an_overlong_conversation_fails(ran: Pipeline) -> None:
    receipt = ran.receipt("select")
    replay = ran.jsonl(ran.output("select", "replay"))
    replay[0]["messages"][1]["content"] += " word" * 400
    outputs = {"replay": str(ran.store.put_bytes(conversations_jsonl(replay)))}
    tampered = _with(ran, receipt, outputs=outputs)
    assert f"{_name('conversations', tampered)}.sets" in failed(verify(tampered, store=ran.store_dir))


def _probes_with(ran: Pipeline, **blobs: bytes) -> str:
    outputs = {k: str(ran.store.put_bytes(v)) for k, v in blobs.items()}
    return _with(ran, ran.receipt("probes"), outputs=outputs)


def test_other_prompts_fail(ran: Pipeline) -> None:
    prompts = json.loads(ran.store.get_bytes(ran.steps["probes"].outputs["prompts"]))
    prompts["prompts"][0]["prompt"] = "What is the capital of France?"
    tampered = _probes_with(ran, prompts=json.dumps(prompts, indent=1).encode() + b"\n")
    report = verify(tampered, store=ran.store_dir)
    assert f"{_name('probes', tampered)}.probes" in failed(report)


def test_another_answer_fails(ran: Pipeline) -> None:
    lines = ran.jsonl(ran.output("probes", "retention"))
    lines[0]["messages"][1]["content"] = "Canberra."
    tampered = _probes_with(ran, retention=conversations_jsonl(lines))
    assert f"{_name('probes', tampered)}.retention" in failed(verify(tampered, store=ran.store_dir))
    # The same answer in the generations too: it no longer decodes from the output ids.
    gens = ran.jsonl(ran.output("probes", "generations"))
    gens[0]["text"] = "Canberra."
    both = _probes_with(ran, retention=conversations_jsonl(lines),
                        generations="".join(json.dumps(g) + "\n" for g in gens).encode())
    report = verify(both, store=ran.store_dir)
    name = _name("probes", both)
    assert f"{name}.answers.decoded" in failed(report)
