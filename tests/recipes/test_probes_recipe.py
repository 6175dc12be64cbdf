"""Recipe ``probes``: the tiny seed model's own greedy answers to the published prompt set,
on CPU, as a retention set that ``prepare`` takes."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from nscas.recipes.common.conversations import validate_conversations
from nscas.recipes.conversations.probes import prompt_set, prompt_set_bytes
from nscas.runs.runner import StepResult
from nscas.store.writer import Store
from nscas.verifiers.evaluation.probes import PROMPTS_SHA256
from tests.pipelines import run_pipeline, step, tiny_pipeline

PIPELINE = (tiny_pipeline()
            + step("probes", "probes", params={"max_new_tokens": 12},
                   inputs={"model": "step.init.checkpoint"})
            + step("prepare-probed", "prepare", params={"counts": {"test": 8, "dev": 4, "train": 8}},
                   inputs={"retention": "step.probes.retention"}))


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, dict[str, StepResult]]]:
    store, steps = run_pipeline(tmp_path_factory.mktemp("probes"), PIPELINE)
    yield store, steps
    store.close()


def test_the_prompt_set_is_varied_and_pinned() -> None:
    probes = prompt_set()
    assert 32 <= len(probes) <= 64
    assert len({i for i, _ in probes}) == len({p for _, p in probes}) == len(probes)
    kinds = {pid.split("-")[2] for pid, _ in probes}
    assert {"fact", "math", "code", "advice", "translate", "writing", "reasoning"} <= kinds
    # The verifiers pin the published set: changing it means a new recipe version and pin.
    assert hashlib.sha256(prompt_set_bytes()).hexdigest() == PROMPTS_SHA256


def test_the_answers_become_a_retention_set(ran: tuple[Store, dict[str, StepResult]]) -> None:
    store, steps = ran
    result = steps["probes"]
    assert store.get_bytes(result.outputs["prompts"]) == prompt_set_bytes()
    lines = validate_conversations(store.get_bytes(result.outputs["retention"]))
    gens = [json.loads(x) for x in store.get_bytes(result.outputs["generations"]).splitlines()]
    prompts = dict(prompt_set())
    assert [g["id"] for g in gens] == list(prompts)
    answered = [g for g in gens if g["text"].strip()]
    assert [r["id"] for r in lines] == [g["id"] for g in answered]
    for r, g in zip(lines, answered, strict=True):
        assert r["messages"] == [{"role": "user", "content": prompts[r["id"]]},
                                 {"role": "assistant", "content": g["text"]}]
        assert len(g["output_ids"]) <= 12
    assert result.claims["probes"] == len(lines)
    assert result.claims["dropped"] == [g["id"] for g in gens if not g["text"].strip()]
    record = store.get_record(steps["prepare-probed"].outputs["retention"])
    assert record["standin"] is False and record["ids"] == [r["id"] for r in lines]


def test_the_answers_are_deterministic(ran: tuple[Store, dict[str, StepResult]],
                                       tmp_path: Path) -> None:
    store, steps = ran
    other, again = run_pipeline(tmp_path, PIPELINE)
    try:
        assert (other.get_bytes(again["probes"].outputs["retention"])
                == store.get_bytes(steps["probes"].outputs["retention"]))
    finally:
        other.close()
