"""Per-receipt checks: every claim of a receipt recomputed by the verifier it names.

A receipt's action names its recipe (``name@version``). For the recipes known here a checker
recomputes what it can into ``Findings``: recomputed claim values, claims that cannot be
recomputed (with the reason) and rule checks. The driver then turns every claim into one
check named ``<recipe>.<8 hex>.claims.<claim>``: compared when recomputed, skipped (never
passed) otherwise, with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from .closure import Objects, Unusable
from .compare import compare
from .errors import InvalidArgument, LogFormatError, RecordParseError, VerifierError
from .evaluation import (
    answer_claims,
    check_lines,
    contract_claim,
    generation_checks,
    load_tokenizer,
    losses_of,
    paired_claims,
    rescore,
    retention_claims,
)
from .ordering import ordering_checks, test_evaluations_behind
from .records import parse_json
from .report import Check
from .reportchecks import REPORT_VERIFIERS, check_report
from .runs import Run
from .taskchecks import prepare_claims
from .throughput import check_serving
from .training import (
    agreement_check,
    effective_steps,
    journal_checks,
    parameter_values,
    run_values,
    schedule_check,
)


@dataclass(slots=True)
class Findings:
    """What a checker recomputed for one receipt."""

    checks: list[Check] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)
    """Recomputed claim values by claim name."""
    per_rank: dict[str, list[Any]] = field(default_factory=dict)
    """Per-rank recomputations, used when a claim states one value per rank."""
    decided: dict[str, Check] = field(default_factory=dict)
    """Claims already checked whole by a checker (serving), by claim name."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Claims that cannot be recomputed, with the reason."""

    def section(self, name: str, claims: tuple[str, ...], work: Callable[[], None]) -> None:
        """Run one part of a checker; an unusable object skips that part, not the rest."""
        try:
            work()
        except Unusable as exc:
            reason = f"{exc.object_id} is unusable: {exc.why}"
            self.checks.append(Check.skipped(name, reason))
            for claim in claims:
                self.skipped.setdefault(claim, reason)
        except VerifierError as exc:  # malformed content: a finding about this receipt
            self._fail(name, exc.message, claims)
        except KeyError as exc:  # an input, output or member the recipe always has is absent
            self._fail(name, f"the run lacks {exc.args[0]!r}, which its recipe always has",
                       claims)

    def _fail(self, name: str, why: str, claims: tuple[str, ...]) -> None:
        self.checks.append(Check.failed(name, why))
        for claim in claims:
            self.skipped.setdefault(claim, f"not recomputed: {why}")


Checker = Callable[[Objects, Run, Findings], None]


def _prepare(objects: Objects, run: Run, found: Findings) -> None:
    def work() -> None:
        checks, values, skipped = prepare_claims(objects, params=run.params, inputs=run.inputs,
                                                 outputs=run.outputs, name=run.name)
        found.checks.extend(checks)
        found.values.update(values)
        found.skipped.update(skipped)
    found.section(f"{run.name}.tasks", ("counts", "counts_by_family", "counts_by_variant",
                                        "damaged_count", "damaged_fail_checker"), work)


def _tokenizer(objects: Objects, run: Run, found: Findings) -> None:
    def work() -> None:
        entries = objects.record_of(run.outputs["tokenizer"], "tree/1")["entries"]
        if "tokenizer.json" not in entries:
            found.skipped["vocab_size"] = "the tokenizer tree holds no tokenizer.json"
            return
        try:
            value = parse_json(objects.bytes(entries["tokenizer.json"]["id"]), what="tokenizer")
            found.values["vocab_size"] = len(value["model"]["vocab"])
        except (RecordParseError, KeyError, TypeError) as exc:
            found.skipped["vocab_size"] = f"tokenizer.json has no readable vocabulary ({exc})"
    found.section(f"{run.name}.tokenizer", ("vocab_size",), work)


