"""The runner on real recipes and a real store: caching, reruns, refs, pipelines, failures."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from nscas.errors import NscasError, RecipeError
from nscas.objects.digests import Digest
from nscas.runs.actions import find_receipt
from nscas.runs.recipe import NullProgress, Recipe
from nscas.runs.runner import OutputRefConflict, StepFailed, StepResult, run_file
from nscas.store.writer import Store
from tests.runner.helpers import (
    INIT_STEP,
    PIPELINE,
    PREPARE_RECIPE,
    PREPARE_STEP,
    TOKENIZER_STEP,
    run_pipeline,
    snapshot,
    write,
)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[StepResult]]:
    """A store that ran the tiny pipeline once, closed; and that run's results."""
    directory = tmp_path_factory.mktemp("pipeline")
    store, results = run_pipeline(directory)
    store.close()
    return directory, results


@pytest.fixture
def shared(first_run: tuple[Path, list[StepResult]]) -> Iterator[Store]:
    store = Store(first_run[0] / ".nscas")
    yield store
    store.close()


def by_step(results: list[StepResult]) -> dict[str, StepResult]:
    return {r.step: r for r in results}


def test_first_run_writes_receipts_and_sets_output_refs(
        first_run: tuple[Path, list[StepResult]], shared: Store) -> None:
    _, results = first_run
    assert [r.step for r in results] == ["prepare", "tokenizer", "init"]
    assert [r.cached for r in results] == [False, False, False]
    steps = by_step(results)
    for r in results:
        receipt = shared.get_record(r.receipt)
        assert receipt["status"] == "succeeded"
        assert receipt["action"] == str(r.action)
        assert receipt["outputs"] == {k: str(v) for k, v in r.outputs.items()}
        assert shared.info(Digest.parse(receipt["environment"])).kind == "environment/1"
        assert find_receipt(shared, r.action) == r.receipt
    assert shared.ref_get("coop/prepared") == steps["prepare"].outputs["prepared"]
    assert shared.ref_get("coop/seed") == steps["init"].outputs["checkpoint"]
    assert [e.message for e in shared.ref_log("coop/seed")] == [f"run {steps['init'].receipt}"]
    # step.X.Y handed each step the previous step's output, as its action records.
    tok_action = shared.get_record(steps["tokenizer"].action)
    assert tok_action["inputs"] == {"prepared": str(steps["prepare"].outputs["prepared"])}
    init_action = shared.get_record(steps["init"].action)
    assert init_action["inputs"] == {"tokenizer": str(steps["tokenizer"].outputs["tokenizer"])}
    assert init_action["recipe"] == "init@1"
    assert init_action["params"] == {"preset": "llama-tiny", "seed": 0}


def test_second_run_is_a_cache_hit_that_writes_nothing(
        first_run: tuple[Path, list[StepResult]], shared: Store, tmp_path: Path) -> None:
    before = snapshot(shared)
    again = run_file(shared, write(tmp_path, "pipeline.toml", PIPELINE))
    assert snapshot(shared) == before  # no receipt, no environment, no ref move
    assert [r.cached for r in again] == [True, True, True]
    for old, new in zip(first_run[1], again, strict=True):
        assert (new.receipt, new.action, dict(new.outputs)) == (old.receipt, old.action,
                                                               dict(old.outputs))
        assert dict(new.claims) == dict(old.claims)
        assert new.verdicts == {}


def test_recipe_file_with_the_same_action_reuses_the_pipeline_receipt(
        first_run: tuple[Path, list[StepResult]], shared: Store, tmp_path: Path) -> None:
    before = snapshot(shared)
    [result] = run_file(shared, write(tmp_path, "prepare.toml", PREPARE_RECIPE))
    assert snapshot(shared) == before
    assert result.cached and result.step == "prepare"
    assert result.receipt == by_step(first_run[1])["prepare"].receipt


def test_rerun_of_prepare_tokenizer_and_init_is_identical(
        first_run: tuple[Path, list[StepResult]], shared: Store, tmp_path: Path) -> None:
    first = by_step(first_run[1])
    again = run_file(shared, write(tmp_path, "pipeline.toml", PIPELINE), rerun=True)
    assert [r.step for r in again] == ["prepare", "tokenizer", "init"]
    for r in again:
        assert not r.cached
        assert r.receipt != first[r.step].receipt  # a new receipt of the same action
        assert r.action == first[r.step].action
        assert set(r.verdicts) == set(first[r.step].outputs)
        assert {v.status for v in r.verdicts.values()} == {"identical"}, r.verdicts
        for name, v in r.verdicts.items():
            assert v.before == v.after == first[r.step].outputs[name]
        assert shared.get_record(r.receipt)["status"] == "succeeded"
    # The cache still answers with the first receipt.
    assert find_receipt(shared, first["init"].action) == first["init"].receipt


def test_pipeline_steps_run_in_dependency_order_whatever_the_file_order(
        first_run: tuple[Path, list[StepResult]], tmp_path: Path) -> None:
    store, results = run_pipeline_reversed(tmp_path)
    try:
        assert [r.step for r in results] == ["prepare", "tokenizer", "init"]
        assert [r.cached for r in results] == [False, False, False]
        # A fresh store computes the very same actions and outputs (determinism across stores).
        for new, old in zip(results, first_run[1], strict=True):
            assert (new.action, dict(new.outputs)) == (old.action, dict(old.outputs))
    finally:
        store.close()


