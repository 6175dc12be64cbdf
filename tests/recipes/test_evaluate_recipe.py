"""The evaluate recipe on a real tiny pipeline: its refusals (each before any generation, each
leaving a failed receipt that names the problem) and its outputs (batched equals one at a time,
claims that the checker and the statistics reproduce from the retained blobs)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from nscas.models.checkpoints import put_checkpoint
from nscas.models.paired import paired
from nscas.objects.digests import Digest
from nscas.recipes.common.checker import check
from nscas.runs.runner import StepFailed, StepResult, run_file
from nscas.store.writer import Store
from tests.pipelines import evaluate_step, run_pipeline, tiny_pipeline

torch.set_num_threads(1)

PIPELINE = (tiny_pipeline()
            + evaluate_step("eval-test", max_new_tokens=8, batch_size=8, threads=1)
            + evaluate_step("eval-dev", tasks="dev", commitment=False, retention=False,
                            max_new_tokens=8, threads=1))
"""prepare -> tokenizer -> init -> commit -> a test-role and a dev-role evaluation."""

TIMING = {"seconds", "tokens_per_second"}
"""Generation fields that measure the run rather than its result."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """A store that ran ``PIPELINE`` once, and what each step made."""

    root: Path
    store: Store
    steps: dict[str, StepResult]

    def output(self, step: str, name: str) -> Digest:
        return self.steps[step].outputs[name]

    def record(self, oid: Digest) -> dict[str, Any]:
        return self.store.get_record(oid)

    def jsonl(self, oid: Digest | str) -> list[dict[str, Any]]:
        data = self.store.get_bytes(oid if isinstance(oid, Digest) else Digest.parse(oid))
        return [json.loads(line) for line in data.decode().splitlines()]

    def put_jsonl(self, lines: list[dict[str, Any]]) -> Digest:
        return self.store.put_bytes("".join(json.dumps(x, separators=(",", ":")) + "\n"
                                            for x in lines).encode())

    def put_tasks(self, role: str, records: list[dict[str, Any]]) -> Digest:
        """A tasks/1 of these records, put through the store API like prepare does."""
        return self.store.put_record({
            "nscas": "tasks/1", "role": role, "records": str(self.put_jsonl(records)),
            "count": len(records), "ids": [r["id"] for r in records]})

    def evaluate(self, name: str, inputs: dict[str, Digest], **params: Any) -> StepResult:
        """Run evaluate once from a recipe file naming its inputs by ID."""
        params = {"max_new_tokens": 8, "threads": 1, **params}
        text = 'recipe = "evaluate"\n[inputs]\n' + "".join(
            f'{k} = "{v}"\n' for k, v in inputs.items()) + "[params]\n" + "".join(
            f"{k} = {json.dumps(v)}\n" for k, v in params.items())
        path = self.root / f"{name}.toml"
        path.write_text(text)
        [result] = run_file(self.store, path)
        return result

    def refused(self, name: str, inputs: dict[str, Digest], **params: Any) -> dict[str, Any]:
        """Run an evaluation that must fail before generating; its failed receipt."""
        before = {o.id for o in self.store.iter_objects()}
        with pytest.raises(StepFailed) as err:
            self.evaluate(name, inputs, **params)
        receipt = self.record(err.value.receipt)
        assert receipt["status"] == "failed"
        assert receipt["outputs"] == {} and receipt["claims"] == {}
        assert receipt["error"] in err.value.message
        # Nothing was generated: the run added only its action, environment and receipt.
        new = [o for o in self.store.iter_objects() if o.id not in before]
        assert {o.kind for o in new} <= {"action/1", "environment/1", "receipt/1"}, new
        assert err.value.receipt in {o.id for o in new}
        return receipt

    def model_inputs(self) -> dict[str, Digest]:
        return {"model": self.output("init", "checkpoint"), "tasks": self.output("prepare", "test"),
                "commitment": self.output("commit", "commitment")}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    root = tmp_path_factory.mktemp("evaluate")
    store, steps = run_pipeline(root, PIPELINE)
    yield Run(root=root, store=store, steps=steps)
    store.close()


# ------------------------------------------------------------------------------ refusals


def test_baseline_on_other_task_ids_is_refused(run: Run) -> None:
    receipt = run.refused("other-ids", {**run.model_inputs(),
                                        "baseline": run.steps["eval-dev"].receipt})
    assert receipt["error"] == ("the baseline evaluated other task ids (4 vs 8); "
                                "compare like with like")


def test_baseline_with_the_same_ids_in_another_order_is_refused(run: Run) -> None:
    records = run.jsonl(run.record(run.output("prepare", "test"))["records"])
    reordered = run.put_tasks("test", records[::-1])
    baseline = run.evaluate("reordered", {**run.model_inputs(), "tasks": reordered})
    assert baseline.status == "succeeded"
    assert [c["id"] for c in run.jsonl(baseline.outputs["checks"])] == \
        [r["id"] for r in records[::-1]]
    receipt = run.refused("against-reordered", {**run.model_inputs(),
                                                "baseline": baseline.receipt})
    assert "same task ids in another order" in receipt["error"]


def test_test_role_without_a_commitment_is_refused_before_generating(run: Run) -> None:
    inputs = run.model_inputs()
    del inputs["commitment"]
    receipt = run.refused("uncommitted", inputs)
    assert receipt["error"].startswith("evaluating the test role needs a 'commitment' input")


def test_a_model_the_commitment_does_not_name_is_refused(run: Run, tmp_path: Path) -> None:
    seed = run.output("init", "checkpoint")
    run.store.materialise(Digest.parse(run.record(seed)["files"]), tmp_path / "model")
    # The same weights under another checkpoint ID: what is committed is the ID.
    other = put_checkpoint(run.store, tmp_path / "model", step=0, parent=seed,
                                     extra={"note": "not committed"})
    receipt = run.refused("not-named", {**run.model_inputs(), "model": other})
    assert receipt["error"] == (f"model {other} is not among the commitment's subjects "
                                "(prepared, seed); commit it before test-set scoring")


def test_retention_set_with_other_ids_than_the_baselines_is_refused(run: Run) -> None:
    probes = run.jsonl(run.record(run.output("prepare", "retention"))["records"])
    assert len(probes) == 4
    fewer = run.put_tasks("retention", probes[:-1])
    receipt = run.refused("fewer-probes", {**run.model_inputs(), "retention": fewer,
                                           "baseline": run.steps["eval-test"].receipt})
    assert receipt["error"] == ("the retention set holds other probe ids than the baseline's "
                                "(3 vs 4); compare like with like")


def test_empty_task_set_is_refused(run: Run) -> None:
    empty = run.store.put_record({"nscas": "tasks/1", "role": "dev",
                                  "records": str(run.store.put_bytes(b"")), "count": 0,
                                  "ids": []})
    receipt = run.refused("empty", {"model": run.output("init", "checkpoint"), "tasks": empty})
    assert receipt["error"] == f"task set {empty} is empty; nothing to evaluate"


# ---------------------------------------------------------------------------- happy path


def test_batched_generation_equals_one_at_a_time(run: Run) -> None:
    batched = run.steps["eval-test"]
    single = run.evaluate("one-at-a-time", {**run.model_inputs(),
                                            "retention": run.output("prepare", "retention")},
                          batch_size=1)
    assert single.status == "succeeded" and not single.cached
    a, b = run.jsonl(batched.outputs["generations"]), run.jsonl(single.outputs["generations"])
    assert [g["id"] for g in a] == [g["id"] for g in b] == run.record(
        run.output("prepare", "test"))["ids"]
    for x, y in zip(a, b, strict=True):
        assert x["output_ids"] == y["output_ids"], x["id"]
        assert {k: v for k, v in x.items() if k not in TIMING} == \
            {k: v for k, v in y.items() if k not in TIMING}
        assert 1 <= len(x["output_ids"]) <= 8
    assert single.outputs["checks"] == batched.outputs["checks"]
    assert single.outputs["retention"] == batched.outputs["retention"]


def test_rescoring_the_retained_generations_reproduces_every_claim(run: Run) -> None:
    for step, role, n in (("eval-test", "test", 8), ("eval-dev", "dev", 4)):
        result = run.steps[step]
        tasks = run.record(run.output("prepare", role))
        records = {r["id"]: r for r in run.jsonl(tasks["records"])}
        gens = run.jsonl(result.outputs["generations"])
        assert [g["id"] for g in gens] == tasks["ids"] and len(gens) == n
        checks = []
        for g in gens:
            r = records[g["id"]]
            c = check(g["text"], r["target"])
            checks.append({"id": g["id"], "family": r["task"]["family"],
                           "variant": r["task"]["variant"], "correct": c.correct,
                           "valid_json_object": c.valid_json_object, "reason": c.reason})
        assert run.jsonl(result.outputs["checks"]) == checks
        by_family = {c["family"]: 0 for c in checks}
        by_variant = {str(c["variant"]): 0 for c in checks}
        for c in checks:
            by_family[c["family"]] += c["correct"]
            by_variant[str(c["variant"])] += c["correct"]
        expected = {"documents": n, "correct": sum(c["correct"] for c in checks),
                    "valid_json_objects": sum(c["valid_json_object"] for c in checks),
                    "correct_by_family": by_family, "correct_by_variant": by_variant}
        claims = run.record(result.receipt)["claims"]
        for name, value in expected.items():
            assert claims[name] == {"value": value, "verifier": "answers"}, name
            assert result.claims[name] == value


def _paired_claims(run: Run, result: StepResult, baseline_checks: Digest | str) -> None:
    """The receipt's paired claims are stats.paired on the two retained checks blobs."""
    cmp = paired([(c["id"], c["correct"]) for c in run.jsonl(baseline_checks)],
                 [(c["id"], c["correct"]) for c in run.jsonl(result.outputs["checks"])])
    claims = run.record(result.receipt)["claims"]
    assert {k: claims[k]["value"] for k in ("wins", "losses", "accuracy_gain",
                                            "exact_one_sided_p")} == {
        "wins": cmp.wins, "losses": cmp.losses, "accuracy_gain": float(cmp.gain),
        "exact_one_sided_p": cmp.test.p_float}


