"""Learning: every retained answer rescored with the strict checker, per-arm totals by family
and variant, and paired comparisons (exact McNemar, retention) with the shared statistics.

Nothing here reads an evaluation's claims or trusts its ``checks`` blob: both are compared
with the rescoring through the ``Audit``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from nscas.errors import RecipeError
from nscas.models.paired import Paired, Retention, contract, paired, retention
from nscas.objects.digests import Digest
from nscas.recipes.common.checker import CheckResult, check
from nscas.recipes.common.tasks import FAMILIES
from nscas.store.protocol import ObjectReader

from .audit import Audit
from .evidence import BASELINE, Evidence, Run, committed_name, documents_kind, jsonl

CHECK_FIELDS = ("id", "family", "variant", "correct", "valid_json_object", "reason")


@dataclass(frozen=True, slots=True, kw_only=True)
class FinalTest:
    """The prepared test tasks, in their committed order."""

    records: tuple[dict[str, Any], ...]
    """Task records: ``id``, ``task`` (``family``, ``variant``, ...), ``prompt``, ``target``."""
    held_out: tuple[int, ...]
    """Wording variants that appear in the test set but in no training task."""

    @property
    def ids(self) -> list[str]:
        return [r["id"] for r in self.records]


@dataclass(frozen=True, slots=True, kw_only=True)
class Scored:
    """One evaluation's retained answers with this report's verdicts on them."""

    arm: str
    run: Run
    texts: tuple[str, ...]
    results: tuple[CheckResult, ...]
    retention: tuple[tuple[str, float], ...] | None
    """``(probe id, mean loss per labelled token)`` from the ``retention`` blob, if any."""

    def outcomes(self, tests: FinalTest) -> list[tuple[str, bool]]:
        return [(i, r.correct) for i, r in zip(tests.ids, self.results, strict=True)]


def load_final_test(store: ObjectReader, ev: Evidence) -> FinalTest:
    def records(output: str) -> list[dict[str, Any]]:
        tasks = store.get_record(ev.prepare.output(output))
        return jsonl(store.get_bytes(Digest.parse(tasks["records"])), f"prepared {output} records")

    test = records("test")
    if not test:
        raise RecipeError(f"the prepared test set {ev.prepare.output('test')} is empty")
    trained = {r["task"]["variant"] for r in records("train")}
    held_out = sorted({r["task"]["variant"] for r in test} - trained)
    return FinalTest(records=tuple(test), held_out=tuple(held_out))


def score(store: ObjectReader, arm: str, run: Run, tests: FinalTest, audit: Audit) -> Scored:
    """Rescore ``run``'s retained generations; its ``checks`` blob is audited line by line."""
    generations = jsonl(store.get_bytes(run.output("generations")), f"{run.name} generations")
    ids = [g["id"] for g in generations]
    if ids != tests.ids:
        raise RecipeError(f"input {run.name!r} retained generations for {len(ids)} task ids that "
                          f"are not the {len(tests.ids)} prepared test ids in order")
    texts = tuple(g["text"] for g in generations)
    results = tuple(check(text, r["target"]) for text, r in zip(texts, tests.records, strict=True))
    checks = jsonl(store.get_bytes(run.output("checks")), f"{run.name} checks")
    if len(checks) != len(results):
        audit.value(f"{run.name} ({run.receipt})", "checks lines", len(checks), len(results))
    for line, record, result in zip(checks, tests.records, results, strict=False):
        mine = {"id": record["id"], "family": record["task"]["family"],
                "variant": record["task"]["variant"], **result.to_dict()}
        audit.value(f"{run.name} ({run.receipt})", f"checks[{record['id']}]",
                    {k: line.get(k) for k in CHECK_FIELDS}, mine)
    losses = None
    if "retention" in run.record["outputs"]:
        lines = jsonl(store.get_bytes(run.output("retention")), f"{run.name} retention")
        losses = tuple((x["id"], x["loss"]) for x in lines)
    return Scored(arm=arm, run=run, texts=texts, results=results, retention=losses)


