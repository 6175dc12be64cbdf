"""The parameter comparison: how far apart the compared arms' trained weights are, apart from
task quality (report.json ``parameters``; docs/experiment.md §6.5).

One pair per paired comparison of ``learning`` (each arm against the seed, clean against
damaged, the pair against the single), in that order: the candidate's parameters against the
baseline's by ``nscas.models.distance`` (the ``--rerun`` verdict's distance), over all tensors, per
layer and per tensor. All pairs are compared in one pass (``compare_pairs``: each model's
tensors read once, however many pairs it is in; the same bits as ``compare_params`` per pair),
one tensor of each model at a time, on as many threads as the step was given cores.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nscas.errors import RecipeError
from nscas.models.distance import Incomparable, ParamsDiff, Sums, compare_pairs
from nscas.objects.digests import Digest
from nscas.store.protocol import ObjectReader

from .learning import ArmSummary, Comparison

NOTE = ("relative_l2 = ||candidate - baseline|| / ||baseline|| over float64 values (0 when "
        "they are equal, null where undefined); max_abs_diff = max |candidate - baseline|; "
        "identical: the same raw bytes; a layer is the tensors named layers.<n>.")
"""Fixed prose of the ``parameters`` part, regenerated exactly by the verifiers."""


def _sums(s: Sums) -> dict[str, Any]:
    return {"relative_l2": s.relative_l2, "max_abs_diff": s.max_abs_diff}


@dataclass(frozen=True, slots=True, kw_only=True)
class ParameterPair:
    """One compared pair of arms (``parameters.pairs[]``)."""

    kind: str
    candidate: str
    baseline: str
    diff: ParamsDiff

    def to_json(self) -> dict[str, Any]:
        total = self.diff.total
        return {
            "kind": self.kind, "candidate": self.candidate, "baseline": self.baseline,
            "candidate_parameters": str(self.diff.candidate),
            "baseline_parameters": str(self.diff.baseline),
            "tensors": len(self.diff.tensors), "elements": total.elements,
            "identical_tensors": self.diff.identical_tensors, **_sums(total),
            "layers": [{"layer": n, **_sums(s)} for n, s in self.diff.layers().items()],
            "by_tensor": [{"name": t.name, "elements": t.sums.elements,
                           "identical": t.identical, **_sums(t.sums)}
                          for t in self.diff.tensors],
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Parameters:
    """report.json's ``parameters`` part."""

    pairs: tuple[ParameterPair, ...]

    def to_json(self) -> dict[str, Any]:
        return {"note": NOTE, "pairs": [p.to_json() for p in self.pairs]}


def parameters_section(store: ObjectReader, arms: Mapping[str, ArmSummary],
                       comparisons: tuple[Comparison, ...]) -> Parameters:
    """The distance of every compared pair's parameters; an architecture mismatch is a
    ``RecipeError`` naming both arms."""
    def digests(c: Comparison) -> tuple[Digest, Digest]:
        return (Digest.parse(arms[c.baseline].parameter_digest),
                Digest.parse(arms[c.candidate].parameter_digest))

    try:
        diffs = compare_pairs(store, [digests(c) for c in comparisons],
                              threads=len(os.sched_getaffinity(0)))
    except Incomparable as exc:
        c = comparisons[exc.pair or 0]
        raise RecipeError(f"arm {c.candidate!r} ({arms[c.candidate].model}) and arm "
                          f"{c.baseline!r} ({arms[c.baseline].model}): {exc.message}") from None
    return Parameters(pairs=tuple(
        ParameterPair(kind=c.kind, candidate=c.candidate, baseline=c.baseline, diff=diff)
        for c, diff in zip(comparisons, diffs, strict=True)))
