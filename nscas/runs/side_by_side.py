"""Comparing runs: one row per receipt, the params and inputs that differ, the headline claims.

What ``nscas compare`` shows (the CLI only prints it). Runs are named by receipt, by an output
(the receipt that produced it, nscas.store.provenance) or by pipeline: the latest succeeded receipt
of each step that recorded that pipeline's name (docs/format.md §3.9, ``pipeline``/``step``).
Headline claims are the claims whose values are numbers (members of an object of numbers
included, as ``contract.gain``); every claim stays in ``claims``, exact.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from nscas.errors import InvalidInput
from nscas.objects.digests import Digest
from nscas.runs.changes import Change, changes_between, flatten
from nscas.store.provenance import producers
from nscas.suggestions import did_you_mean as _did_you_mean

if TYPE_CHECKING:
    from nscas.store.reading import StoreReader

FIXED_COLUMNS = ("receipt", "pipeline", "step", "variant", "recipe", "arm", "status", "started",
                 "finished")
"""Columns every comparison has, beside its params, inputs and claims."""
_MISSING = object()


class Run(NamedTuple):
    """One receipt as a row of a comparison."""

    receipt: Digest
    named: str
    """What the row was asked for by: the text given (an ID, prefix or ref) or the step name."""
    recipe: str
    pipeline: str | None
    step: str | None
    status: str
    started: str
    finished: str
    arm: str | None
    """The name a commitment/1 gives a checkpoint this run read or wrote (``clean-pair``)."""
    inputs: Mapping[str, Digest]
    params: Mapping[str, Any]
    """The action's params, nested objects flattened to dotted names (``counts.test``)."""
    claims: Mapping[str, Any]
    """Every claim's value, exact, by claim name."""
    headline: Mapping[str, int | float]
    """The claims that are numbers (and numeric members of object claims), dotted names."""
    variant: str | None = None
    """The variant the run was (docs/format.md §6.10), where its receipt records one."""

    def value(self, column: str) -> Any:
        """This row's value in ``column`` (None where it has none)."""
        if column in FIXED_COLUMNS:
            value = getattr(self, column)
            return str(value) if isinstance(value, Digest) else value
        if column.startswith("inputs."):
            found = self.inputs.get(column.removeprefix("inputs."))
            return str(found) if found is not None else None
        if column.startswith("claims.") and column.removeprefix("claims.") in self.headline:
            return self.headline[column.removeprefix("claims.")]
        if column.startswith("params.") and column.removeprefix("params.") in self.params:
            return self.params[column.removeprefix("params.")]
        if column in self.headline:
            return self.headline[column]
        return self.params.get(column)

    def to_json(self) -> dict[str, Any]:
        return {"receipt": str(self.receipt), "named": self.named, "recipe": self.recipe,
                "pipeline": self.pipeline, "step": self.step, "variant": self.variant,
                "status": self.status,
                "started": self.started, "finished": self.finished, "arm": self.arm,
                "inputs": {k: str(v) for k, v in self.inputs.items()},
                "params": dict(self.params), "claims": dict(self.claims)}


class RunChanges(NamedTuple):
    """How one run differs from the first run compared of the same step (or, for runs that
    record no step, of the same recipe): every input and param, old -> new."""

    receipt: Digest
    against: Digest
    changes: tuple[Change, ...]

    def to_json(self) -> dict[str, Any]:
        return {"receipt": str(self.receipt), "against": str(self.against),
                "changes": [c.to_json() for c in self.changes]}


class Comparison(NamedTuple):
    """Runs side by side and the columns worth showing."""

    runs: tuple[Run, ...]
    params: tuple[str, ...]
    """Param names (dotted) whose values differ between the runs: for runs of one recipe,
    absent counts as a value; for runs of several, only runs that have the param count."""
    inputs: tuple[str, ...]
    """Input names whose IDs differ between the runs."""
    claims: tuple[str, ...]
    """Headline claims shown as columns: those that differ between runs of one recipe, or
    the ones asked for; empty for runs of several recipes unless asked for."""
    same: Mapping[str, Any]
    """Headline claims with one value in every run (shown once, not as columns)."""
    one_recipe: bool
    changes: tuple[RunChanges, ...] = ()
    """For each run after the first of its step (or recipe), what changed against that first."""

    def columns(self) -> tuple[str, ...]:
        """Every column a comparison can be sorted by, in display order."""
        return (*FIXED_COLUMNS, *(f"inputs.{n}" for n in self.inputs), *self.params,
                *self.claims)

    def to_json(self) -> dict[str, Any]:
        return {"runs": [r.to_json() for r in self.runs],
                "differ": {"params": list(self.params), "inputs": list(self.inputs),
                           "claims": list(self.claims)},
                "same_claims": dict(self.same),
                "changes": [c.to_json() for c in self.changes]}


