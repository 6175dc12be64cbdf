"""Bundle paths of runs come from the bundle role their recipe declares (``Recipe.bundle``),
looked up by the name and version the action records; unknown recipes get ``outputs/``."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from nscas.bundle.exporting import export_bundle
from nscas.objects.digests import Digest
from nscas.runs import plans, runner
from nscas.runs.recipe import BundleRole, Recipe
from nscas.runs.registry import registered_recipe
from tests.export.conftest import Published, _receipt, read_tree
from tests.runner import probe_recipe

PROBE = replace(probe_recipe.RECIPE, bundle=BundleRole(
    folder="probes", arm_input="model", role_input="tasks", plain_role="test"))


def knowing(*recipes: Recipe):
    """A recipe lookup that knows ``recipes`` and, for any other name, the registered one."""
    mine = {r.name: r for r in recipes}
    return lambda name: mine[name] if name in mine else registered_recipe(name)


def _inputs(pub: Published) -> dict[str, Digest]:
    """The target evaluation's inputs: the trained model, the test tasks, the commitment."""
    action = pub.store.get_record(Digest.parse(pub.store.get_record(pub.target)["action"]))
    return {k: Digest.parse(action["inputs"][k]) for k in ("model", "tasks", "commitment")}


def _probe(pub: Published, inputs: dict[str, Digest], *, recipe: str = "probe@1",
           text: bytes = b'{"probe": 1}') -> Digest:
    seen = pub.store.put_bytes(text)
    code = Digest.parse(pub.store.get_record(
        Digest.parse(pub.store.get_record(pub.target)["action"]))["code"])
    return _receipt(pub.store, recipe, code, inputs, {"seen": seen})


def _train_tasks(pub: Published) -> Digest:
    action = pub.store.get_record(Digest.parse(pub.store.get_record(pub.train_receipt)["action"]))
    return Digest.parse(action["inputs"]["tasks"])


def _export(pub: Published, target: Digest, dest: Path, **kw: object) -> dict[str, bytes]:
    export_bundle(pub.store, target, dest, **kw)
    return read_tree(dest)


def test_a_declared_folder_holds_the_runs_outputs(published: Published, tmp_path: Path) -> None:
    test = _probe(published, _inputs(published))
    files = _export(published, test, tmp_path / "test", recipes=knowing(PROBE))
    assert "probes/clean-single/seen.jsonl" in files  # the arm of input "model"; test is plain
    assert not [p for p in files if p.startswith("outputs/")]
    train = _probe(published, {**_inputs(published), "tasks": _train_tasks(published)})
    files = _export(published, train, tmp_path / "train", recipes=knowing(PROBE))
    assert "probes/clean-single-train/seen.jsonl" in files  # other roles are appended
    assert _export(published, train, tmp_path / "again", recipes=knowing(PROBE)) == files


def test_unknown_recipes_and_other_versions_get_the_generic_layout(
        published: Published, tmp_path: Path) -> None:
    receipt = _probe(published, _inputs(published))
    unknown = _export(published, receipt, tmp_path / "unknown", recipes=lambda name: None)
    assert f"outputs/probe-{receipt.short}/seen.jsonl" in unknown
    newer = _export(published, receipt, tmp_path / "newer",
                    recipes=knowing(replace(PROBE, version="2")))
    assert newer == unknown  # the recorded probe@1 declared nothing that this machine knows
    # The registry (what `nscas export` uses) knows no probe: the generic layout too.
    assert _export(published, receipt, tmp_path / "registry") == unknown


def test_a_folder_without_arms_is_flat_for_one_run_and_split_for_several(
        published: Published, tmp_path: Path) -> None:
    flat = replace(PROBE, bundle=BundleRole(folder="probes"))
    one = _probe(published, _inputs(published))
    assert "probes/seen.jsonl" in _export(published, one, tmp_path / "one", recipes=knowing(flat))
    two = _probe(published, {"earlier": one}, text=b'{"probe": 2}')
    files = _export(published, two, tmp_path / "two", recipes=knowing(flat))
    assert {"probes/earlier/seen.jsonl", f"probes/probe-{two.short}/seen.jsonl"} <= files.keys()


def test_a_run_through_the_runner_lands_in_its_declared_folder(
        published: Published, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = plans.load_recipe
    monkeypatch.setattr(plans, "load_recipe", lambda name: PROBE if name == "probe" else real(name))
    inputs = _inputs(published)
    (tmp_path / "probe.toml").write_text(
        'recipe = "probe"\ninputs = { '
        + ", ".join(f'{k} = "{v}"' for k, v in inputs.items()) + " }\n")
    [result] = runner.run_file(published.store, tmp_path / "probe.toml")
    action = published.store.get_record(result.action)
    assert action["recipe"] == "probe@1"
    files = _export(published, result.receipt, tmp_path / "b", recipes=knowing(PROBE))
    assert json.loads(files["probes/clean-single/seen.jsonl"]) == {k: str(v) for k, v in inputs.items()}


def test_the_registered_recipes_declare_todays_folders() -> None:
    roles = {name: (r.bundle if (r := registered_recipe(name)) else None)
             for name in ("evaluate", "serve", "report", "train", "prepare", "commit")}
    assert roles["evaluate"] == BundleRole(folder="evaluations", arm_input="model",
                                           role_input="tasks", plain_role="test")
    assert roles["serve"] == BundleRole(folder="serving")
    assert roles["report"] == BundleRole(folder="report")
    assert roles["train"] == BundleRole(folder="training", arm_output="checkpoint")
    assert roles["prepare"] is None and roles["commit"] is None
    assert registered_recipe("no-such-recipe") is None


@pytest.mark.parametrize("folder", ["models", "outputs", "records", "Upper", "a/b", "", ".x"])
def test_a_bundle_role_keeps_out_of_the_exporters_own_folders(folder: str) -> None:
    with pytest.raises(ValueError, match="bundle folder"):
        BundleRole(folder=folder)
