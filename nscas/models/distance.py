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
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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
        self.pair: int | None = None
        """Which of ``compare_pairs``'s pairs (its index); None from ``compare_params``."""


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
    return compare_pairs(store, [(baseline, candidate)], chunk_elements=chunk_elements)[0]


def compare_pairs(store: ObjectReader, pairs: Sequence[tuple[Digest, Digest]], *,
                  chunk_elements: int = CHUNK_ELEMENTS, threads: int = 1) -> list[ParamsDiff]:
    """``compare_params`` of each (baseline, candidate) pair, bit for bit, with each tensor's
    data read once for all the pairs that hold it (a model in four pairs is read once), one
    tensor of each model at a time, ``threads`` tensors at once. Raises the ``Incomparable``
    that ``compare_params`` raises for the first pair that has one, its ``pair`` set to that
    pair's index."""
    records = {d: store.get_record(d)["tensors"] for pair in pairs for d in pair}
    plans: list[_Plan] = []
    for index, (baseline, candidate) in enumerate(pairs):
        plan = _Plan.of(index, records[baseline], records[candidate])
        plans.append(plan)
        if plan.failure is not None:  # no later pair can be the first to fail
            break
    names = sorted({name for plan in plans for name, _, _, _ in plan.tensors})
    work = [[(plan, job) for plan in plans for job in plan.tensors if job[0] == name]
            for name in names]

    def one(jobs: list[tuple[_Plan, _Job]]) -> list[tuple[_Plan, TensorDiff | Incomparable]]:
        return _compare_tensor(store, jobs, chunk_elements)

    if threads > 1 and len(work) > 1:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            done = list(pool.map(one, work))
    else:
        done = [one(jobs) for jobs in work]
    found: dict[int, list[TensorDiff]] = {plan.index: [] for plan in plans}
    for results in done:  # name order, so each pair's first data problem comes first
        for plan, result in results:
            if isinstance(result, Incomparable):
                plan.failures.append(result)
            else:
                found[plan.index].append(result)
    for plan in plans:
        failure = plan.failures[0] if plan.failures else plan.failure
        if failure is not None:
            failure.pair = plan.index
            raise failure
    return [ParamsDiff(baseline=b, candidate=c, tensors=tuple(found[i]))
            for i, (b, c) in enumerate(pairs)]


_Job = tuple[str, Mapping[str, Any], Mapping[str, Any], "_Reader"]
"""(name, baseline's tensor entry, candidate's, how its values read)."""


@dataclass(slots=True, kw_only=True)
class _Plan:
    """One pair's tensors to compare, in name order, up to its first problem of names,
    dtypes or shapes (``failure``), which a data problem in an earlier tensor would precede;
    ``failures``: the data problems found, in name order."""

    index: int
    tensors: list[_Job]
    failure: Incomparable | None
    failures: list[Incomparable]

    @classmethod
    def of(cls, index: int, ta: Mapping[str, Any], tb: Mapping[str, Any]) -> _Plan:
        plan = cls(index=index, tensors=[], failure=None, failures=[])
        if ta.keys() != tb.keys():
            only = sorted(ta.keys() ^ tb.keys())
            plan.failure = Incomparable(f"different tensor names ({len(only)} in only one, "
                                        f"e.g. {only[0]!r})", tensor=only[0])
            return plan
        for name in sorted(ta):
            x, y = ta[name], tb[name]
            try:
                if (x["dtype"], x["shape"]) != (y["dtype"], y["shape"]):
                    raise Incomparable(f"tensor {name!r} is {x['dtype']}{x['shape']} in one "
                                       f"and {y['dtype']}{y['shape']} in the other",
                                       tensor=name)
                read = _Reader.of(x["dtype"], math.prod(x["shape"]), name)
            except Incomparable as exc:
                plan.failure = exc
                return plan
            plan.tensors.append((name, x, y, read))
        return plan