def receipts_of(store: StoreReader, targets: Sequence[str]) -> list[tuple[str, Digest]]:
    """(the text given, its receipt) for each target: a receipt, or an object a run produced."""
    out: list[tuple[str, Digest]] = []
    for text in targets:
        oid = store.resolve(text)
        kind = store.info(oid).kind
        if kind == "receipt/1":
            out.append((text, oid))
            continue
        receipt = producers(store, oid).first
        if receipt is None:
            raise InvalidInput(f"{text} is a {kind or 'blob'} that no succeeded run produced, "
                               "so there is no run to compare; name a receipt or a run's output")
        out.append((text, receipt))
    return out


def pipeline_receipts(store: StoreReader, pipeline: str) -> list[tuple[str, Digest]]:
    """(step name, receipt): the latest succeeded receipt (by ``finished``, then ID) of each
    step and variant that recorded ``pipeline``, step by step in the order the steps started
    (the run without a variant first, then the variants by name)."""
    latest: dict[tuple[str, str], tuple[str, str, Digest, str]] = {}
    names: set[str] = set()
    for info in store.log(kind="receipt/1", limit=1 << 62):
        rec = store.get_record(info.id)
        name, step = rec.get("pipeline"), rec.get("step")
        if not isinstance(name, str) or not isinstance(step, str):
            continue
        names.add(name)
        if name != pipeline or rec.get("status") != "succeeded":
            continue
        named = rec.get("variant")
        variant = named if isinstance(named, str) else ""
        mark = (str(rec["finished"]), str(info.id), info.id, str(rec["started"]))
        if (step, variant) not in latest or mark > latest[(step, variant)]:
            latest[(step, variant)] = mark
    if not latest:
        hint = _did_you_mean(pipeline, names)
        known = f" (pipelines recorded: {', '.join(sorted(names))})" if names and not hint else ""
        raise InvalidInput(f"no succeeded receipt records pipeline {pipeline!r}{hint}{known}; "
                           "runs of a pipeline file record its name")
    first: dict[str, str] = {}
    for (step, _), mark in latest.items():
        first[step] = min(first.get(step, mark[3]), mark[3])
    order = sorted(latest.items(), key=lambda item: (first[item[0][0]], item[0][0], item[0][1]))
    return [(step, mark[2]) for (step, _), mark in order]


def compare(store: StoreReader, named: Iterable[tuple[str, Digest]], *,
            claims: Sequence[str] | None = None) -> Comparison:
    """The comparison of these receipts (each listed once, in the order given).

    ``claims``: headline claims to show as columns (every one must be a claim of some run)."""
    runs: list[Run] = []
    seen: set[Digest] = set()
    arms = _arms(store)
    for text, receipt in named:
        if receipt not in seen:
            seen.add(receipt)
            runs.append(_run(store, text, receipt, arms))
    one_recipe = len({r.recipe.rpartition("@")[0] for r in runs}) == 1
    headline = sorted({k for r in runs for k in r.headline})
    differ = [k for k in headline if _differs(r.headline.get(k, _MISSING) for r in runs)]
    same = {k: runs[0].headline[k] for k in headline if k not in differ} if len(runs) > 1 else {}
    if claims is not None:
        unknown = [c for c in claims if c not in headline]
        if unknown:
            raise InvalidInput(f"no run compared claims {unknown[0]!r} as a number"
                               + (_did_you_mean(unknown[0], headline)
                                  or f" (headline claims: {', '.join(headline) or 'none'})"))
        shown = tuple(dict.fromkeys(claims))
    elif one_recipe:
        shown = tuple(differ) if len(runs) > 1 else tuple(headline)
    else:
        shown = ()
    params = sorted({k for r in runs for k in r.params})
    inputs = sorted({k for r in runs for k in r.inputs})

    def differs(values: list[Any]) -> bool:
        # Runs of several recipes have different params by nature: there a param counts
        # only where two runs have it and disagree.
        return _differs(values if one_recipe else [v for v in values if v is not _MISSING])

    return Comparison(
        runs=tuple(runs),
        params=tuple(k for k in params if differs([r.params.get(k, _MISSING) for r in runs])),
        inputs=tuple(k for k in inputs if differs([r.inputs.get(k, _MISSING) for r in runs])),
        claims=shown, same=same, one_recipe=one_recipe, changes=_changes(runs))