@dataclass(frozen=True, slots=True, kw_only=True)
class Count:
    """Correct answers among some documents."""

    correct: int
    documents: int

    def to_json(self) -> dict[str, Any]:
        return {"correct": self.correct, "documents": self.documents}


@dataclass(frozen=True, slots=True, kw_only=True)
class ArmSummary:
    """One arm's rescored totals (report.json ``learning.arms.<arm>``)."""

    evaluation: Digest
    model: Digest
    parameter_digest: str
    committed_as: str | None
    trained_on: str | None
    """``clean``, ``damaged`` or ``other`` for a trained arm; None for the others."""
    world: int | None
    documents: int
    correct: int
    accuracy: float
    valid_json_objects: int
    reasons: Mapping[str, int]
    by_family: Mapping[str, Count]
    by_variant: Mapping[str, Count]
    held_out_variants: tuple[int, ...]
    held_out: Count
    retention_mean_loss: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "evaluation": str(self.evaluation),
            "model": str(self.model),
            "parameter_digest": self.parameter_digest,
            "committed_as": self.committed_as,
            "trained_on": self.trained_on,
            "world": self.world,
            "documents": self.documents,
            "correct": self.correct,
            "accuracy": self.accuracy,
            "valid_json_objects": self.valid_json_objects,
            "reasons": dict(self.reasons),
            "by_family": {k: v.to_json() for k, v in self.by_family.items()},
            "by_variant": {k: v.to_json() for k, v in self.by_variant.items()},
            "held_out": {"variants": list(self.held_out_variants), **self.held_out.to_json()},
            "retention_mean_loss": self.retention_mean_loss,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    """A paired comparison of two arms on the same test ids (``learning.comparisons[]``)."""

    kind: str
    """``versus_seed``, ``clean_versus_damaged`` or ``pair_versus_single``."""
    candidate: str
    baseline: str
    paired: Paired
    retention: Retention | None
    """The retention-loss change, when both arms measured it."""
    contract: Mapping[str, Any] | None = None
    """The contract verdict; versus the seed only."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "candidate": self.candidate,
                               "baseline": self.baseline, **self.paired.to_dict(),
                               "gain_points": self.paired.gain_points,
                               "retention": (self.retention.to_dict()
                                             if self.retention is not None else None)}
        if self.contract is not None:
            out["contract"] = dict(self.contract)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Learning:
    """report.json's ``learning`` part."""

    baseline: str
    documents: int
    held_out_variants: tuple[int, ...]
    arms: Mapping[str, ArmSummary]
    """By arm, in report order (the baseline first)."""
    comparisons: tuple[Comparison, ...]

    def to_json(self) -> dict[str, Any]:
        return {"baseline": self.baseline, "documents": self.documents,
                "held_out_variants": list(self.held_out_variants),
                "arms": {k: v.to_json() for k, v in self.arms.items()},
                "comparisons": [c.to_json() for c in self.comparisons]}


def _tally(tests: FinalTest, results: Sequence[CheckResult], key: str) -> dict[str, Count]:
    values = [r["task"][key] for r in tests.records]
    order = ([f for f in FAMILIES if f in values] if key == "family"
             else sorted(set(values)))
    return {str(v): Count(correct=sum(1 for x, r in zip(values, results, strict=True)
                                      if x == v and r.correct),
                          documents=values.count(v)) for v in order}


