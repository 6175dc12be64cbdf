"""The parameter distance (``nscas.models.distance``): its definitions on stored checkpoints, the
``--rerun`` verdict built on it, and streaming (one tensor of each model open at a time, in
bounded memory)."""

from __future__ import annotations

import math
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pytest
from safetensors.numpy import save_file

from nscas.models.checkpoints import put_checkpoint
from nscas.models.distance import Incomparable, compare_params
from nscas.objects.digests import Digest
from nscas.objects.segments import TENSOR_SPLIT
from nscas.runs.verdicts import compare_outputs
from nscas.store.writer import Store


def params(store: Store, directory: Path, tensors: dict[str, np.ndarray]) -> Digest:
    directory.mkdir()
    save_file(tensors, str(directory / "model.safetensors"))
    checkpoint = put_checkpoint(store, directory, step=0, parent=None)
    return Digest.parse(store.get_record(checkpoint)["params"])


def test_distances_per_tensor_layer_and_overall(store: Store, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    base = {"model.embed_tokens.weight": rng.standard_normal((6, 4)).astype(np.float32),
            "model.layers.0.w": rng.standard_normal(5).astype(np.float32),
            "model.layers.1.w": rng.standard_normal(5).astype(np.float32),
            "model.norm.weight": np.ones(4, dtype=np.float32),
            "model.zero": np.zeros(3, dtype=np.float32)}
    cand = {k: v.copy() for k, v in base.items()}
    cand["model.layers.1.w"][2] += np.float32(0.5)
    cand["model.embed_tokens.weight"] *= np.float32(1.01)
    a, b = params(store, tmp_path / "a", base), params(store, tmp_path / "b", cand)
    diff = compare_params(store, a, b, chunk_elements=4)  # slices across tensor boundaries
    names = sorted(base)
    assert [t.name for t in diff.tensors] == names
    d = np.concatenate([cand[n].astype(np.float64).ravel() - base[n].astype(np.float64).ravel()
                        for n in names])
    ref = np.concatenate([base[n].astype(np.float64).ravel() for n in names])
    total = diff.total
    assert total.relative_l2 == pytest.approx(np.linalg.norm(d) / np.linalg.norm(ref),
                                              rel=1e-12)
    assert total.max_abs_diff == float(np.max(np.abs(d)))
    assert total.elements == d.size and diff.identical_tensors == 3
    by = {t.name: t for t in diff.tensors}
    assert by["model.zero"].identical and by["model.zero"].sums.relative_l2 == 0.0
    assert by["model.layers.1.w"].sums.max_abs_diff == pytest.approx(0.5)
    assert list(diff.layers()) == [0, 1] and diff.layers()[0].relative_l2 == 0.0


def test_undefined_and_incomparable(store: Store, tmp_path: Path) -> None:
    zero = params(store, tmp_path / "z", {"w": np.zeros(2, dtype=np.float32)})
    one = params(store, tmp_path / "o", {"w": np.ones(2, dtype=np.float32)})
    nan = params(store, tmp_path / "n", {"w": np.array([1, np.nan], dtype=np.float32)})
    assert compare_params(store, zero, one).total.relative_l2 is None  # all-zero reference
    assert compare_params(store, one, zero).total.relative_l2 == 1.0
    undefined = compare_params(store, one, nan).total
    assert undefined.relative_l2 is None and undefined.max_abs_diff is None
    other = params(store, tmp_path / "x", {"w": np.ones(3, dtype=np.float32)})
    with pytest.raises(Incomparable, match="tensor 'w' is F32"):
        compare_params(store, one, other)


def test_the_rerun_verdict_is_this_distance(store: Store, tmp_path: Path) -> None:
    base = {"w": np.linspace(-1, 1, 64, dtype=np.float32)}
    drifted = {"w": base["w"] + np.float32(1e-5)}
    a, b = params(store, tmp_path / "a", base), params(store, tmp_path / "b", drifted)
    verdict = compare_outputs(store, {"p": a}, {"p": b})["p"]
    total = compare_params(store, a, b).total
    assert verdict.status == "within-tolerance"
    assert (verdict.relative_l2, verdict.max_abs_diff) == (total.relative_l2,
                                                           total.max_abs_diff)


class _Counting:
    """A store whose ``open`` counts the objects open at once, by model."""

    def __init__(self, store: Store, models: dict[str, str]) -> None:
        self.store = store
        self.models = models  # tensor data ID -> which model
        self.open_now: list[str] = []
        self.most: list[list[str]] = []

    def get_record(self, oid: Digest) -> dict[str, Any]:
        return self.store.get_record(oid)

    @contextmanager
    def _tracked(self, oid: Digest) -> Iterator[BinaryIO]:
        with self.store.open(oid) as f:
            self.open_now.append(self.models[str(oid)])
            self.most.append(list(self.open_now))
            try:
                yield f
            finally:
                self.open_now.pop()

    def open(self, oid: Digest) -> Any:
        return self._tracked(oid)


def test_two_models_are_streamed_never_held(store: Store, tmp_path: Path) -> None:
    """Three 40 MB tensors per model (each stored as parts, as a 1.7B model's are): at most
    one tensor of each model is open at a time, and the comparison holds less than one
    model's bytes (the store reads a part at a time, the comparison a slice at a time)."""
    n = 10_000_000
    rng = np.random.default_rng(2)
    base = {f"model.layers.{i}.w": rng.standard_normal(n).astype(np.float32) for i in range(3)}
    cand = {k: v + np.float32(1e-3) for k, v in base.items()}
    a, b = params(store, tmp_path / "a", base), params(store, tmp_path / "b", cand)
    models = {t["data"]: "a" for t in store.get_record(a)["tensors"].values()}
    models |= {t["data"]: "b" for t in store.get_record(b)["tensors"].values()}
    counting = _Counting(store, models)
    tracemalloc.start()
    try:
        diff = compare_params(counting, a, b, chunk_elements=1 << 14)  # type: ignore[arg-type]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert max(len(x) for x in counting.most) == 2
    assert all(sorted(x) in (["a"], ["a", "b"]) for x in counting.most)
    # The store holds one leaf (at most TENSOR_SPLIT bytes) of each open object, the
    # comparison a slice of each: bounded whatever the model's size, and below one model.
    assert peak < 2 * TENSOR_SPLIT + (16 << 20), peak
    assert peak < 3 * n * 4, peak
    assert math.isclose(diff.total.max_abs_diff or 0, 1e-3, rel_tol=1e-2)
