"""How far apart two models' parameters are: the one distance that the ``--rerun`` verdict on
checkpoints (``nscas.runs.verdicts``) and the report's parameter comparison (recipe ``report``) use.

Two ``params/1`` records (docs/format.md §4) are compared tensor by tensor, by name; both must
hold the same names, each with the same dtype and shape. Per tensor, in float64:
``diff_sq = Σ (candidate − baseline)²``, ``ref_sq = Σ baseline²`` and
``max_abs = max |candidate − baseline|``; a tensor is ``identical`` when its raw bytes are
(the same data blob). Over all tensors, or a group of them (a layer), the sums add up and the
maximum is the largest. ``relative_l2 = √diff_sq / √ref_sq``: 0 when ``diff_sq`` is 0, and
None (undefined) when the baseline is all zero but the candidate is not, or when a value is
not finite (NaN or infinity in the weights); ``max_abs_diff`` None when not finite.

Values are read as their dtype's numbers (BF16 widened by hand); dtypes NumPy cannot read
(8-, 6- and 4-bit floats, C64) are compared as their raw bytes' unsigned values, as the
verdict always did.

Tensors are streamed: one tensor of each model at a time, read from the store in slices of at
most ``CHUNK_ELEMENTS`` elements, so comparing two 1.7B-parameter checkpoints holds a few
slices, never a model (nor one whole embedding matrix). Sums are taken slice by slice with
NumPy's pairwise summation (no BLAS), so a rerun on any machine gives the same bits.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from nscas.errors import InvalidInput
from nscas.objects.digests import Digest
from nscas.objects.dtypes import DTYPES

if TYPE_CHECKING:
    from nscas.store.protocol import ObjectReader

CHUNK_ELEMENTS = 1 << 20
"""Elements read from each tensor at a time (8 MiB of float64 per slice)."""
LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
"""A tensor belongs to layer ``n`` when its name holds ``layers.<n>.`` (``model.layers.3.mlp``)."""


class Incomparable(InvalidInput):
    """Two parameter sets that are not two values of the same model: another tensor name,
    dtype or shape, or tensor data that does not fill its shape."""

    def __init__(self, why: str, *, tensor: str | None = None) -> None:
        super().__init__(f"the parameters cannot be compared: {why}")
        self.why = why
        self.tensor = tensor


@dataclass(frozen=True, slots=True, kw_only=True)
class Sums:
    """The sums over some tensors that every distance is computed from."""

    elements: int
    diff_sq: float
    ref_sq: float
    max_abs: float

    @property
    def relative_l2(self) -> float | None:
        """``√diff_sq / √ref_sq``; 0 for no difference; None where undefined."""
        if not (math.isfinite(self.diff_sq) and math.isfinite(self.ref_sq)):
            return None
        if self.diff_sq == 0:
            return 0.0
        if self.ref_sq == 0:
            return None
        return math.sqrt(self.diff_sq) / math.sqrt(self.ref_sq)

    @property
    def max_abs_diff(self) -> float | None:
        return self.max_abs if math.isfinite(self.max_abs) else None

    def __add__(self, other: Sums) -> Sums:
        return Sums(elements=self.elements + other.elements,
                    diff_sq=self.diff_sq + other.diff_sq, ref_sq=self.ref_sq + other.ref_sq,
                    max_abs=_larger(self.max_abs, other.max_abs))


ZERO = Sums(elements=0, diff_sq=0.0, ref_sq=0.0, max_abs=0.0)


def _larger(a: float, b: float) -> float:
    """The larger of two maxima, NaN winning (Python's ``max`` depends on the order)."""
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return max(a, b)


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorDiff:
    name: str
    dtype: str
    shape: tuple[int, ...]
    identical: bool
    """The raw bytes are the same."""
    sums: Sums


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamsDiff:
    """The distance of ``candidate``'s parameters from ``baseline``'s, tensor by tensor in
    name order."""

    baseline: Digest
    candidate: Digest
    tensors: tuple[TensorDiff, ...]

    @property
    def total(self) -> Sums:
        return sum((t.sums for t in self.tensors), ZERO)

    @property
    def identical_tensors(self) -> int:
        return sum(t.identical for t in self.tensors)

    def layers(self) -> dict[int, Sums]:
        """The sums of each layer's tensors (``LAYER``), by layer number in order."""
        out: dict[int, Sums] = {}
        for t in self.tensors:
            found = LAYER.search(t.name)
            if found is not None:
                n = int(found.group(1))
                out[n] = out.get(n, ZERO) + t.sums
        return dict(sorted(out.items()))


def compare_params(store: ObjectReader, baseline: Digest, candidate: Digest, *,
                   chunk_elements: int = CHUNK_ELEMENTS) -> ParamsDiff:
    """The distance of params/1 record ``candidate`` from params/1 record ``baseline``
    (the reference of the relative distance); raises ``Incomparable``."""
    ta = store.get_record(baseline)["tensors"]
    tb = store.get_record(candidate)["tensors"]
    if ta.keys() != tb.keys():
        only = sorted(ta.keys() ^ tb.keys())
        raise Incomparable(f"different tensor names ({len(only)} in only one, e.g. "
                           f"{only[0]!r})", tensor=only[0])
    out = []
    for name in sorted(ta):
        x, y = ta[name], tb[name]
        if (x["dtype"], x["shape"]) != (y["dtype"], y["shape"]):
            raise Incomparable(f"tensor {name!r} is {x['dtype']}{x['shape']} in one and "
                               f"{y['dtype']}{y['shape']} in the other", tensor=name)
        out.append(_tensor(store, name, x, y, chunk_elements))
    return ParamsDiff(baseline=baseline, candidate=candidate, tensors=tuple(out))


def _tensor(store: ObjectReader, name: str, x: Mapping[str, Any], y: Mapping[str, Any],
            chunk_elements: int) -> TensorDiff:
    dtype, shape = x["dtype"], tuple(x["shape"])
    read = _Reader.of(dtype, math.prod(shape), name)
    same = x["data"] == y["data"]
    diff_sq = ref_sq = 0.0
    max_abs = 0.0
    with store.open(Digest.parse(x["data"])) as fa:
        if same:
            for u in read.slices(fa, chunk_elements):
                ref_sq += float(np.sum(u * u))
        else:
            with store.open(Digest.parse(y["data"])) as fb:
                for u, v in zip(read.slices(fa, chunk_elements),
                                read.slices(fb, chunk_elements), strict=True):
                    d = v - u
                    diff_sq += float(np.sum(d * d))
                    ref_sq += float(np.sum(u * u))
                    if d.size:
                        max_abs = _larger(max_abs, float(np.max(np.abs(d))))
    return TensorDiff(name=name, dtype=dtype, shape=shape, identical=same,
                      sums=Sums(elements=read.elements, diff_sq=diff_sq, ref_sq=ref_sq,
                                max_abs=max_abs))


@dataclass(frozen=True, slots=True, kw_only=True)
class _Reader:
    """How one tensor's bytes read as float64 values, a slice at a time."""

    name: str
    numpy: str | None
    """The NumPy type string; None: BF16 (``bf16``) or raw bytes (``raw``)."""
    how: str
    elements: int
    """Values compared (bytes, for the raw dtypes)."""
    width: int
    """Bytes per value read."""

    @classmethod
    def of(cls, dtype: str, count: int, name: str) -> _Reader:
        known = DTYPES.get(dtype)
        if known is None:
            raise Incomparable(f"tensor {name!r} has unknown dtype {dtype!r}", tensor=name)
        if dtype == "BF16":
            return cls(name=name, numpy="<u2", how="bf16", elements=count, width=2)
        if known.numpy is None:
            raw = (count * known.bits + 7) // 8
            return cls(name=name, numpy="|u1", how="raw", elements=raw, width=1)
        return cls(name=name, numpy=known.numpy, how="plain", elements=count,
                   width=np.dtype(known.numpy).itemsize)

    def slices(self, f: BinaryIO, chunk_elements: int) -> Iterator[np.ndarray]:
        left = self.elements
        while left:
            n = min(left, chunk_elements)
            raw = f.read(n * self.width)
            if len(raw) != n * self.width:
                raise Incomparable(f"tensor {self.name!r}'s data is shorter than its shape",
                                   tensor=self.name)
            left -= n
            yield self._values(raw)
        if f.read(1):
            raise Incomparable(f"tensor {self.name!r}'s data is longer than its shape",
                               tensor=self.name)

    def _values(self, raw: bytes) -> np.ndarray:
        if self.how == "bf16":
            halves = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            return halves.view(np.float32).astype(np.float64)
        return np.frombuffer(raw, dtype=np.dtype(self.numpy)).astype(np.float64)

