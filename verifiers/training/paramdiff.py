"""The distance between two checkpoints' parameters, recomputed from their safetensors files
(docs/experiment.md §6.5), streamed: one tensor of each checkpoint at a time, a slice at a
time, so two 1.7B-parameter checkpoints are never in memory together.

Definitions (the report's ``parameters`` part): tensors are paired by name (both checkpoints
must hold the same names, dtypes and shapes); values are read as float64 (BF16 widened by
hand; dtypes without a NumPy reading, the 8-, 6- and 4-bit floats and C64, as their raw bytes'
unsigned values). Per tensor ``diff_sq = Σ (candidate − baseline)²``, ``ref_sq = Σ baseline²``,
``max_abs = max |candidate − baseline|`` and ``identical`` (the same raw bytes); over a group
(all tensors, or a layer: the tensors named ``layers.<n>.``) the sums add up and the maximum is
the largest. ``relative_l2 = √diff_sq / √ref_sq``, 0 when ``diff_sq`` is 0, None when
``ref_sq`` is 0 but ``diff_sq`` is not or a value is not finite; ``max_abs_diff`` None when not
finite.

The sums are float64 sums of the same values as the report's, in another order (slices of
``SLICE_VALUES``), so they agree within the ``float_recomputation`` tolerance (relative 1e-9),
not bit for bit: the summands are squares, all non-negative, so no cancellation amplifies the
rounding. Maxima and ``identical`` are exact.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..core.errors import InvalidArgument, SafetensorsError
from ..records.closure import Objects, Unusable
from .params import TensorSpec, read_header

SLICE_VALUES = 1 << 20
"""Values read from each tensor at a time (8 MiB as float64)."""
NUMPY = {"BOOL": "|b1", "U8": "|u1", "I8": "|i1", "I16": "<i2", "U16": "<u2", "F16": "<f2",
         "I32": "<i4", "U32": "<u4", "F32": "<f4", "F64": "<f8", "I64": "<i8", "U64": "<u8"}
"""dtypes read as NumPy numbers; BF16 is widened by hand, every other dtype read as bytes."""
LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
NOTE = ("relative_l2 = ||candidate - baseline|| / ||baseline|| over float64 values (0 when "
        "they are equal, null where undefined); max_abs_diff = max |candidate - baseline|; "
        "identical: the same raw bytes; a layer is the tensors named layers.<n>.")
"""The report's fixed prose of the ``parameters`` part."""


@dataclass(slots=True)
class _Sums:
    elements: int = 0
    diff_sq: float = 0.0
    ref_sq: float = 0.0
    max_abs: float = 0.0

    def add(self, other: _Sums) -> None:
        self.elements += other.elements
        self.diff_sq += other.diff_sq
        self.ref_sq += other.ref_sq
        self.max_abs = _larger(self.max_abs, other.max_abs)

    def to_json(self) -> dict[str, Any]:
        finite = math.isfinite(self.diff_sq) and math.isfinite(self.ref_sq)
        if not finite:
            rel = None
        elif self.diff_sq == 0:
            rel = 0.0
        elif self.ref_sq == 0:
            rel = None
        else:
            rel = math.sqrt(self.diff_sq) / math.sqrt(self.ref_sq)
        return {"relative_l2": rel,
                "max_abs_diff": self.max_abs if math.isfinite(self.max_abs) else None}


def _larger(a: float, b: float) -> float:
    return math.nan if math.isnan(a) or math.isnan(b) else max(a, b)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Tensor:
    path: Path
    spec: TensorSpec


class _Checkpoint:
    """A checkpoint's ``*.safetensors`` files as files (``Objects.as_file``) and their
    tensors by name; raises ``Unusable`` (needing weights when the bundle omitted them)."""

    def __init__(self, objects: Objects, checkpoint: str, stack: ExitStack) -> None:
        record = objects.record_of(checkpoint, "checkpoint/1")
        entries = objects.record_of(record["files"], "tree/1")["entries"]
        weights = [entries[p]["id"] for p in sorted(entries) if p.endswith(".safetensors")]
        if not weights:
            raise Unusable(record["files"], "the checkpoint's files hold no *.safetensors")
        self.params: str = record["params"]
        self.tensors: dict[str, _Tensor] = {}
        for number, oid in enumerate(weights):
            path = stack.enter_context(objects.as_file(oid, f"compare-{number}.safetensors"))
            try:
                header = read_header(path)
            except SafetensorsError as exc:
                raise Unusable(oid, exc.message) from None
            for name, spec in header.tensors.items():
                if name in self.tensors:
                    raise Unusable(oid, f"tensor {name!r} repeats across weight files")
                self.tensors[name] = _Tensor(path=path, spec=spec)


def _reading(dtype: str) -> tuple[str, int]:
    """(NumPy type string or ``bf16``, bytes per value)."""
    if dtype == "BF16":
        return "bf16", 2
    if dtype in NUMPY:
        return NUMPY[dtype], np.dtype(NUMPY[dtype]).itemsize
    return "|u1", 1


