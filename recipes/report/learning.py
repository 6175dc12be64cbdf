"""Learning: every retained answer rescored with the strict checker, per-arm totals by family
and variant, and paired comparisons (exact McNemar, retention) with the shared statistics.

Nothing here reads an evaluation's claims or trusts its ``checks`` blob: both are compared
with the rescoring through the ``Audit``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nscas.digests import Digest
from nscas.errors import RecipeError
from nscas.recipes.common.checker import CheckResult, check
from nscas.recipes.common.stats import Paired, contract, paired, retention
from nscas.recipes.common.tasks import FAMILIES

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


def load_final_test(store: Any, ev: Evidence) -> FinalTest:
    def records(output: str) -> list[dict[str, Any]]:
        tasks = store.get_record(ev.prepare.output(output))
        return jsonl(store.get_bytes(Digest.parse(tasks["records"])), f"prepared {output} records")

    test = records("test")
    if not test:
        raise RecipeError(f"the prepared test set {ev.prepare.output('test')} is empty")
    trained = {r["task"]["variant"] for r in records("train")}
    held_out = sorted({r["task"]["variant"] for r in test} - trained)
    return FinalTest(records=tuple(test), held_out=tuple(held_out))


def score(store: Any, arm: str, run: Run, tests: FinalTest, audit: Audit) -> Scored:
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


def _tally(tests: FinalTest, results: Sequence[CheckResult], key: str) -> dict[str, dict[str, int]]:
    values = [r["task"][key] for r in tests.records]
    order = ([f for f in FAMILIES if f in values] if key == "family"
             else sorted(set(values)))
    return {str(v): {"correct": sum(1 for x, r in zip(values, results, strict=True)
                                    if x == v and r.correct),
                     "documents": values.count(v)} for v in order}


def arm_summary(store: Any, ev: Evidence, scored: Scored, tests: FinalTest,
                audit: Audit) -> dict[str, Any]:
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
    summary: dict[str, Any] = {
        "evaluation": str(scored.run.receipt),
        "model": str(model),
        "parameter_digest": store.get_record(model)["params"],
        "committed_as": committed_name(store, ev, model),
        "trained_on": (documents_kind(ev.prepare, ev.train[scored.arm])
                       if scored.arm in ev.train else None),
        "world": (int(ev.train[scored.arm].params.get("world", 1))
                  if scored.arm in ev.train else None),
        "documents": n,
        "correct": correct,
        "accuracy": correct / n,
        "valid_json_objects": valid,
        "reasons": dict(sorted(Counter(r.reason for r in results).items())),
        "by_family": by_family,
        "by_variant": by_variant,
        "held_out": {"variants": list(tests.held_out), "correct": sum(held),
                     "documents": len(held)},
        "retention_mean_loss": None,
    }
    run = scored.run
    audit.claim(run, "documents", n)
    audit.claim(run, "correct", correct)
    audit.claim(run, "valid_json_objects", valid)
    audit.claim(run, "correct_by_family", {k: v["correct"] for k, v in by_family.items()})
    audit.claim(run, "correct_by_variant", {k: v["correct"] for k, v in by_variant.items()})
    if scored.retention is not None:
        mean = sum(loss for _, loss in scored.retention) / max(len(scored.retention), 1)
        summary["retention_mean_loss"] = mean
        audit.claim(run, "retention_mean_loss", mean)
    return summary


def compare(kind: str, baseline: Scored, candidate: Scored,
            tests: FinalTest) -> tuple[dict[str, Any], Paired]:
    """A paired comparison of two arms on the same test ids, with retention when both have it."""
    result = paired(baseline.outcomes(tests), candidate.outcomes(tests))
    out: dict[str, Any] = {"kind": kind, "candidate": candidate.arm, "baseline": baseline.arm,
                           **result.to_dict(), "gain_points": result.gain_points}
    out["retention"] = None
    if baseline.retention is not None and candidate.retention is not None:
        out["retention"] = retention(baseline.retention, candidate.retention).to_dict()
    return out, result


def comparisons(ev: Evidence, scored: Mapping[str, Scored], tests: FinalTest,
                audit: Audit) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every arm against the seed (with the contract), clean against damaged at equal world,
    and the clean pair against the clean single; plus the contract verdicts by arm."""
    out: list[dict[str, Any]] = []
    contracts: dict[str, Any] = {}
    seed = scored[BASELINE]
    for arm, s in scored.items():
        if arm == BASELINE:
            continue
        item, result = compare("versus_seed", seed, s, tests)
        upper = item["retention"]["upper"] if item["retention"] else None
        item["contract"] = contracts[arm] = contract(result.gain, result.test.p, upper)
        out.append(item)
        if s.run.input("baseline") == seed.run.receipt:
            _audit_versus_seed(audit, s.run, result, item)
    kinds = {arm: (documents_kind(ev.prepare, ev.train[arm]),
                   int(ev.train[arm].params.get("world", 1)))
             for arm in scored if arm in ev.train}
    for clean, (docs, world) in kinds.items():
        if docs != "clean":
            continue
        for other, (other_docs, other_world) in kinds.items():
            if other_docs == "damaged" and other_world == world:
                out.append(compare("clean_versus_damaged", scored[other], scored[clean], tests)[0])
            if other_docs == "clean" and world > 1 and other_world == 1:
                out.append(compare("pair_versus_single", scored[other], scored[clean], tests)[0])
    return out, contracts


def _audit_versus_seed(audit: Audit, run: Run, result: Paired, item: dict[str, Any]) -> None:
    audit.claim(run, "wins", result.wins)
    audit.claim(run, "losses", result.losses)
    audit.claim(run, "accuracy_gain", float(result.gain))
    audit.claim(run, "exact_one_sided_p", result.test.p_float)
    ret = item["retention"]
    if ret is not None:
        for claim, key in (("mean_change", "mean"), ("standard_error", "se"), ("upper", "upper"),
                           ("improved", "improved"), ("worsened", "worsened")):
            audit.claim(run, f"retention_{claim}", ret[key])
    audit.claim(run, "contract", {k: v["passed"] for k, v in item["contract"].items()
                                  if k != "passed"})