def _parameters(objects: Objects, run: Run, found: Findings) -> None:
    if "checkpoint" not in run.outputs:
        return
    values, skipped = parameter_values(objects, run.outputs["checkpoint"])
    found.values.update(values)
    found.skipped.update(skipped)


def _commit(objects: Objects, run: Run, found: Findings) -> None:
    def work() -> None:
        commitment = run.outputs["commitment"]
        subjects = objects.record_of(commitment, "commitment/1")["subjects"]
        arms = {k: v for k, v in run.inputs.items() if k != "prepared"}
        expected = {**arms, "prepared": run.inputs.get("prepared")}
        found.checks.append(Check.verdict(
            f"{run.name}.subjects", subjects == expected, claimed=sorted(subjects),
            recomputed=sorted(expected),
            message="the commitment does not name exactly the run's inputs"))
        found.values["candidates"] = sorted(arms)
        tainted = test_evaluations_behind(objects, commitment)
        found.checks.append(Check.verdict(
            f"{run.name}.ordering.closure", not tainted, recomputed=tainted,
            message="a committed candidate depends on test-set evaluation(s)"))
    found.section(f"{run.name}.commitment", ("candidates",), work)


def _evaluate(objects: Objects, run: Run, found: Findings) -> None:
    name = run.name
    state: dict[str, Any] = {}

    def answers() -> None:
        scored, problems = rescore(objects, run.receipt, run.action)
        state["scored"] = scored
        found.values.update(answer_claims(scored))
        found.checks.append(Check.verdict(f"{name}.answers.coverage", not problems,
                                          recomputed=len(scored.ids),
                                          message="; ".join(problems[:5])))
        found.checks.append(check_lines(objects, run.outputs["checks"], scored,
                                        f"{name}.answers.checks"))
        tokenizer, eos = load_tokenizer(objects, run.inputs["model"])
        found.checks.extend(generation_checks(
            scored, max_new_tokens=run.params.get("max_new_tokens"), tokenizer=tokenizer,
            eos=eos, name=f"{name}.answers"))

    found.section(f"{name}.answers", ("documents", "correct", "valid_json_objects",
                                      "correct_by_family", "correct_by_variant", "wins",
                                      "losses", "accuracy_gain", "exact_one_sided_p",
                                      "contract"), answers)

    def candidate_retention() -> None:
        probes = objects.record_of(run.inputs["retention"], "tasks/1")["ids"]
        if "retention" not in run.outputs:
            found.checks.append(Check.failed(f"{name}.retention.output", "a retention set was "
                                             "given but the run output no losses"))
            return
        losses = losses_of(objects, run.outputs["retention"], probes)
        state["retention"] = losses
        found.values["retention_mean_loss"] = sum(losses.values()) / max(len(losses), 1)
        found.checks.append(Check.skipped(
            f"{name}.retention.losses", "per-probe losses need the model: not recomputed here "
            "(rerun the evaluation to reproduce them); their statistics are"))

    retention_names = ("retention_mean_loss", "retention_mean_change",
                       "retention_standard_error", "retention_upper", "retention_improved",
                       "retention_worsened", "contract")
    if "retention" in run.inputs:
        found.section(f"{name}.retention", retention_names, candidate_retention)
    if "baseline" in run.inputs and "scored" in state:
        found.section(f"{name}.statistics", ("wins", "losses", "accuracy_gain",
                                             "exact_one_sided_p", *retention_names),
                      lambda: _paired(objects, run, found, state))
    found.checks.extend(ordering_checks(objects, run.receipt, run.action, name))