def arm_summary(store: ObjectReader, ev: Evidence, scored: Scored, tests: FinalTest,
                audit: Audit) -> ArmSummary:
    """Per-arm totals; the evaluation's own score claims are audited against them."""
    results = scored.results
    n = len(results)
    correct = sum(r.correct for r in results)
    valid = sum(r.valid_json_object for r in results)
    by_family = _tally(tests, results, "family")
    by_variant = _tally(tests, results, "variant")
    held = [r.correct for rec, r in zip(tests.records, results, strict=True)
            if rec["task"]["variant"] in tests.held_out]
    model = scored.run.input("model")
    if model is None:
        raise RecipeError(f"input {scored.run.name!r} names no model")
    run = scored.run
    audit.claim(run, "documents", n)
    audit.claim(run, "correct", correct)
    audit.claim(run, "valid_json_objects", valid)
    audit.claim(run, "correct_by_family", {k: v.correct for k, v in by_family.items()})
    audit.claim(run, "correct_by_variant", {k: v.correct for k, v in by_variant.items()})
    mean = None
    if scored.retention is not None:
        mean = sum(loss for _, loss in scored.retention) / max(len(scored.retention), 1)
        audit.claim(run, "retention_mean_loss", mean)
    trained = ev.train.get(scored.arm)
    return ArmSummary(
        evaluation=run.receipt,
        model=model,
        parameter_digest=store.get_record(model)["params"],
        committed_as=committed_name(store, ev, model),
        trained_on=documents_kind(ev.prepare, trained) if trained is not None else None,
        world=int(trained.params.get("world", 1)) if trained is not None else None,
        documents=n,
        correct=correct,
        accuracy=correct / n,
        valid_json_objects=valid,
        reasons=dict(sorted(Counter(r.reason for r in results).items())),
        by_family=by_family,
        by_variant=by_variant,
        held_out_variants=tests.held_out,
        held_out=Count(correct=sum(held), documents=len(held)),
        retention_mean_loss=mean,
    )


def compare(kind: str, baseline: Scored, candidate: Scored, tests: FinalTest) -> Comparison:
    """A paired comparison of two arms on the same test ids, with retention when both have it."""
    change = None
    if baseline.retention is not None and candidate.retention is not None:
        change = retention(baseline.retention, candidate.retention)
    return Comparison(kind=kind, candidate=candidate.arm, baseline=baseline.arm,
                      paired=paired(baseline.outcomes(tests), candidate.outcomes(tests)),
                      retention=change)


def comparisons(ev: Evidence, scored: Mapping[str, Scored], tests: FinalTest,
                audit: Audit) -> tuple[list[Comparison], dict[str, Any]]:
    """Every arm against the seed (with the contract), clean against damaged at equal world,
    and the clean pair against the clean single; plus the contract verdicts by arm."""
    out: list[Comparison] = []
    contracts: dict[str, Any] = {}
    seed = scored[BASELINE]
    for arm, s in scored.items():
        if arm == BASELINE:
            continue
        item = compare("versus_seed", seed, s, tests)
        upper = item.retention.upper if item.retention is not None else None
        contracts[arm] = contract(item.paired.gain, item.paired.test.p, upper)
        item = replace(item, contract=contracts[arm])
        out.append(item)
        if s.run.input("baseline") == seed.run.receipt:
            _audit_versus_seed(audit, s.run, item, contracts[arm])
    kinds = {arm: (documents_kind(ev.prepare, ev.train[arm]),
                   int(ev.train[arm].params.get("world", 1)))
             for arm in scored if arm in ev.train}
    for clean, (docs, world) in kinds.items():
        if docs != "clean":
            continue
        for other, (other_docs, other_world) in kinds.items():
            if other_docs == "damaged" and other_world == world:
                out.append(compare("clean_versus_damaged", scored[other], scored[clean], tests))
            if other_docs == "clean" and world > 1 and other_world == 1:
                out.append(compare("pair_versus_single", scored[other], scored[clean], tests))
    return out, contracts


def _audit_versus_seed(audit: Audit, run: Run, item: Comparison,
                       verdict: Mapping[str, Any]) -> None:
    result = item.paired
    audit.claim(run, "wins", result.wins)
    audit.claim(run, "losses", result.losses)
    audit.claim(run, "accuracy_gain", float(result.gain))
    audit.claim(run, "exact_one_sided_p", result.test.p_float)
    ret = item.retention
    if ret is not None:
        for claim, value in (("mean_change", ret.mean), ("standard_error", ret.se),
                             ("upper", ret.upper), ("improved", ret.improved),
                             ("worsened", ret.worsened)):
            audit.claim(run, f"retention_{claim}", value)
    audit.claim(run, "contract", {k: v["passed"] for k, v in verdict.items() if k != "passed"})
