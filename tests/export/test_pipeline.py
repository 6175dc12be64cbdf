"""The real thing: run a small prepare → tokenizer → init → commit → evaluate pipeline,
export its last receipt, check it with sha256sum and the independent verifier, and import it
into another store."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from nscas.bundle.exporting import export_bundle
from nscas.bundle.format import FORMAT_V1
from nscas.bundle.importing import import_bundle
from nscas.store.writer import init_store
from nscas.upkeep.fsck import fsck
from tests.export.conftest import read_tree
from tests.pipelines import evaluate_step, tiny_pipeline

PIPELINE = tiny_pipeline() + evaluate_step("eval-seed", max_new_tokens=8) + evaluate_step(
    "eval-again", baseline="eval-seed", max_new_tokens=8, batch_size=4)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory):
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    from nscas.runs.runner import run_file

    root = tmp_path_factory.mktemp("pipeline")
    (root / "eval.toml").write_text(PIPELINE)
    store = init_store(root / "project")
    results = run_file(store, root / "eval.toml")
    yield store, results
    store.close()


def test_export_of_a_real_pipeline(pipeline, tmp_path: Path) -> None:
    store, results = pipeline
    target = results[-1].receipt
    export_bundle(store, target, tmp_path / "b")
    files = read_tree(tmp_path / "b")
    assert f"receipts/evaluate-{target.short}.json" in files
    assert "receipts/baseline.json" in files  # eval-seed, as eval-again's action names it
    assert {"models/seed/model.safetensors", "models/seed/config.json", "tasks/test.jsonl",
            "tasks/retention.jsonl"} <= files.keys()
    assert [p for p in files if p.startswith("evaluations/seed-") and p.endswith("/checks.jsonl")]
    m = json.loads(files["manifest.json"])
    params = json.loads(files[next(p for p, e in m["objects"].items() if e["kind"] == "params/1")])
    # Every distinct tensor (equal tensors, e.g. fresh norms, are one object) is a range.
    assert set(m["derived"]) == {t["data"] for t in params["tensors"].values()}
    run = subprocess.run(["sha256sum", "-c", "--strict", "--quiet", "SHA256SUMS"],
                         cwd=tmp_path / "b", capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    export_bundle(store, target, tmp_path / "again")
    assert read_tree(tmp_path / "again") == files

    from nscas.verifiers.verify import exit_code, verify

    report = verify(str(tmp_path / "b"))
    failed = [(c.name, c.status) for c in report.checks if c.status == "failed"]
    assert exit_code(report) == 0 and failed == []

    fresh = init_store(tmp_path / "fresh")
    try:
        got = import_bundle(fresh, tmp_path / "b")
        assert got.complete and set(got.imported) == store.closure([target])
        assert fsck(fresh, deep=True).ok
        assert fresh.get_bytes(target) == store.get_bytes(target)
    finally:
        fresh.close()


def test_no_weights_export_of_a_real_pipeline(pipeline, tmp_path: Path) -> None:
    store, results = pipeline
    target = results[-1].receipt
    report = export_bundle(store, target, tmp_path / "b", weights=False)
    assert not [p for p in read_tree(tmp_path / "b") if p.endswith(".safetensors")]
    params = next(d for d in store.closure([target]) if store.info(d).kind == "params/1")
    tensors = {t["data"] for t in store.get_record(params)["tensors"].values()}
    assert len(report.omitted) == len(tensors) + 1  # and the one weights file
    fresh = init_store(tmp_path / "fresh")
    try:
        got = import_bundle(fresh, tmp_path / "b")
        assert not got.complete and params in got.skipped and target in got.skipped
        assert fsck(fresh, deep=True).ok
    finally:
        fresh.close()


def test_a_v1_export_of_a_real_pipeline_verifies_and_imports(pipeline, tmp_path: Path) -> None:
    """The reader of format 1 stays tested: the same closure written as format 1 passes every
    check and imports to the same IDs."""
    from nscas.verifiers.verify import exit_code, verify

    store, results = pipeline
    target = results[-1].receipt
    export_bundle(store, target, tmp_path / "v1", bundle_format=FORMAT_V1)
    assert json.loads((tmp_path / "v1/manifest.json").read_bytes())["format"] == FORMAT_V1
    report = verify(str(tmp_path / "v1"), strict=True)
    assert [c.name for c in report.checks if c.status == "failed"] == [] and \
        exit_code(report) == 0
    fresh = init_store(tmp_path / "fresh")
    try:
        got = import_bundle(fresh, tmp_path / "v1")
        assert got.complete and set(got.imported) == store.closure([target])
    finally:
        fresh.close()