def _paired(objects: Objects, run: Run, found: Findings, state: dict[str, Any]) -> None:
    name = run.name
    base_receipt = objects.record_of(run.inputs["baseline"], "receipt/1")
    base_action = objects.record_of(base_receipt["action"], "action/1")
    is_eval = (base_action["recipe"].startswith("evaluate@")
               and base_receipt.get("status") == "succeeded")
    found.checks.append(Check.verdict(f"{name}.statistics.baseline", is_eval,
                                      claimed=base_action["recipe"],
                                      message="the baseline is not a succeeded evaluation"))
    if not is_eval:
        return
    base_scored, _ = rescore(objects, base_receipt, base_action)
    try:
        values, result = paired_claims(state["scored"], base_scored)
    except InvalidArgument as exc:
        found.checks.append(Check.failed(f"{name}.statistics.pairing", exc.message))
        return
    found.values.update(values)
    upper = None
    if "retention" in state:
        probes = list(state["retention"])
        if "retention" not in base_receipt["outputs"]:
            found.checks.append(Check.failed(f"{name}.statistics.retention", "the baseline has "
                                             "no retention losses to compare with"))
        else:
            base = losses_of(objects, base_receipt["outputs"]["retention"], probes)
            summary = retention_claims(base, state["retention"])
            found.values.update(summary)
            upper = summary["retention_upper"]
    found.values["contract"] = contract_claim(result.gain, result.p, upper)


def _train(objects: Objects, run: Run, found: Findings) -> None:
    name = run.name
    _parameters(objects, run, found)
    journals = run.receipt["journals"]
    journal_ids = list(journals.values()) if isinstance(journals, dict) else list(journals)
    checks, ranks = journal_checks(objects, journal_ids, name)
    found.checks.extend(checks)
    found.checks.append(agreement_check(ranks, name))
    # Wall time and memory are measurements no retained data can recompute; the journal/1
    # records carry what each rank measured, so the claim must at least agree with them.
    records = sorted((objects.record_of(j, "journal/1") for j in journal_ids), key=lambda r: r["rank"])
    if records and all("loop_seconds" in r for r in records):
        found.values["loop_seconds"] = records[0]["loop_seconds"]
    else:
        found.skipped["loop_seconds"] = "measured by the run; no journal record carries it"
    if records and all("peak_memory_bytes" in r for r in records):
        found.values["peak_memory_bytes"] = [r["peak_memory_bytes"] for r in records]
    else:
        found.skipped["peak_memory_bytes"] = "measured by the run; no journal record carries it"
    if 0 not in ranks:
        for claim in ("updates", "update_seconds", "median_update_seconds", "bytes_communicated",
                      "targets", "weighted_targets", "tokens_per_second"):
            found.skipped[claim] = "rank 0's journal is not readable"
        return
    steps = effective_steps(ranks[0])

    def schedule() -> None:
        count, ids = 0, set()
        for oid in run.inputs.values():
            if objects.kind(oid) != "tasks/1":
                continue
            record = objects.record(oid)
            if record.get("role") in ("train", "replay"):
                count += record["count"]
                ids |= set(record["ids"])
        found.checks.append(schedule_check(
            steps, seed=run.params.get("schedule_seed"), documents=count,
            n_steps=run.params.get("steps"), batch=run.params.get("batch"), ids=ids, name=name))
    found.section(f"{name}.schedule", (), schedule)
    values, problems = run_values(steps)
    if problems:
        found.checks.append(Check.failed(f"{name}.journals.steps", "; ".join(problems)))
    found.values.update(values)
    for rank in sorted(ranks):
        rank_values, _ = run_values(effective_steps(ranks[rank]))
        for key, value in rank_values.items():
            found.per_rank.setdefault(key, []).append(value)
    agreed = [e.get("parameters") for e in ranks[0] if e.get("event") == "agreed"]
    if "agreed_parameters" in found.values and agreed:
        found.checks.append(Check.verdict(
            f"{name}.journals.final_parameters", agreed[-1] == found.values["agreed_parameters"],
            claimed=agreed[-1], recomputed=found.values["agreed_parameters"],
            message="the ranks' last agreed digest is not that of the output checkpoint"))


