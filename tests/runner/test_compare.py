"""Reproduction verdicts between two runs' outputs (``--rerun``), on real stored checkpoints."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from nscas.models.checkpoints import put_checkpoint
from nscas.objects.digests import Digest
from nscas.runs.verdicts import CHECKPOINT_TOLERANCE, compare_outputs
from nscas.store.writer import Store


def checkpoint(store: Store, directory: Path, tensors: dict[str, np.ndarray], **extra) -> Digest:
    directory.mkdir()
    save_file(tensors, str(directory / "model.safetensors"))
    return put_checkpoint(store, directory, step=0, parent=None, extra=extra or None)


@pytest.fixture
def weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"a": rng.standard_normal((8, 4)).astype(np.float32),
            "b": rng.standard_normal(16).astype(np.float32)}


def test_small_drift_is_within_tolerance_with_measured_distance(
        store: Store, tmp_path: Path, weights: dict[str, np.ndarray]) -> None:
    drifted = {**weights, "b": weights["b"].copy()}
    drifted["b"][3] += np.float32(1e-4)
    a = checkpoint(store, tmp_path / "a", weights)
    b = checkpoint(store, tmp_path / "b", drifted)
    [(name, verdict)] = compare_outputs(store, {"checkpoint": a}, {"checkpoint": b}).items()
    assert name == "checkpoint" and verdict.status == "within-tolerance"
    diff = drifted["b"].astype(np.float64) - weights["b"].astype(np.float64)
    norm = np.sqrt(sum(float(np.sum(w.astype(np.float64) ** 2)) for w in weights.values()))
    assert verdict.max_abs_diff == pytest.approx(float(np.max(np.abs(diff))), rel=1e-12)
    assert verdict.relative_l2 == pytest.approx(float(np.linalg.norm(diff)) / norm, rel=1e-9)
    assert verdict.relative_l2 < CHECKPOINT_TOLERANCE
    assert verdict.to_json()["status"] == "within-tolerance"


def test_large_change_is_different(store: Store, tmp_path: Path,
                                   weights: dict[str, np.ndarray]) -> None:
    a = checkpoint(store, tmp_path / "a", weights)
    b = checkpoint(store, tmp_path / "b", {k: v * 2 for k, v in weights.items()})
    verdict = compare_outputs(store, {"c": a}, {"c": b})["c"]
    assert verdict.status == "different"
    assert verdict.relative_l2 == pytest.approx(1.0, rel=1e-6)


def test_same_parameters_with_other_members_is_identical(
        store: Store, tmp_path: Path, weights: dict[str, np.ndarray]) -> None:
    a = checkpoint(store, tmp_path / "a", weights)
    b = checkpoint(store, tmp_path / "b", weights, note="made elsewhere")
    assert a != b
    verdict = compare_outputs(store, {"c": a}, {"c": b})["c"]
    assert verdict.status == "identical" and verdict.note.startswith("same parameters")


def test_blobs_and_missing_outputs(store: Store) -> None:
    x, y = store.put_bytes(b"x"), store.put_bytes(b"y")
    verdicts = compare_outputs(store, {"same": x, "other": x, "gone": x},
                               {"same": x, "other": y, "new": y})
    assert {k: v.status for k, v in verdicts.items()} == {
        "gone": "different", "new": "different", "other": "different", "same": "identical"}
    assert verdicts["gone"].note == "present in only one run"