def _changes(runs: Sequence[Run]) -> tuple[RunChanges, ...]:
    """Each run against the first run of its step (or recipe, where it records no step)."""
    first: dict[tuple[str, str], Run] = {}
    out = []
    for run in runs:
        group = ("step", run.step) if run.step is not None else (
            "recipe", run.recipe.rpartition("@")[0])
        base = first.setdefault(group, run)
        if base is not run:
            out.append(RunChanges(receipt=run.receipt, against=base.receipt,
                                  changes=changes_between(base.inputs, run.inputs,
                                                          base.params, run.params)))
    return tuple(out)


def sort_runs(comparison: Comparison, column: str, *, descending: bool = False) -> Comparison:
    """The comparison with its runs ordered by ``column`` (runs without a value last)."""
    columns = comparison.columns()
    if column not in columns and not any(column in r.headline or column in r.params
                                         for r in comparison.runs):
        raise InvalidInput(f"cannot sort by {column!r}: no such column"
                           + (_did_you_mean(column, columns)
                              or f" (columns: {', '.join(columns)})"))
    present = [r for r in comparison.runs if r.value(column) is not None]
    absent = [r for r in comparison.runs if r.value(column) is None]
    present.sort(key=lambda r: _order(r.value(column)), reverse=descending)
    return comparison._replace(runs=(*present, *absent))


def headline_claims(claims: Mapping[str, Any]) -> dict[str, int | float]:
    """The claims that are numbers, with numeric members of object claims as ``name.member``,
    sorted by name (booleans are not numbers here)."""
    out: dict[str, int | float] = {}
    for key, value in flatten({k: v["value"] if isinstance(v, Mapping) and "value" in v else v
                               for k, v in claims.items()}).items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = value
    return dict(sorted(out.items()))


def _run(store: StoreReader, text: str, receipt: Digest, arms: Mapping[Digest, str]) -> Run:
    rec = store.get_record(receipt)
    action = store.get_record(Digest.parse(rec["action"]))
    inputs = {k: Digest.parse(v) for k, v in sorted(action["inputs"].items())}
    outputs = [Digest.parse(v) for v in rec["outputs"].values()]
    arm = next((arms[d] for d in (*outputs, *inputs.values()) if d in arms), None)
    pipeline, step, variant = rec.get("pipeline"), rec.get("step"), rec.get("variant")
    return Run(receipt=receipt, named=text, recipe=action["recipe"],
               pipeline=pipeline if isinstance(pipeline, str) else None,
               step=step if isinstance(step, str) else None,
               variant=variant if isinstance(variant, str) else None,
               status=rec["status"], started=rec["started"], finished=rec["finished"], arm=arm,
               inputs=inputs, params=flatten(action["params"]),
               claims={k: v["value"] for k, v in sorted(rec["claims"].items())},
               headline=headline_claims(rec["claims"]))


def _arms(store: StoreReader) -> dict[Digest, str]:
    """Checkpoint -> the name the newest commitment/1 gives it among its subjects."""
    out: dict[Digest, str] = {}
    for info in reversed(store.log(kind="commitment/1", limit=1 << 62)):
        subjects = store.get_record(info.id).get("subjects", {})
        ids = {Digest.parse(v): k for k, v in subjects.items() if isinstance(v, str)}
        for oid, kind in store.kinds_of(list(ids)).items():
            if kind == "checkpoint/1":
                out[oid] = ids[oid]
    return out


def _differs(values: Iterable[Any]) -> bool:
    seen: list[Any] = []
    for v in values:
        if not any(_same(v, s) for s in seen):
            seen.append(v)
    return len(seen) > 1


def _same(a: Any, b: Any) -> bool:
    if a is _MISSING or b is _MISSING:
        return a is b
    return type(a) is type(b) and a == b


def _order(value: Any) -> tuple[int, Any]:
    if isinstance(value, bool):
        return (1, int(value))
    if isinstance(value, int | float):
        return (0, value if not (isinstance(value, float) and math.isnan(value)) else math.inf)
    return (2, str(value))