def _values(raw: bytes, how: str) -> np.ndarray:
    if how == "bf16":
        return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(
            np.float32).astype(np.float64)
    return np.frombuffer(raw, dtype=np.dtype(how)).astype(np.float64)


def _slices(stream: BinaryIO, spec: TensorSpec, width: int) -> Iterator[bytes]:
    """The tensor's bytes, a slice at a time; every read seeks first (both checkpoints may
    be one file)."""
    step = SLICE_VALUES * width
    at = spec.begin
    while at < spec.end:
        stream.seek(at)
        raw = stream.read(min(step, spec.end - at))
        if not raw or len(raw) % width:
            raise InvalidArgument("safetensors file", f"it ends inside tensor {spec.name!r}")
        at += len(raw)
        yield raw


def _tensor(a: _Tensor, b: _Tensor, files: Mapping[Path, BinaryIO]) -> tuple[_Sums, bool]:
    """The sums of one tensor pair (``a`` the baseline) and whether its bytes are equal."""
    how, width = _reading(a.spec.dtype)
    sums = _Sums(elements=a.spec.nbytes // width)
    identical, equal_not_finite = True, False
    for x, y in zip(_slices(files[a.path], a.spec, width), _slices(files[b.path], b.spec, width),
                    strict=True):
        u = _values(x, how)
        ref = float(np.sum(u * u))
        sums.ref_sq += ref
        if x == y:  # equal finite values differ by exactly 0; NaN or infinity by NaN
            equal_not_finite = equal_not_finite or not bool(np.isfinite(u).all())
            continue
        identical = False
        d = _values(y, how) - u
        sums.diff_sq += float(np.sum(d * d))
        sums.max_abs = _larger(sums.max_abs, float(np.max(np.abs(d))))
    if not identical and equal_not_finite:  # an identical tensor differs by 0 by definition
        sums.diff_sq = sums.max_abs = math.nan
    return sums, identical


def compare_checkpoints(objects: Objects, baseline: str, candidate: str) -> dict[str, Any]:
    """The distance of ``candidate``'s parameters from ``baseline``'s, as report.json's
    ``parameters.pairs[]`` holds it (without the pair's kind and arm names)."""
    with ExitStack() as stack:
        a = _Checkpoint(objects, baseline, stack)
        b = _Checkpoint(objects, candidate, stack)
        if a.tensors.keys() != b.tensors.keys():
            only = sorted(a.tensors.keys() ^ b.tensors.keys())
            raise InvalidArgument("compared checkpoints", f"{baseline} and {candidate} hold "
                                  f"different tensor names (e.g. {only[0]!r})")
        files = {path: stack.enter_context(path.open("rb"))
                 for path in {t.path for t in (*a.tensors.values(), *b.tensors.values())}}
        total, by_tensor, identical = _Sums(), [], 0
        layers: dict[int, _Sums] = {}
        for name in sorted(a.tensors):
            x, y = a.tensors[name], b.tensors[name]
            if (x.spec.dtype, x.spec.shape) != (y.spec.dtype, y.spec.shape):
                raise InvalidArgument("compared checkpoints", f"tensor {name!r} is "
                                      f"{x.spec.dtype}{list(x.spec.shape)} in {baseline} and "
                                      f"{y.spec.dtype}{list(y.spec.shape)} in {candidate}")
            sums, same = _tensor(x, y, files)
            identical += same
            total.add(sums)
            found = LAYER.search(name)
            if found is not None:
                layers.setdefault(int(found.group(1)), _Sums()).add(sums)
            by_tensor.append({"name": name, "elements": sums.elements, "identical": same,
                              **sums.to_json()})
    return {"baseline_parameters": a.params, "candidate_parameters": b.params,
            "tensors": len(by_tensor), "elements": total.elements,
            "identical_tensors": identical, **total.to_json(),
            "layers": [{"layer": n, **layers[n].to_json()} for n in sorted(layers)],
            "by_tensor": by_tensor}


def parameters(objects: Objects, models: Mapping[str, str],
               comparisons: list[dict[str, Any]]) -> dict[str, Any]:
    """report.json's ``parameters``: a pair per comparison (``kind``, ``candidate``,
    ``baseline`` arm names), each arm's checkpoint from ``models``."""
    pairs = []
    for c in comparisons:
        pair = compare_checkpoints(objects, models[c["baseline"]], models[c["candidate"]])
        pairs.append({"kind": c["kind"], "candidate": c["candidate"],
                      "baseline": c["baseline"], **{k: pair[k] for k in (
                          "candidate_parameters", "baseline_parameters")},
                      **{k: v for k, v in pair.items() if not k.endswith("_parameters")}})
    return {"note": NOTE, "pairs": pairs}
