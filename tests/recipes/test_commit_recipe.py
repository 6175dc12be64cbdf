"""The commit recipe on a real tiny pipeline: commitments chain over the same prepared inputs,
and a candidate is refused when nothing is committed or when it already depends on a test-set
evaluation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from nscas.models.checkpoints import put_checkpoint
from nscas.objects.digests import Digest
from nscas.recipes.commit.recipe import PURPOSE
from nscas.runs.runner import StepFailed, StepResult, run_file
from nscas.store.writer import Store
from tests.pipelines import run_pipeline
from tests.recipes.test_evaluate_recipe import PIPELINE

torch.set_num_threads(1)

Pipeline = tuple[Path, Store, dict[str, StepResult]]
"""The store's directory, the store, and what each pipeline step made."""


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    """A store that ran the evaluate tests' pipeline once (with its first commitment)."""
    root = tmp_path_factory.mktemp("commit")
    store, steps = run_pipeline(root, PIPELINE)
    yield root, store, steps
    store.close()


def commit(root: Path, store: Store, name: str, inputs: dict[str, Digest],
           experiment: str | None = None) -> StepResult:
    text = 'recipe = "commit"\n[inputs]\n' + "".join(f'{k} = "{v}"\n' for k, v in inputs.items())
    if experiment is not None:
        text += f'[params]\nexperiment = "{experiment}"\n'
    (root / f"{name}.toml").write_text(text)
    [result] = run_file(store, root / f"{name}.toml")
    return result


def checkpoint_selected_by(store: Store, steps: dict[str, StepResult], tmp_path: Path,
                           receipt: Digest) -> Digest:
    """The seed's weights as a new checkpoint whose record names ``receipt`` as its origin."""
    seed = steps["init"].outputs["checkpoint"]
    store.materialise(Digest.parse(store.get_record(seed)["files"]), tmp_path / "model")
    return put_checkpoint(store, tmp_path / "model", step=0, parent=None,
                                extra={"selected_by": str(receipt)})


def refused(root: Path, store: Store, name: str, inputs: dict[str, Digest]) -> str:
    """Run a commit that must fail; its failed receipt's error."""
    with pytest.raises(StepFailed) as err:
        commit(root, store, name, inputs)
    receipt = store.get_record(err.value.receipt)
    assert receipt["status"] == "failed"
    assert receipt["outputs"] == {} and receipt["claims"] == {}
    assert receipt["error"] in err.value.message
    return receipt["error"]


def test_first_commitment_names_the_prepared_inputs_and_the_arms(pipeline: Pipeline) -> None:
    _, store, steps = pipeline
    result = steps["commit"]
    assert result.claims == {"candidates": ["seed"]}
    assert store.get_record(result.outputs["commitment"]) == {
        "nscas": "commitment/1", "purpose": PURPOSE, "experiment": "cooperative-learning",
        "subjects": {"prepared": str(steps["prepare"].outputs["prepared"]),
                     "seed": str(steps["init"].outputs["checkpoint"])},
        "previous": None}


def test_second_commitment_over_the_same_prepared_inputs_links_the_first(
        pipeline: Pipeline, tmp_path: Path) -> None:
    root, store, steps = pipeline
    first = steps["commit"].outputs["commitment"]
    prepared = steps["prepare"].outputs["prepared"]
    # A candidate selected on the dev set may be committed.
    dev_pick = checkpoint_selected_by(store, steps, tmp_path, steps["eval-dev"].receipt)
    second = commit(root, store, "second", {"prepared": prepared,
                                            "seed": steps["init"].outputs["checkpoint"],
                                            "dev-pick": dev_pick})
    assert second.status == "succeeded" and not second.cached
    assert second.claims == {"candidates": ["dev-pick", "seed"]}
    record = store.get_record(second.outputs["commitment"])
    assert record["previous"] == str(first)
    assert record["subjects"] == {"prepared": str(prepared), "dev-pick": str(dev_pick),
                                  "seed": str(steps["init"].outputs["checkpoint"])}
    # Another experiment over the same inputs starts its own chain.
    other = commit(root, store, "other", {"prepared": prepared, "seed": dev_pick},
                   experiment="another-experiment")
    assert store.get_record(other.outputs["commitment"])["previous"] is None


def test_candidate_selected_by_a_test_evaluation_is_refused(
        pipeline: Pipeline, tmp_path: Path) -> None:
    root, store, steps = pipeline
    test_eval = steps["eval-test"].receipt
    tainted = checkpoint_selected_by(store, steps, tmp_path, test_eval)
    error = refused(root, store, "tainted", {"prepared": steps["prepare"].outputs["prepared"],
                                             "picked": tainted})
    assert error == (f"candidate 'picked' ({tainted}) already depends on a test-set evaluation "
                     f"({test_eval}); candidates must be fixed before final-test scoring")


def test_commit_without_a_candidate_is_refused(pipeline: Pipeline) -> None:
    root, store, steps = pipeline
    error = refused(root, store, "empty", {"prepared": steps["prepare"].outputs["prepared"]})
    assert error.startswith("commit needs at least one candidate checkpoint")
