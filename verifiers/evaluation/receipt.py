"""The ``commit``, ``evaluate`` and ``probes`` receipts rechecked (docs/experiment.md §2.2,
§3.12, §4).
"""

from __future__ import annotations

from typing import Any

from ..core.compare import Tolerance
from ..core.errors import InvalidArgument
from ..core.results import Check
from ..core.runs import Run
from ..records.claims import Findings, environment_section
from ..records.closure import Objects, Unusable
from .ordering import ordering_checks, test_evaluations_behind
from .probes import check_probes
from .scoring import (
    TIMED_GENERATION_KEYS,
    answer_claims,
    check_lines,
    contract_claim,
    generation_checks,
    generation_keys,
    load_tokenizer,
    losses_of,
    paired_claims,
    prompt_encoder,
    rescore,
    retention_claims,
    timing_checks,
)

COMMIT_PURPOSE = "candidates fixed before final-test scoring"


COMMIT_PARAMS = frozenset({"experiment"})


def check_commit(objects: Objects, run: Run, found: Findings) -> None:
    def work() -> None:
        commitment = run.outputs["commitment"]
        record = objects.record_of(commitment, "commitment/1")
        subjects = record["subjects"]
        arms = {k: v for k, v in run.inputs.items() if k != "prepared"}
        expected = {**arms, "prepared": run.inputs.get("prepared")}
        found.checks.append(Check.verdict(
            f"{run.name}.subjects", subjects == expected, claimed=sorted(subjects),
            recomputed=sorted(expected),
            message="the commitment does not name exactly the run's inputs"))
        found.checks.append(_commitment_record_check(objects, run, record))
        found.values["candidates"] = sorted(arms)
        tainted = test_evaluations_behind(objects, commitment)
        found.checks.append(Check.verdict(
            f"{run.name}.ordering.closure", not tainted, recomputed=tainted,
            message="a committed candidate depends on test-set evaluation(s)"))
    found.section(f"{run.name}.commitment", ("candidates",), work)
    environment_section(objects, run, found)


def _commitment_record_check(objects: Objects, run: Run, record: dict[str, Any]) -> Check:
    """The commitment says what the commit recipe writes from the run's params: its purpose,
    the experiment named in the params, and as ``previous`` either nothing or an earlier
    commitment of the same experiment over the same prepared inputs."""
    problems = []
    unknown = sorted(set(run.params) - COMMIT_PARAMS)
    if unknown:
        problems.append(f"params {unknown} are not params of the commit recipe")
    experiment = run.params.get("experiment", "cooperative-learning")
    wanted = {"nscas", "subjects", "purpose", "experiment", "previous"}
    if set(record) != wanted:
        problems.append(f"members {sorted(record)} are not exactly {sorted(wanted)}")
    if record.get("purpose") != COMMIT_PURPOSE:
        problems.append(f"purpose {record.get('purpose')!r} is not {COMMIT_PURPOSE!r}")
    if record.get("experiment") != experiment:
        problems.append(f"experiment {record.get('experiment')!r} is not the params' "
                        f"{experiment!r}")
    previous = record.get("previous")
    if previous is not None:
        try:
            earlier = objects.record_of(previous, "commitment/1")
            if (earlier.get("purpose"), earlier.get("experiment"),
                    earlier.get("subjects", {}).get("prepared")) != (
                    COMMIT_PURPOSE, experiment, record["subjects"].get("prepared")):
                problems.append("previous is not a commitment of the same experiment over the "
                                "same prepared inputs")
        except Unusable as exc:
            problems.append(f"previous is unusable: {exc.why}")
    return Check.verdict(f"{run.name}.commitment.record", not problems,
                         claimed=record.get("experiment"), recomputed=experiment,
                         message="; ".join(problems))


RETENTION_TOLERANCE = "per-probe losses averaged in another order"


def check_evaluate(objects: Objects, run: Run, found: Findings) -> None:
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
        keys = generation_keys(run.action)
        found.checks.extend(generation_checks(
            scored, max_new_tokens=run.params.get("max_new_tokens"), tokenizer=tokenizer,
            eos=eos, name=f"{name}.answers",
            prompt_ids=prompt_encoder(objects, run.inputs["model"], tokenizer), keys=keys))
        if keys == TIMED_GENERATION_KEYS:
            return  # evaluate@1: each generation line carries its timing; no timings output
        if "timings" not in run.outputs:
            found.checks.append(Check.failed(f"{name}.answers.timings",
                                             "the run has no timings output"))
            return
        found.checks.append(timing_checks(objects, run.outputs["timings"], scored,
                                          f"{name}.answers.timings"))

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
        found.values["retention_mean_loss"] = Tolerance(
            sum(losses.values()) / max(len(losses), 1), why=RETENTION_TOLERANCE)
        found.checks.append(Check.skipped(
            f"{name}.retention.losses", "per-probe losses need a model run: not recomputed "
            "here (rerun the evaluation to reproduce them); their statistics are",
            needs="model"))

    retention_names = ("retention_mean_loss", "retention_mean_change",
                       "retention_standard_error", "retention_upper", "retention_improved",
                       "retention_worsened", "contract")
    if "retention" in run.inputs:
        found.section(f"{name}.retention", retention_names, candidate_retention)
    if "baseline" in run.inputs and "scored" in state:
        found.section(f"{name}.statistics", ("wins", "losses", "accuracy_gain",
                                             "exact_one_sided_p", *retention_names),
                      lambda: _paired(objects, run, found, state))
    found.checks.extend(ordering_checks(objects, run.receipt, run.action, name,
                                        receipt_id=run.id))
    environment_section(objects, run, found)


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
    # wins, losses: integers; accuracy_gain and the p-value: exact Fractions, so the claim
    # must be their correctly rounded floats.
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
            found.values.update({k: Tolerance(v, why=RETENTION_TOLERANCE)
                                 if isinstance(v, float) else v for k, v in summary.items()})
            upper = summary["retention_upper"]
    found.values["contract"] = contract_claim(result.gain, result.p, upper)


def check_probes_run(objects: Objects, run: Run, found: Findings) -> None:
    """A probes run: the published prompts, the answers' decoding and the retention set."""
    def work() -> None:
        found.checks.extend(check_probes(objects, name=run.name, params=run.params,
                                         inputs=run.inputs, outputs=run.outputs,
                                         values=found.values))
    found.section(f"{run.name}.probes", ("probes", "dropped", "ended_with_eos",
                                         "hit_token_limit"), work)
    environment_section(objects, run, found)
