"""The report refuses what it cannot stand behind: claims that retained data contradict,
receipts that are not what their input names say, failed runs, unlinked experiments."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from nscas.objects.digests import Digest
from nscas.recipes.report.audit import ClaimMismatch, same_value
from nscas.recipes.report.compute import compute
from nscas.store.writer import init_store
from tests.recipes.test_report_fixtures import Experiment, build, receipt, run_report


@pytest.fixture(scope="module")
def experiment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Experiment]:
    root = tmp_path_factory.mktemp("experiment")
    store = init_store(root)
    yield build(store, root)
    store.close()


def test_claims_that_disagree_with_retained_data_fail_naming_both_values(tmp_path: Path) -> None:
    store = init_store(tmp_path)
    exp = build(store, tmp_path, override={
        ("evaluate.clean-single", "correct"): 12,
        ("train.clean-pair", "median_update_seconds"): 5.25,
        ("serve", "failure_retries"): 0,
    })
    result = run_report(exp)
    assert result.status == "failed"
    error = result.error or ""
    assert error.startswith("3 claimed value(s) differ from the retained data")
    assert f"evaluate.clean-single ({exp.inputs['evaluate.clean-single']}): correct claimed 12, " \
           "recomputed 11" in error
    assert "train.clean-pair" in error
    assert "median_update_seconds claimed 5.25, recomputed 5.5" in error
    assert "serve" in error and "failure_retries claimed 0, recomputed 2" in error
    with pytest.raises(ClaimMismatch) as info:
        compute(store, exp.inputs, title="t", action=Digest.parse("blake3:" + "0" * 64),
                price_per_host_hour=0.0, scratch=tmp_path)
    assert [(m.name, m.claimed, m.recomputed) for m in info.value.mismatches] == [
        ("correct", 12, 11), ("median_update_seconds", 5.25, 5.5), ("failure_retries", 0, 2)]
    store.close()


def test_a_loss_claim_the_journals_contradict_fails(tmp_path: Path) -> None:
    store = init_store(tmp_path)
    exp = build(store, tmp_path, override={("train.clean-single", "mean_loss"): 1.5,
                                           ("train.clean-pair", "last_loss"): 1.25})
    result = run_report(exp)
    assert result.status == "failed"
    error = result.error or ""
    assert error.startswith("2 claimed value(s) differ from the retained data")
    assert "mean_loss claimed 1.5, recomputed 1.75" in error
    assert "last_loss claimed 1.25, recomputed 1.0" in error
    store.close()


@pytest.mark.parametrize(("name", "source", "message"), [
    ("train.x", "evaluate.clean-single", "is a receipt of recipe 'evaluate', but its name says "
                                         "'train'"),
    ("serve", "train.clean-pair", "is a receipt of recipe 'train', but its name says 'serve'"),
    ("evaluation.x", "evaluate.clean-single", "is not one of prepare, commit, serve"),
    ("train.", "train.clean-pair", "is not one of prepare, commit, serve"),
])
def test_inputs_must_be_receipts_of_the_recipe_their_name_says(
        experiment: Experiment, name: str, source: str, message: str) -> None:
    inputs = {**experiment.inputs, name: experiment.inputs[source]}
    result = run_report(experiment, inputs=inputs)
    assert result.status == "failed"
    assert message in (result.error or "")


def test_needs_the_seed_baseline(experiment: Experiment) -> None:
    inputs = {k: v for k, v in experiment.inputs.items() if k != "evaluate.seed"}
    result = run_report(experiment, inputs=inputs)
    assert result.status == "failed"
    assert result.error == "the report needs the baseline evaluation as input 'evaluate.seed'"


def test_a_failed_run_is_refused(experiment: Experiment) -> None:
    store = experiment.store
    failed = receipt(store, "evaluate", inputs={}, params={}, outputs={}, claims={},
                     verifier="answers", status="failed")
    result = run_report(experiment, inputs={**experiment.inputs, "evaluate.broken": failed})
    assert result.status == "failed"
    assert f"input 'evaluate.broken' ({failed}) is a failed run: it broke" == result.error


def test_an_evaluation_of_another_task_set_is_refused(experiment: Experiment) -> None:
    store = experiment.store
    seed = store.get_record(experiment.inputs["evaluate.seed"])
    action = store.get_record(Digest.parse(seed["action"]))
    dev = experiment.prepare.outputs["dev"]
    other = receipt(store, "evaluate",
                    inputs={**{k: Digest.parse(v) for k, v in action["inputs"].items()},
                            "tasks": dev},
                    params={}, outputs={k: Digest.parse(v) for k, v in seed["outputs"].items()},
                    claims={}, verifier="answers")
    result = run_report(experiment, inputs={**experiment.inputs, "evaluate.other": other})
    assert result.status == "failed"
    assert f"input 'evaluate.other' scored task set {dev}, not the prepared test set" in (
        result.error or "")


def test_an_evaluation_of_another_checkpoint_than_the_arm_trained_is_refused(
        experiment: Experiment) -> None:
    inputs = {**experiment.inputs,
              "evaluate.clean-pair": experiment.inputs["evaluate.clean-single"]}
    result = run_report(experiment, inputs=inputs)
    assert result.status == "failed"
    assert "but train.clean-pair produced" in (result.error or "")


def test_same_value_compares_json_numbers_by_value_and_booleans_exactly() -> None:
    assert same_value(0, 0.0)  # RFC 8785 writes 0.0 as 0
    assert same_value(0.1 + 0.2, 0.3)
    assert not same_value(11, 12)
    assert not same_value(True, 1)
    assert not same_value(1.0, 1.001)
    assert same_value({"a": [1, None]}, {"a": [1.0, None]})
    assert not same_value({"a": 1}, {"a": 1, "b": 2})


def test_answers_are_rescored_not_taken_from_the_checks_blob(experiment: Experiment) -> None:
    store = experiment.store
    seed = store.get_record(experiment.inputs["evaluate.seed"])
    action = store.get_record(Digest.parse(seed["action"]))
    checks = [json.loads(line) for line in store.get_bytes(
        Digest.parse(seed["outputs"]["checks"])).decode().splitlines()]
    first_wrong = next(c for c in checks if not c["correct"])
    lying = [{**c, "correct": True, "valid_json_object": True, "reason": "correct"}
             if c is first_wrong else c for c in checks]
    blob = store.put_bytes("".join(json.dumps(c) + "\n" for c in lying).encode())
    forged = receipt(store, "evaluate",
                     inputs={k: Digest.parse(v) for k, v in action["inputs"].items()},
                     params={}, outputs={**{k: Digest.parse(v) for k, v in seed["outputs"].items()},
                                         "checks": blob},
                     claims={"correct": 3}, verifier="answers")
    result = run_report(experiment, inputs={**experiment.inputs, "evaluate.seed": forged})
    assert result.status == "failed"
    error = result.error or ""
    assert error.startswith("2 claimed value(s) differ")
    assert f"checks[{first_wrong['id']}] claimed" in error
    assert "correct claimed 3, recomputed 2" in error


def test_arms_of_other_architectures_are_refused_naming_that_pair(tmp_path: Path) -> None:
    """All pairs are compared in one pass; the one whose tensors differ in shape is named."""
    from types import SimpleNamespace
    from typing import Any

    from nscas.errors import RecipeError
    from nscas.recipes.report.parameters import parameters_section

    store = init_store(tmp_path)

    def params(shape: tuple[int, ...]) -> str:
        data = store.put_bytes(bytes(4 * shape[0]))
        return str(store.put_record({"nscas": "params/1", "tensors": {
            "w": {"dtype": "F32", "shape": list(shape), "data": str(data)}}}))

    arms: dict[str, Any] = {
        name: SimpleNamespace(parameter_digest=params(shape), model=f"model-{name}")
        for name, shape in (("seed", (4,)), ("same", (4,)), ("wider", (8,)))}
    comparisons: Any = tuple(SimpleNamespace(kind="versus_seed", candidate=c, baseline="seed")
                             for c in ("same", "wider"))
    with pytest.raises(RecipeError) as info:
        parameters_section(store, arms, comparisons)
    assert info.value.message.startswith("arm 'wider' (model-wider) and arm 'seed' "
                                         "(model-seed): the parameters cannot be compared")
    store.close()
