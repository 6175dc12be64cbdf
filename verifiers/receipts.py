"""Per-receipt checks: every claim of a receipt recomputed by the verifier it names.

A receipt's action names its recipe (``name@version``). For the recipes known here a checker
recomputes what it can into ``Findings``: recomputed claim values, claims that cannot be
recomputed (with the reason) and rule checks. The driver then turns every claim into one
check named ``<recipe>.<8 hex>.claims.<claim>``: compared when recomputed, skipped (never
passed) otherwise, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .core.compare import compare
from .core.results import Check
from .core.runs import Run
from .evaluation.receipt import check_commit, check_evaluate, check_probes_run
from .records.actionparams import params_checks
from .records.claims import Checker, Findings
from .records.closure import Objects, Unusable
from .report.checks import REPORT_VERIFIERS, check_report
from .serving.receipt import check_serve
from .tasks.receipt import check_conversations, check_prepare
from .training.receipt import check_convert_gguf, check_parameters, check_tokenizer, check_train


@dataclass(frozen=True, slots=True, kw_only=True)
class RecipeRules:
    verifiers: frozenset[str]
    """Verifier names this module implements for the recipe's claims."""
    check: Checker


RECIPES: dict[str, RecipeRules] = {
    "prepare": RecipeRules(verifiers=frozenset({"tasks"}), check=check_prepare),
    "tokenizer": RecipeRules(verifiers=frozenset({"integrity"}), check=check_tokenizer),
    "init": RecipeRules(verifiers=frozenset({"parameters"}), check=check_parameters),
    "commit": RecipeRules(verifiers=frozenset({"ordering"}), check=check_commit),
    "evaluate": RecipeRules(verifiers=frozenset({"answers", "statistics"}), check=check_evaluate),
    "train": RecipeRules(verifiers=frozenset({"parameters", "journals", "template"}),
                         check=check_train),
    "convert-gguf": RecipeRules(verifiers=frozenset({"parameters", "gguf", "template"}),
                                check=check_convert_gguf),
    "serve": RecipeRules(verifiers=frozenset({"throughput"}), check=check_serve),
    "conversations": RecipeRules(verifiers=frozenset({"selection"}), check=check_conversations),
    "probes": RecipeRules(verifiers=frozenset({"probes"}), check=check_probes_run),
    "report": RecipeRules(verifiers=REPORT_VERIFIERS, check=check_report),
}


def check_receipt(objects: Objects, oid: str) -> list[Check]:
    """Every finding about one receipt: its status, each claim, and its recipe's rules. A
    claim passes only when recomputed and equal; a claim nobody recomputes, or that names a
    verifier this recipe does not have, fails; only a claim that needs omitted weights or a
    model run is skipped."""
    try:
        receipt = objects.record_of(oid, "receipt/1")
        action = objects.record_of(receipt["action"], "action/1")
    except Unusable as exc:
        return [Check.failed(f"receipt.{oid[7:15]}", f"unusable: {exc.why}")]
    recipe = action["recipe"].partition("@")[0]
    run = Run(id=oid, name=f"{recipe}.{oid[7:15]}", receipt=receipt, action=action,
              recipe=recipe)
    if receipt.get("status") == "failed":
        return [Check.failed(f"{run.name}.status", "the run failed: "
                             + str(receipt.get("error", "no error message")))]
    rules = RECIPES.get(recipe)
    found = Findings()
    if rules is None:
        found.checks.append(Check.failed(f"{run.name}.recipe", f"no verifier exists for "
                                         f"recipe {recipe!r}, so nothing of this run is "
                                         "rechecked"))
    else:
        found.section(f"{run.name}.recompute", (), lambda: rules.check(objects, run, found))
    checks = [*found.checks, *params_checks(run.name, action["recipe"], action["params"])]
    for claim, body in sorted(receipt["claims"].items()):
        checks.append(_claim_check(f"{run.name}.claims.{claim}", claim, body, recipe, rules,
                                   found))
    return checks


def _claim_check(name: str, claim: str, body: dict[str, Any], recipe: str,
                 rules: RecipeRules | None, found: Findings) -> Check:
    claimed, verifier = body["value"], body["verifier"]
    if rules is None:
        return Check.failed(name, f"no verifier for recipe {recipe!r} exists here",
                            claimed=claimed)
    if verifier not in rules.verifiers:
        return Check.failed(name, f"verifier {verifier!r} does not exist for recipe "
                                  f"{recipe!r} (known: {', '.join(sorted(rules.verifiers))})",
                            claimed=claimed)
    if claim in found.decided:
        return found.decided[claim]
    if claim in found.values:
        recomputed = found.values[claim]
        if isinstance(claimed, list) and claim in found.per_rank:
            recomputed = found.per_rank[claim]
        return compare(name, claimed, recomputed)
    if claim in found.not_rechecked:
        needs, why = found.not_rechecked[claim]
        return Check.skipped(name, why, needs=needs, claimed=claimed)
    return Check.failed(name, found.skipped.get(
        claim, f"no check recomputes claim {claim!r} (verifier {verifier!r}), and a claim "
               "nobody rechecks is not evidence"), claimed=claimed)