def test_paired_claims_against_a_baseline_equal_the_statistics(run: Run) -> None:
    inputs = {**run.model_inputs(), "retention": run.output("prepare", "retention")}
    again = run.evaluate("again", {**inputs, "baseline": run.steps["eval-test"].receipt},
                         batch_size=4)
    assert again.status == "succeeded"
    _paired_claims(run, again, run.steps["eval-test"].outputs["checks"])
    assert (again.claims["wins"], again.claims["losses"]) == (0, 0)  # the same model
    assert again.claims["exact_one_sided_p"] == 1.0
    assert again.claims["retention_mean_change"] == 0.0
    # A baseline that got three tasks right (its checks rewritten through the store API): the
    # candidate, which gets none right, loses exactly those three.
    base = run.record(run.steps["eval-test"].receipt)
    checks = run.jsonl(run.steps["eval-test"].outputs["checks"])
    assert not any(c["correct"] for c in checks)
    doctored = [{**c, "correct": i in (0, 3, 5)} for i, c in enumerate(checks)]
    fake = run.store.put_record({**base, "outputs": {
        **base["outputs"], "checks": str(run.put_jsonl(doctored))}})
    worse = run.evaluate("worse", {**inputs, "baseline": fake})
    _paired_claims(run, worse, run.record(fake)["outputs"]["checks"])
    assert (worse.claims["wins"], worse.claims["losses"]) == (0, 3)
    assert worse.claims["accuracy_gain"] == -3 / 8
    # Retention is unchanged (the same model): its bound passes, gain and p do not.
    assert worse.claims["retention_upper"] == 0.0
    assert worse.claims["contract"] == {"gain": False, "p": False, "retention_upper": True}

