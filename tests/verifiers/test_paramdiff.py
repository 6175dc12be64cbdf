"""The verifiers' parameter distance (``verifiers/paramdiff``), from safetensors files: it
agrees with the report's (``nscas.models.distance``, another implementation) within the named
tolerance, and it streams: a slice of each checkpoint at a time, never a whole one."""

from __future__ import annotations

import json
import math
import struct
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

import nscas.verifiers.training.paramdiff as paramdiff
from nscas.models.checkpoints import put_checkpoint
from nscas.models.distance import compare_params
from nscas.objects.digests import Digest
from nscas.store.writer import Store
from nscas.verifiers.report.strict import REL_TOL


class _Files:
    """The two methods ``compare_checkpoints`` uses of ``Objects``, over files on disk."""

    def __init__(self, models: dict[str, Path]) -> None:
        self.models = models

    def record_of(self, oid: str, kind: str) -> dict[str, Any]:
        if kind == "checkpoint/1":
            return {"files": f"tree:{oid}", "params": f"params:{oid}"}
        model = oid.removeprefix("tree:")
        return {"entries": {"model.safetensors": {"id": model}}}

    @contextmanager
    def as_file(self, oid: str, name: str = "object") -> Iterator[Path]:
        yield self.models[oid]


def _bf16(a: np.ndarray) -> np.ndarray:
    return (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _write_bf16(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """A safetensors file of BF16 tensors (their bit patterns as uint16), written by hand."""
    header, at = {}, 0
    for name, bits in tensors.items():
        header[name] = {"dtype": "BF16", "shape": list(bits.shape),
                        "data_offsets": [at, at + bits.nbytes]}
        at += bits.nbytes
    text = json.dumps(header).encode()
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for bits in tensors.values():
            f.write(bits.astype("<u2").tobytes())


def test_it_agrees_with_the_report_within_the_tolerance(store: Store, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(3)
    base = {"model.layers.0.w": rng.standard_normal((300, 7)).astype(np.float32),
            "model.layers.1.w": rng.standard_normal(999).astype(np.float64),
            "model.embed_tokens.weight": rng.standard_normal(64).astype(np.float16),
            "model.norm.weight": np.ones(8, dtype=np.float32)}
    cand = {k: (v + (rng.standard_normal(v.shape) * 1e-3).astype(v.dtype)
                if k != "model.norm.weight" else v.copy()) for k, v in base.items()}
    paths, params = {}, {}
    for label, tensors in (("base", base), ("cand", cand)):
        folder = tmp_path / label
        folder.mkdir()
        save_file(tensors, str(folder / "model.safetensors"))
        paths[label] = folder / "model.safetensors"
        ckpt = put_checkpoint(store, folder, step=0, parent=None)
        params[label] = Digest.parse(store.get_record(ckpt)["params"])
    monkeypatch.setattr(paramdiff, "SLICE_VALUES", 100)  # other slices than the report's
    mine = paramdiff.compare_checkpoints(_Files(paths), "base", "cand")  # type: ignore[arg-type]
    theirs = compare_params(store, params["base"], params["cand"])
    assert mine["relative_l2"] == pytest.approx(theirs.total.relative_l2, rel=REL_TOL)
    assert mine["max_abs_diff"] == theirs.total.max_abs_diff  # maxima are exact
    assert mine["identical_tensors"] == theirs.identical_tensors == 1
    assert [t["name"] for t in mine["by_tensor"]] == [t.name for t in theirs.tensors]
    for t, u in zip(mine["by_tensor"], theirs.tensors, strict=True):
        assert t["elements"] == u.sums.elements and t["identical"] is u.identical
        assert t["relative_l2"] == pytest.approx(u.sums.relative_l2, rel=REL_TOL)
    assert [x["layer"] for x in mine["layers"]] == list(theirs.layers()) == [0, 1]


def test_bf16_and_two_large_checkpoints_stream(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Two checkpoints of 3 x 8 MB in slices of 64k values: the comparison holds a few
    slices, far less than one checkpoint (the files are read, never loaded)."""
    monkeypatch.setattr(paramdiff, "SLICE_VALUES", 1 << 16)
    rng = np.random.default_rng(4)
    n = 4_000_000
    values = {label: {f"model.layers.{i}.w": rng.standard_normal(n).astype(np.float32)
                      for i in range(3)} for label in ("a", "b")}
    paths = {}
    for label, tensors in values.items():
        paths[label] = tmp_path / f"{label}.safetensors"
        _write_bf16(paths[label], {k: _bf16(v) for k, v in tensors.items()})
    tracemalloc.start()
    try:
        result = paramdiff.compare_checkpoints(_Files(paths), "a", "b")  # type: ignore[arg-type]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * n * 2 / 4, peak  # a quarter of one checkpoint's bytes
    widened = {k: {n_: (_bf16(v).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
                   for n_, v in t.items()} for k, t in values.items()}
    d = np.concatenate([widened["b"][k] - widened["a"][k] for k in sorted(widened["a"])])
    ref = np.concatenate([widened["a"][k] for k in sorted(widened["a"])])
    assert math.isclose(result["relative_l2"], float(np.linalg.norm(d) / np.linalg.norm(ref)),
                        rel_tol=REL_TOL)
    assert result["elements"] == 3 * n
