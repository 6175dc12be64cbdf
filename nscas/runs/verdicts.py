"""Reproduction verdicts: how a rerun's outputs compare with the first run's."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from nscas.objects.digests import Digest

if TYPE_CHECKING:
    from nscas.store.protocol import ObjectReader

Status = Literal["identical", "within-tolerance", "reproduced", "different"]
"""``reproduced``: a measurement output (``Recipe.measurements``) whose reproducible part is
the same while its measured values (timings) differ (docs/format.md §6.6)."""
TIMINGS_DIFFER = "timings differ"
# Relative L2 distance (nscas.models.distance) below which two checkpoints count as the same
# computation up to rounding.
CHECKPOINT_TOLERANCE = 1e-3


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    status: Status
    before: Digest | None
    after: Digest | None
    relative_l2: float | None = None
    max_abs_diff: float | None = None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status, "before": str(self.before) if self.before else None,
                               "after": str(self.after) if self.after else None}
        if self.relative_l2 is not None:
            out["relative_l2"] = self.relative_l2
            out["max_abs_diff"] = self.max_abs_diff
        if self.note:
            out["note"] = self.note
        return out


def compare_outputs(store: ObjectReader, before: Mapping[str, Digest], after: Mapping[str, Digest],
                    *, measurements: Mapping[str, Callable[[ObjectReader, Digest], Any]] | None = None
                    ) -> dict[str, Verdict]:
    """A verdict per output; ``measurements`` maps the outputs that hold measurements to the
    function giving the part of them that must reproduce (``nscas.runs.recipe.Reproducible``)."""
    out: dict[str, Verdict] = {}
    for name in sorted(set(before) | set(after)):
        a, b = before.get(name), after.get(name)
        if a is None or b is None:
            out[name] = Verdict(status="different", before=a, after=b, note="present in only one run")
        elif a == b:
            out[name] = Verdict(status="identical", before=a, after=b)
        elif measurements and name in measurements:
            out[name] = _compare_measurement(store, a, b, measurements[name])
        else:
            out[name] = _compare_different(store, a, b)
    return out


def _compare_measurement(store: ObjectReader, a: Digest, b: Digest,
                         reproducible: Callable[[ObjectReader, Digest], Any]) -> Verdict:
    """``reproduced`` if the reproducible parts of two measurement outputs agree."""
    if store.info(a).kind != store.info(b).kind:
        return Verdict(status="different", before=a, after=b,
                       note=f"a {store.info(a).kind or 'blob'} and a {store.info(b).kind or 'blob'}")
    try:
        same = reproducible(store, a) == reproducible(store, b)
    except Exception as exc:  # a recipe's reader refusing an output: that one does not reproduce
        return Verdict(status="different", before=a, after=b,
                       note=f"not a readable measurement ({type(exc).__name__}: {exc})")
    if same:
        return Verdict(status="reproduced", before=a, after=b, note=TIMINGS_DIFFER)
    return Verdict(status="different", before=a, after=b,
                   note="the part a rerun must reproduce differs")


def _compare_different(store: ObjectReader, a: Digest, b: Digest) -> Verdict:
    ka, kb = store.info(a).kind, store.info(b).kind
    if ka == kb == "checkpoint/1":
        ra, rb = store.get_record(a), store.get_record(b)
        if ra["params"] == rb["params"]:
            return Verdict(status="identical", before=a, after=b, note="same parameters; other members differ")
        return _compare_params(store, a, b, Digest.parse(ra["params"]), Digest.parse(rb["params"]))
    if ka == kb == "params/1":
        return _compare_params(store, a, b, a, b)
    return Verdict(status="different", before=a, after=b)


def _compare_params(store: ObjectReader, a: Digest, b: Digest, pa: Digest, pb: Digest) -> Verdict:
    """The rerun's parameters against the first run's (the reference), by ``nscas.models.distance``."""
    # Imported here: it loads numpy, which every run's planning would load for a rerun's sake.
    from nscas.models.distance import Incomparable, compare_params

    try:
        total = compare_params(store, pa, pb).total
    except Incomparable as exc:
        return Verdict(status="different", before=a, after=b, note=exc.why)
    rel = total.relative_l2
    if rel is None:
        return Verdict(status="different", before=a, after=b,
                       note="the relative L2 distance is undefined (all-zero or non-finite "
                            "parameters)")
    status: Status = "within-tolerance" if rel <= CHECKPOINT_TOLERANCE else "different"
    return Verdict(status=status, before=a, after=b, relative_l2=rel,
                   max_abs_diff=total.max_abs_diff)