def _serve(objects: Objects, run: Run, found: Findings) -> None:
    def work() -> None:
        log = objects.bytes(run.outputs["requests"])
        claims = {k: c["value"] for k, c in run.receipt["claims"].items()
                  if c["verifier"] == "throughput"}
        prefix = f"{run.name}.claims"
        try:
            checks = check_serving(log, claims, prefix=prefix)
        except LogFormatError as exc:
            found.checks.append(Check.failed(f"{run.name}.requests", exc.message))
            for claim in claims:
                found.skipped[claim] = "the request log is unusable"
            return
        for check in checks:
            claim = check.name.removeprefix(prefix + ".")
            if check.name.startswith(prefix + ".") and claim in claims:
                found.decided[claim] = check
            else:  # a serving rule, not a claim: named beside the receipt's other rules
                found.checks.append(replace(check, name=f"{run.name}.{claim}"))
    found.section(f"{run.name}.requests", (), work)


@dataclass(frozen=True, slots=True, kw_only=True)
class RecipeRules:
    verifiers: frozenset[str]
    """Verifier names this module implements for the recipe's claims."""
    check: Checker


RECIPES: dict[str, RecipeRules] = {
    "prepare": RecipeRules(verifiers=frozenset({"tasks"}), check=_prepare),
    "tokenizer": RecipeRules(verifiers=frozenset({"integrity"}), check=_tokenizer),
    "init": RecipeRules(verifiers=frozenset({"parameters"}), check=_parameters),
    "commit": RecipeRules(verifiers=frozenset({"ordering"}), check=_commit),
    "evaluate": RecipeRules(verifiers=frozenset({"answers", "statistics"}), check=_evaluate),
    "train": RecipeRules(verifiers=frozenset({"parameters", "journals"}), check=_train),
    "serve": RecipeRules(verifiers=frozenset({"throughput"}), check=_serve),
    "report": RecipeRules(verifiers=REPORT_VERIFIERS, check=check_report),
}


def check_receipt(objects: Objects, oid: str) -> list[Check]:
    """Every finding about one receipt: its status, each claim, and its recipe's rules."""
    try:
        receipt = objects.record_of(oid, "receipt/1")
        action = objects.record_of(receipt["action"], "action/1")
    except Unusable as exc:
        return [Check.skipped(f"receipt.{oid[7:15]}", f"unusable: {exc.why}")]
    recipe = action["recipe"].partition("@")[0]
    run = Run(id=oid, name=f"{recipe}.{oid[7:15]}", receipt=receipt, action=action,
              recipe=recipe)
    if receipt.get("status") == "failed":
        return [Check.failed(f"{run.name}.status", "the run failed: "
                             + str(receipt.get("error", "no error message")))]
    rules = RECIPES.get(recipe)
    found = Findings()
    if rules is not None:
        found.section(f"{run.name}.recompute", (), lambda: rules.check(objects, run, found))
    checks = list(found.checks)
    for claim, body in sorted(receipt["claims"].items()):
        name = f"{run.name}.claims.{claim}"
        claimed, verifier = body["value"], body["verifier"]
        if rules is None:
            checks.append(Check.skipped(name, f"no verifier for recipe {recipe!r} exists here",
                                        claimed=claimed))
        elif verifier not in rules.verifiers:
            checks.append(Check.skipped(name, f"verifier {verifier!r} is not implemented for "
                                              f"recipe {recipe!r}", claimed=claimed))
        elif claim in found.decided:
            checks.append(found.decided[claim])
        elif claim in found.values:
            recomputed = found.values[claim]
            if isinstance(claimed, list) and claim in found.per_rank:
                recomputed = found.per_rank[claim]
            checks.append(compare(name, claimed, recomputed))
        else:
            checks.append(Check.skipped(name, found.skipped.get(
                claim, f"no recomputation exists for claim {claim!r} (verifier {verifier!r})"),
                claimed=claimed))
    return checks
