"""The report over real prepare, tokenizer, init, commit and evaluate runs (a tiny model, CPU):
the claims of the real evaluate recipe must survive the report's audit."""

from __future__ import annotations

import html
import json
from pathlib import Path

import torch

from nscas.objects.digests import Digest
from nscas.recipes.report.page import compact
from nscas.recipes.report.recipe import RECIPE as REPORT
from nscas.runs.config import StepConfig
from nscas.runs.runner import run_file, run_step
from nscas.store.writer import Store
from tests.pipelines import commit_step, evaluate_step, init_step, tokenizer_step
from tests.runner.helpers import PREPARE_STEP, write

PIPELINE = (PREPARE_STEP + tokenizer_step() + init_step(preset="llama-tiny") + commit_step()
            + evaluate_step("eval-seed", max_new_tokens=12, threads=1)
            + evaluate_step("eval-again", baseline="eval-seed", max_new_tokens=12, batch_size=4,
                            threads=1))


def test_report_over_real_evaluations(store: Store, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    steps = {r.step: r for r in run_file(store, write(tmp_path, "pipeline.toml", PIPELINE))}
    inputs = {"prepare": steps["prepare"].receipt, "commit": steps["commit"].receipt,
              "evaluate.seed": steps["eval-seed"].receipt,
              "evaluate.again": steps["eval-again"].receipt}
    step = StepConfig(name="report", recipe="report", params={}, outputs={},
                      inputs={k: str(v) for k, v in inputs.items()})
    result = run_step(store, REPORT, step, inputs, where="test")
    assert result.status == "succeeded", result.error
    out = tmp_path / "report"
    store.materialise(result.outputs["report"], out)
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    seed_claims = steps["eval-seed"].claims
    arms = report["learning"]["arms"]
    assert list(arms) == ["seed", "again"]
    assert arms["seed"]["correct"] == seed_claims["correct"]
    assert arms["seed"]["valid_json_objects"] == seed_claims["valid_json_objects"]
    assert {f: v["correct"] for f, v in arms["seed"]["by_family"].items()} == seed_claims[
        "correct_by_family"]
    assert arms["seed"]["retention_mean_loss"] == seed_claims["retention_mean_loss"]
    (versus,) = report["learning"]["comparisons"]
    # The same checkpoint decoded greedily twice: no discordant pair, nothing changes.
    assert (versus["wins"], versus["losses"], versus["p_exact"]) == (0, 0, "1/1")
    assert versus["retention"]["mean"] == 0.0
    # the audit passed (the report exists) and leaves no member of its own behind
    assert "audit" not in report and report["format"] == "nscas-report/3"
    assert list(report["figures"]) == ["comparison", "accuracy", "parameters"]
    # The same committed checkpoint evaluated twice: every tensor is bit-identical.
    (pair,) = report["parameters"]["pairs"]
    assert pair["identical_tensors"] == pair["tensors"] > 0
    assert (pair["relative_l2"], pair["max_abs_diff"]) == (0.0, 0.0)
    assert report["training"] is None and report["serving"] is None
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["report.json", "resources.json", "index.html", "generations.html"]
        + [f"{n}.{f}" for n in ("comparison", "accuracy", "parameters")
           for f in ("svg", "png", "pdf")])
    page = (out / "generations.html").read_text(encoding="utf-8")
    test = store.get_record(steps["prepare"].outputs["test"])
    records = [json.loads(line) for line in store.get_bytes(
        Digest.parse(test["records"])).decode().splitlines()]
    generations = [json.loads(line) for line in store.get_bytes(
        steps["eval-again"].outputs["generations"]).decode().splitlines()]
    for record, generation in zip(records, generations, strict=True):
        assert html.escape(record["prompt"], quote=True) in page
        assert compact(generation["text"]) in page
