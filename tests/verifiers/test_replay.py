"""``verify --replay``: a sample of answers rechecked against the committed weights.

The forged case is the one plain verification cannot catch: an answer whose text and output
ids were rewritten consistently (they decode to each other, the checks agree with the text).
A near tie (two tokens the checkpoint scores alike) must read as consistent, not failed.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from nscas.verifiers.core.runs import Run
from nscas.verifiers.evaluation.scoring import load_tokenizer
from nscas.verifiers.records.closure import Objects
from nscas.verifiers.records.store import StoreSource
from nscas.verifiers.replay.answers import answers_check, replay_answer
from nscas.verifiers.replay.greedy import Tolerance, answer_scores
from nscas.verifiers.replay.models import loaded_model
from nscas.verifiers.replay.options import ReplayOptions, sample_tasks
from nscas.verifiers.replay.receipts import replay_evaluations
from tests.verifiers.conftest import Pipeline, nscas_verify


def run_of(pipeline: Pipeline, step: str, params: dict[str, Any] | None = None,
           **receipt_changes: Any) -> Run:
    oid = pipeline.receipt(step)
    receipt = {**pipeline.record(oid), **receipt_changes}
    action = pipeline.record(receipt["action"])
    action = {**action, "params": {**action["params"], **(params or {})}}
    return Run(id=oid, name=f"evaluate.{oid[7:15]}", receipt=receipt, action=action,
               recipe="evaluate")


def replay(pipeline: Pipeline, *runs: Run, **options: Any) -> list[Any]:
    objects = Objects(StoreSource(pipeline.store_dir))
    return replay_evaluations(objects, runs, ReplayOptions(**{"count": 4, "seed": 7,
                                                               **options}))


def test_every_replayed_answer_of_an_honest_run_is_identical_on_the_cpu(
        pipeline: Pipeline) -> None:
    seen: list[tuple[str, int, int]] = []
    checks = replay(pipeline, run_of(pipeline, "eval-seed"), run_of(pipeline, "eval-again"),
                    count=16, progress=lambda arm, done, total: seen.append((arm, done, total)))
    by_name = {c.name: c for c in checks}
    assert {c.status for c in checks} == {"passed"}, checks
    answers = [c for n, c in by_name.items() if n.endswith(".replay")]
    assert len(answers) == 2 and all(len(c.recomputed["replayed"]) == 16 for c in answers)
    retention = [c for n, c in by_name.items() if n.endswith(".replay.retention")]
    assert len(retention) == 2 and all(c.recomputed < 1e-5 for c in retention), retention
    assert all(c.recomputed["identical"] == c.recomputed["replayed"] for c in answers)
    assert all("16 replayed (seed 7, replayed on cpu in FP32, run in FP32): 16 identical" in c.message
               for c in answers)
    env = by_name["replay.environment"].recomputed
    assert env["device"] == "cpu" and env["seed"] == 7 and env["precision"] == "fp32"
    assert seen[-1][1:] == (16, 16)


def forged_run(pipeline: Pipeline, change: Any, params: dict[str, Any] | None = None
               ) -> tuple[Run, str]:
    """The eval-seed run with ``change(output_ids)`` applied to its second sampled answer
    (without its retention output: the probes' losses are another test's)."""
    honest = run_of(pipeline, "eval-seed", params)
    lines = pipeline.jsonl(honest.outputs["generations"])
    target = sample_tasks([g["id"] for g in lines], ReplayOptions(count=4, seed=7))[1]
    for g in lines:
        if g["id"] == target:  # a consistent forger rewrites the text to follow the ids
            g["output_ids"] = change(g["output_ids"])
    outputs = {k: v for k, v in honest.outputs.items() if k != "retention"}
    return run_of(pipeline, "eval-seed", params,
                  outputs={**outputs, "generations": pipeline.put_jsonl(lines)}), target


def test_a_consistently_rewritten_answer_is_caught(pipeline: Pipeline) -> None:
    run, target = forged_run(pipeline, lambda out: [out[0] + 1, *out[1:]])
    check = replay(pipeline, run)[0]
    assert check.status == "failed" and check.recomputed["failed"] == [target]
    assert "3 identical" in check.message and "1 failed" in check.message
    # Position, both tokens and the deficit, beyond a tolerance a forger gains nothing from.
    assert f"{target}: answer token 0 is " in check.message and "leads it by" in check.message
    assert "not a near tie" in check.message


@pytest.mark.parametrize(("change", "why"), [
    (lambda out: out[:-1], "without a stop token, before max_new_tokens 16"),
    (lambda out: [*out[:5], 2, *out[5:-1]], "answer token 5 is the stop token 2"),
    (lambda out: [*out, out[-1]], "17 answer tokens, beyond max_new_tokens 16"),
])
def test_an_answer_that_breaks_the_stopping_rule_fails(pipeline: Pipeline, change: Any,
                                                         why: str) -> None:
    run, target = forged_run(pipeline, change)
    check = replay(pipeline, run)[0]
    assert check.status == "failed" and check.recomputed["failed"] == [target]
    assert why in check.message


def test_an_exact_tie_taken_the_other_way_is_consistent_not_failed(pipeline: Pipeline) -> None:
    run = run_of(pipeline, "eval-seed")
    objects = Objects(StoreSource(pipeline.store_dir))
    line = pipeline.jsonl(run.outputs["generations"])[0]
    out = line["output_ids"]
    _tokenizer, stops = load_tokenizer(objects, run.inputs["model"])
    tolerance = Tolerance(run="fp32", replay="fp32")
    with loaded_model(objects, run.inputs["model"], "cpu") as model:
        import torch

        # Token b becomes a copy of the greedy first token a (embeddings are tied): the two
        # tie exactly wherever a is scored, and after b the model continues as after a.
        a = out[0]
        b = next(t for t in range(a + 1, model.config.vocab_size) if t not in out and t != 2)
        with torch.no_grad():
            model.get_output_embeddings().weight[b] = model.get_output_embeddings().weight[a]
        retained = {**line, "output_ids": [b, *out[1:]]}
        answer = replay_answer(model, retained, stops=stops, max_new_tokens=16, device="cpu",
                               tolerance=tolerance)
    assert answer.verdict == "consistent", answer.describe()
    first = answer.deviations[0]
    assert first.position == 0 and {first.retained, first.greedy} == {a, b}
    assert first.deficit <= first.tolerance
    check = answers_check("evaluate.x.replay", [answer], [], [], tolerance,
                          ReplayOptions(count=1, seed=7))
    assert check.status == "passed"
    assert "1 replayed (seed 7, replayed on cpu in FP32, run in FP32): 0 identical, 1 consistent " \
        "within near ties (largest deficit" in check.message


def test_a_bf16_run_replayed_in_fp32_leaves_a_small_deficit_unrechecked(
        pipeline: Pipeline) -> None:
    """The run claims CUDA BF16; the CPU replay computes FP32, so deficits beyond two BF16
    ulps but within 32 are not rechecked, and beyond 32 fail (a forged token)."""
    cuda = {"device": "cuda", "precision": "bf16"}
    run = run_of(pipeline, "eval-seed", cuda)
    objects = Objects(StoreSource(pipeline.store_dir))
    lines = pipeline.jsonl(run.outputs["generations"])
    target = sample_tasks([g["id"] for g in lines], ReplayOptions(count=4, seed=7))[1]
    out = next(g for g in lines if g["id"] == target)
    tolerance = Tolerance(run="bf16", replay="fp32")
    with loaded_model(objects, run.inputs["model"], "cpu") as model:
        last = answer_scores(model, out["prompt_ids"], out["output_ids"], "cpu", "fp32")[-1]
    top = float(last.max())
    deficit = top - last
    band = [t for t in range(len(last)) if t != 2
            and tolerance.within(top) < float(deficit[t]) <= tolerance.bound(top)]
    worst = int(last.argmin())  # the last token is the limit's: no stop rule moves
    skipped, _ = forged_run(pipeline, lambda o: [*o[:-1], band[0]], cuda)
    check = replay(pipeline, skipped)[0]
    assert check.status == "skipped" and check.needs == "model", check
    assert "1 not rechecked" in check.message and "--device cuda" in check.message
    failed, _ = forged_run(pipeline, lambda o: [*o[:-1], worst], cuda)
    assert replay(pipeline, failed)[0].status == "failed"


def test_the_sample_is_the_auditors_and_named_tasks_are_added() -> None:
    ids = [f"t{i}" for i in range(20)]
    a = sample_tasks(ids, ReplayOptions(count=3, seed=1))
    assert a == sample_tasks(ids, ReplayOptions(count=3, seed=1))
    assert a != sample_tasks(ids, ReplayOptions(count=3, seed=2))
    named = sample_tasks(ids, ReplayOptions(count=3, seed=1, tasks=("t19", "nope")))
    assert named[:3] == a and named[3:] == (["t19"] if "t19" not in a else [])


def test_a_spent_time_bound_leaves_the_rest_not_rechecked(pipeline: Pipeline) -> None:
    checks = replay(pipeline, run_of(pipeline, "eval-seed"), time_limit=0.0)
    assert [c.status for c in checks[:-1]] == ["skipped", "skipped"]
    assert all(c.needs == "model" and "unreplayed" in c.message for c in checks[:-1])


@pytest.mark.parametrize("count", [0])
def test_nothing_drawn_passes_with_nothing_replayed(pipeline: Pipeline, count: int) -> None:
    check = replay(pipeline, run_of(pipeline, "eval-seed"), count=count)[0]
    assert check.status == "passed" and check.recomputed["replayed"] == []


def test_a_rewritten_retention_loss_is_caught(pipeline: Pipeline) -> None:
    honest = run_of(pipeline, "eval-seed")
    lines = pipeline.jsonl(honest.outputs["retention"])
    lines[0]["loss"] *= 0.9  # the kind of change the statistics alone cannot see
    run = run_of(pipeline, "eval-seed",
                 outputs={**honest.outputs, "retention": pipeline.put_jsonl(lines)})
    (check,) = [c for c in replay(pipeline, run) if c.name.endswith(".replay.retention")]
    assert check.status == "failed" and lines[0]["id"] in check.message


def test_the_command_replays_and_names_its_seed(pipeline: Pipeline) -> None:
    v = nscas_verify(pipeline.receipt("eval-again"), "--replay", "3", "--replay-seed", "5",
                     store=pipeline.store_dir)
    assert v.code == 0, v.stderr
    statuses = v.statuses()
    replayed = [n for n in statuses if n.endswith(".replay")]
    assert len(replayed) == 2 and {statuses[n] for n in replayed} == {"passed"}
    assert v.check("replay.environment")["recomputed"]["seed"] == 5
    # The losses the replay recomputed are no longer listed as not rechecked.
    assert not [n for n in statuses if n.endswith(".retention.losses")]
    plain = nscas_verify(pipeline.receipt("eval-again"), store=pipeline.store_dir)
    assert [n for n in plain.statuses() if n.endswith(".retention.losses")]
    drawn = nscas_verify(pipeline.receipt("eval-again"), "--replay", "1",
                         store=pipeline.store_dir)
    assert drawn.code == 0 and "--replay-seed" in drawn.stderr  # the drawn seed is printed


@pytest.mark.parametrize("args", [("--replay-seed", "1"), ("--replay", "2", "--device", "tpu"),
                                  ("--replay", "-1"), ("--replay-task", "x"),
                                  ("--replay", "1", "--replay-steps", "-2")])
def test_bad_replay_options_are_one_line(pipeline: Pipeline, args: tuple[str, ...]) -> None:
    v = nscas_verify(pipeline.receipt("eval-seed"), *args, store=pipeline.store_dir)
    assert v.code == 2 and v.stdout == ""


def test_the_stream_gives_each_check_then_done(pipeline: Pipeline) -> None:
    v = nscas_verify(pipeline.receipt("eval-seed"), "--stream", store=pipeline.store_dir,
                     as_json=False)
    lines = [json.loads(line) for line in v.stdout.splitlines()]
    assert v.code == 0 and "done" in lines[-1] and lines[-1]["done"]["ok"]
    assert all("check" in line for line in lines[:-1]) and len(lines) > 5