def _compare_tensor(store: ObjectReader, jobs: list[tuple[_Plan, _Job]],
                    chunk_elements: int) -> list[tuple[_Plan, TensorDiff | Incomparable]]:
    """One tensor of every pair in ``jobs``: each distinct data object streamed once, slice by
    slice in step, each pair's sums taken exactly as for that pair alone."""
    streams: dict[tuple[str, _Reader], _Stream] = {}
    for _, (_, x, y, read) in jobs:
        for entry in (x, y):
            streams.setdefault((entry["data"], read), _Stream(read, chunk_elements))
    sums = [[0.0, 0.0, 0.0] for _ in jobs]  # diff_sq, ref_sq, max_abs of each job
    size = min(chunk_elements, max(s.read.elements for s in streams.values()))
    d, sq = np.empty(size), np.empty(size)
    with ExitStack() as stack:
        for (data, _), s in streams.items():
            s.file = stack.enter_context(store.open(Digest.parse(data)))
        for j in range(max(s.slices for s in streams.values())):
            for s in streams.values():
                s.advance(j)
            for (_, (_, x, y, read)), acc in zip(jobs, sums, strict=True):
                a, b = streams[x["data"], read], streams[y["data"], read]
                if j >= a.slices or a.failed or (a is not b and b.failed):
                    continue
                acc[1] += a.ref_sq(sq)
                if a is b:
                    continue
                n = a.count
                np.subtract(b.values, a.values, out=d[:n])
                np.abs(d[:n], out=sq[:n])
                if n:
                    acc[2] = _larger(acc[2], float(np.max(sq[:n])))
                acc[0] += float(np.sum(np.multiply(d[:n], d[:n], out=sq[:n])))
        for s in streams.values():
            s.finish()
    out: list[tuple[_Plan, TensorDiff | Incomparable]] = []
    for (plan, (name, x, y, read)), (diff_sq, ref_sq, max_abs) in zip(jobs, sums, strict=True):
        a, b = streams[x["data"], read], streams[y["data"], read]
        problems = [p for p in (a.failure(0), b.failure(1) if a is not b else None) if p]
        if problems:
            out.append((plan, Incomparable(min(problems)[2], tensor=name)))
            continue
        out.append((plan, TensorDiff(
            name=name, dtype=x["dtype"], shape=tuple(x["shape"]), identical=a is b,
            sums=Sums(elements=read.elements, diff_sq=diff_sq, ref_sq=ref_sq,
                      max_abs=max_abs))))
    return out


class _Stream:
    """One tensor data object read slice by slice into buffers it reuses; ``values``: the
    current slice as float64."""

    def __init__(self, read: _Reader, chunk_elements: int) -> None:
        self.read = read
        self.chunk = chunk_elements
        self.slices = -(-read.elements // chunk_elements)
        first = min(read.elements, chunk_elements)
        self._raw = memoryview(bytearray(first * read.width))
        self._values = np.empty(first)
        self.values = self._values[:0]
        self.count = 0
        self.file: Any = None
        self.failed: tuple[int, str] | None = None
        """(slice, why) where the data stopped fitting its shape."""
        self._ref: float | None = None

    def advance(self, j: int) -> None:
        """Read slice ``j`` (if this stream has it and has not failed)."""
        if j >= self.slices or self.failed:
            return
        n = min(self.read.elements - j * self.chunk, self.chunk)
        raw = self._raw[:n * self.read.width]
        if _fill(self.file, raw) != len(raw):
            self.failed = (j, f"tensor {self.read.name!r}'s data is shorter than its shape")
            return
        if self.read.how == "plain":
            self.values = self._values[:n]
            self.values[...] = np.frombuffer(raw, dtype=np.dtype(self.read.numpy))
        else:
            self.values = self.read.values(raw)
        self.count = n
        self._ref = None

    def ref_sq(self, scratch: np.ndarray) -> float:
        """Σ values² of the current slice (taken once, whatever the pairs that need it)."""
        if self._ref is None:
            n = self.count
            self._ref = float(np.sum(np.multiply(self.values, self.values, out=scratch[:n])))
        return self._ref

    def finish(self) -> None:
        if not self.failed and self.file.read(1):
            self.failed = (self.slices,
                           f"tensor {self.read.name!r}'s data is longer than its shape")

    def failure(self, side: int) -> tuple[int, int, str] | None:
        """When, in a pair's lockstep read (slice, then baseline before candidate), this
        stream's problem shows, and what it is."""
        return None if self.failed is None else (self.failed[0], side, self.failed[1])


def _fill(f: Any, view: memoryview) -> int:
    """Bytes read into ``view``: all of it unless the stream ends first."""
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            break
        got += n
    return got


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

    def values(self, raw: bytes | memoryview) -> np.ndarray:
        """The float64 values of ``raw`` (BF16 widened by hand)."""
        if self.how == "bf16":
            halves = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            return halves.view(np.float32).astype(np.float64)
        return np.frombuffer(raw, dtype=np.dtype(self.numpy)).astype(np.float64)

