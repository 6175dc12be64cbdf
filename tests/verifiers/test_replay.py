"""``verify --replay``: a sample of answers rechecked against the committed weights.

The forged case is the one plain verification cannot catch: an answer whose text and output
ids were rewritten consistently (they decode to each other, the checks agree with the text).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from nscas.verifiers.closure import Objects
from nscas.verifiers.replay import ReplayOptions, replay_evaluations, sample_tasks
from nscas.verifiers.runs import Run
from nscas.verifiers.sources import StoreSource
from tests.verifiers.conftest import Pipeline, nscas_verify


def run_of(pipeline: Pipeline, step: str, **receipt_changes: Any) -> Run:
    oid = pipeline.receipt(step)
    receipt = {**pipeline.record(oid), **receipt_changes}
    action = pipeline.record(receipt["action"])
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
    env = by_name["replay.environment"].recomputed
    assert env["device"] == "cpu" and env["seed"] == 7 and env["precision"] == "fp32"
    assert seen[-1][1:] == (16, 16)


def test_a_consistently_rewritten_answer_is_caught(pipeline: Pipeline) -> None:
    honest = run_of(pipeline, "eval-seed")
    lines = pipeline.jsonl(honest.outputs["generations"])
    ids = [g["id"] for g in lines]
    target = sample_tasks(ids, ReplayOptions(count=4, seed=7))[1]
    for g in lines:
        if g["id"] == target:  # another token where the model chose one: text follows the ids
            g["output_ids"] = [g["output_ids"][0] + 1, *g["output_ids"][1:]]
    forged = pipeline.put_jsonl(lines)
    run = run_of(pipeline, "eval-seed", outputs={**honest.outputs, "generations": forged})
    check = replay(pipeline, run)[0]
    assert check.status == "failed"
    assert check.recomputed["differing"] == [target]
    assert f"{target}: answer token 0 is" in check.message


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
