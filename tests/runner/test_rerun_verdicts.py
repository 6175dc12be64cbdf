"""``--rerun`` of a demo-like pipeline (every recipe the demo uses, tiny, CPU) reproduces
every step: each output is ``identical``, or ``reproduced`` (timings differ) for the outputs
that hold measurements, compared with the previous run of the same step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from nscas.runs.plans import load_recipe
from nscas.runs.runner import StepResult, run_file
from nscas.runs.verdicts import compare_outputs
from nscas.store.writer import Store
from tests.verifiers.conftest import EXPERIMENT, experiment

MEASUREMENTS = {("evaluate", "timings"), ("serve", "requests"), ("report", "report")}
"""Outputs that hold measurements: the report's tree also names its input receipts, whose IDs
a rerun changes (their times differ)."""


@pytest.fixture
def first_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, StepResult]]:
    """The tamper suite's run of ``EXPERIMENT`` (run once per test run), in a copy of its own:
    a fixture, so that building it is not part of the rerun this test's timeout bounds."""
    return experiment(tmp_path_factory)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_rerun_of_every_demo_recipe_reproduces_each_step(
        tmp_path: Path, first_run: tuple[Path, dict[str, StepResult]]) -> None:
    torch.set_num_threads(1)
    root, first = first_run
    path = root / "experiment.toml"
    assert path.read_text() == EXPERIMENT
    with Store(root / ".nscas") as store:
        again = run_file(store, path, rerun=True)
        assert {r.recipe for r in again} == {"prepare", "tokenizer", "init", "train", "commit",
                                             "evaluate", "serve", "report"}
        for result in again:
            assert not result.cached and result.status == "succeeded"
            before = first[result.step]
            assert set(result.verdicts) == set(result.outputs), result.step
            for output, verdict in result.verdicts.items():
                assert verdict.before == before.outputs[output], (result.step, output)
                want = "reproduced" if (result.recipe, output) in MEASUREMENTS else "identical"
                assert verdict.status == want, (result.step, output, verdict)
            if result.action != before.action:  # an upstream receipt changed: it is named
                assert result.miss is not None and result.miss.previous == before.receipt
                assert result.miss.inputs, result.step
            rec = store.get_record(result.receipt)
            assert (rec["pipeline"], rec["step"]) == ("experiment", result.step)

        # A report whose results (not its timings) differ does not reproduce.
        report = next(r for r in again if r.recipe == "report")
        changed = tmp_path / "changed"
        store.materialise(report.outputs["report"], changed)
        doc = json.loads((changed / "report.json").read_text())
        doc["learning"]["arms"]["seed"]["correct"] += 1
        (changed / "report.json").write_text(json.dumps(doc))
        forged = store.put_tree(changed)
        verdict = compare_outputs(store, {"report": report.outputs["report"]},
                                  {"report": forged},
                                  measurements=load_recipe("report").measurements)["report"]
        assert verdict.status == "different", verdict