def run_pipeline_reversed(directory: Path) -> tuple[Store, list[StepResult]]:
    from nscas.store.writer import init_store

    store = init_store(directory)
    text = INIT_STEP + TOKENIZER_STEP + PREPARE_STEP
    return store, run_file(store, write(directory, "reversed.toml", text))


def test_step_receipt_and_output_references(
        first_run: tuple[Path, list[StepResult]], shared: Store, tmp_path: Path,
        probe: Recipe) -> None:
    path = write(tmp_path, "refs.toml", PIPELINE + """
[[step]]
name = "look"
recipe = "probe"
inputs = { source = "step.init.receipt", model = "step.init.checkpoint", tok = "coop/prepared" }
""")
    results = by_step(run_file(shared, path))
    first = by_step(first_run[1])
    assert results["look"].claims["inputs"] == {
        "source": str(first["init"].receipt),
        "model": str(first["init"].outputs["checkpoint"]),
        "tok": str(first["prepare"].outputs["prepared"]),
    }
    seen = shared.get_record(results["look"].action)["inputs"]
    assert seen["source"] == str(first["init"].receipt)


def test_output_ref_moved_behind_the_runners_back_is_a_cas_conflict(
        shared: Store, tmp_path: Path, probe: Recipe) -> None:
    intruder = shared.put_bytes(b"someone else's object")
    path = write(tmp_path, "probe.toml", """
recipe = "probe"
params = { label = "cas" }
outputs = { seen = "probe/cas" }
""")

    class MovesTheRef(NullProgress):
        def finish(self) -> None:  # called by the runner after the recipe, before the refs
            shared.ref_set("probe/cas", intruder, message="behind the runner's back")

    with pytest.raises(OutputRefConflict) as err:
        run_file(shared, path, progress=lambda step: MovesTheRef())
    exc = err.value
    assert exc.name == "probe/cas" and exc.expected is None and exc.actual == str(intruder)
    assert "'probe/cas'" in exc.message and str(exc.receipt) in exc.message
    assert exc.exit_code == 1
    assert shared.ref_get("probe/cas") == intruder  # the other writer's value stands
    receipt = shared.get_record(exc.receipt)
    assert receipt["status"] == "succeeded"  # the work is kept; only the ref did not move
    assert Digest.parse(receipt["outputs"]["seen"]) != intruder


def test_failed_recipe_writes_a_failed_receipt_and_is_not_cached(
        shared: Store, tmp_path: Path) -> None:
    not_jsonl = shared.put_bytes(b"this is not JSON lines\n")
    path = write(tmp_path, "bad-replay.toml", PREPARE_RECIPE + f"""
[inputs]
replay = "{not_jsonl}"
[outputs]
prepared = "bad/prepared"
""")
    seen: list[StepResult] = []
    with pytest.raises(StepFailed) as err:
        run_file(shared, path, on_step=seen.append)
    exc = err.value
    assert exc.exit_code == 1 and str(exc.receipt) in exc.message
    assert [r.status for r in seen] == ["failed"] and seen[0].receipt == exc.receipt
    receipt = shared.get_record(exc.receipt)
    assert receipt["status"] == "failed"
    assert receipt["error"].startswith("conversations line 1: not JSON")
    assert receipt["outputs"] == {} and receipt["claims"] == {}
    assert shared.get_record(Digest.parse(receipt["action"]))["inputs"]["replay"] == str(not_jsonl)
    assert shared.ref_get("bad/prepared") is None
    assert find_receipt(shared, Digest.parse(receipt["action"])) is None
    with pytest.raises(StepFailed) as again:  # a failure is not a cache hit: it runs again
        run_file(shared, path)
    assert again.value.receipt != exc.receipt


@pytest.mark.parametrize(("fail", "error"), [
    ("error", "probe refused its input"),
    ("crash", "ValueError: probe crashed on purpose (at probe_recipe.py:"),
])
def test_recipe_errors_and_crashes_both_leave_a_failed_receipt(
        shared: Store, tmp_path: Path, probe: Recipe, fail: str, error: str) -> None:
    path = write(tmp_path, "probe.toml", f'recipe = "probe"\nparams = {{ fail = "{fail}" }}\n')
    with pytest.raises(StepFailed) as err:
        run_file(shared, path)
    receipt = shared.get_record(err.value.receipt)
    assert receipt["status"] == "failed" and receipt["error"].startswith(error)
    assert err.value.message.startswith("recipe 'probe' failed: ")
    if fail == "crash":
        assert isinstance(err.value.__cause__, ValueError)


def test_a_failed_pipeline_step_stops_the_pipeline(
        shared: Store, tmp_path: Path, probe: Recipe) -> None:
    path = write(tmp_path, "stop.toml", """
[[step]]
name = "boom"
recipe = "probe"
params = { fail = "error", label = "stop" }
[[step]]
name = "after"
recipe = "probe"
inputs = { source = "step.boom.seen" }
params = { label = "never" }
""")
    seen: list[StepResult] = []
    with pytest.raises(StepFailed, match=r"^step 'boom' \(probe\) failed: probe refused"):
        run_file(shared, path, on_step=seen.append)
    assert [(r.step, r.status) for r in seen] == [("boom", "failed")]


def test_step_failed_is_a_recipe_error() -> None:
    exc: Any = StepFailed(step="a", recipe="b", receipt=Digest("0" * 64), error="x")
    assert isinstance(exc, RecipeError) and isinstance(exc, NscasError)
