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

from .core.compare import Exact, Tolerance, compare
from .core.errors import InvalidArgument, LogFormatError, RecordParseError, VerifierError
from .core.results import Check, Needs
from .core.runs import Run
from .evaluation.ordering import ordering_checks, test_evaluations_behind
from .evaluation.probes import check_probes
from .evaluation.scoring import (
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
from .records.actionparams import params_checks
from .records.closure import Objects, Unusable, weights_omitted
from .records.environment import environment_check
from .records.reading import parse_json
from .report.checks import REPORT_VERIFIERS, check_report
from .serving.throughput import ServeRun, check_serving
from .tasks.selection import CORPUS_CLAIMS, OUTPUT_CLAIMS, check_selection
from .tasks.tasksets import prepare_claims
from .training.checkpoints import parameter_findings, parameter_values
from .training.diloco import diloco_checks, effective_outer_steps
from .training.entries import effective_steps, is_diloco
from .training.gguf import checkpoint_end_of_turn, convert_checks
from .training.journals import (
    LOSS_CLAIMS,
    agreement_check,
    bytes_check,
    journal_checks,
    loss_values,
    lr_check,
    run_values,
    schedule_check,
    weighted_targets_check,
)
from .training.state import parameter_digest_checks, published_state_check, run_checkpoints


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
    """Claims that could not be recomputed, with the reason: each is a failed check."""
    not_rechecked: dict[str, tuple[Needs, str]] = field(default_factory=dict)
    """Claims that need omitted weights or a model run to recompute, with what they need and
    why: the only claims that are skipped rather than failed."""

    def section(self, name: str, claims: tuple[str, ...], work: Callable[[], None]) -> None:
        """Run one part of a checker; an unusable object fails that part (or skips it, when
        what is missing is an omitted weight), not the rest."""
        try:
            work()
        except Unusable as exc:
            reason = f"{exc.object_id} is unusable: {exc.why}"
            if exc.needs is None:
                self._fail(name, reason, claims)
                return
            self.checks.append(Check.skipped(name, reason, needs=exc.needs))
            for claim in claims:
                self.not_rechecked.setdefault(claim, (exc.needs, reason))
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
    if skipped and weights_omitted(objects, run.outputs["checkpoint"]):
        found.not_rechecked.update({claim: ("weights", why) for claim, why in skipped.items()})
    else:
        found.skipped.update(skipped)


def _environment(objects: Objects, run: Run, found: Findings,
                 journals: list[dict[str, Any]] | None = None) -> None:
    """``<run>.environment``: the environment/1 record agrees with the params and journals."""
    def work() -> None:
        env = objects.record_of(run.receipt["environment"], "environment/1")
        found.checks.append(environment_check(env, run.params, run.name, journals or ()))
    found.section(f"{run.name}.environment", (), work)


COMMIT_PURPOSE = "candidates fixed before final-test scoring"
COMMIT_PARAMS = frozenset({"experiment"})


def _commit(objects: Objects, run: Run, found: Findings) -> None:
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
    _environment(objects, run, found)


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
    _environment(objects, run, found)


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


def _checkpoints(objects: Objects, run: Run, found: Findings) -> None:
    """The ``checkpoints`` output holds one checkpoint per step of ``checkpoint_steps`` and
    the last step, each saying its step, chained by ``parent``, the last being ``checkpoint``."""
    def work() -> None:
        steps, wanted = run.params.get("steps"), run.params.get("checkpoint_steps")
        entries = objects.record_of(run.outputs["checkpoints"], "tree/1")["entries"]
        problems = []
        if not (isinstance(steps, int) and isinstance(wanted, list)
                and all(isinstance(x, int) and not isinstance(x, bool) for x in wanted)):
            problems.append("params steps and checkpoint_steps are not integers")
            expected: list[str] = []
        else:
            expected = [f"step-{x:06d}" for x in sorted({*wanted, steps})]
        if sorted(entries) != expected:
            problems.append(f"holds {sorted(entries)}, the params give {expected}")
        parent = None
        for rel in sorted(entries):
            record = objects.record_of(entries[rel]["id"], "checkpoint/1")
            if f"step-{record['step']:06d}" != rel:
                problems.append(f"{rel} is a checkpoint of step {record['step']}")
            if parent is not None and record["parent"] != parent:
                problems.append(f"{rel}'s parent is not the checkpoint before it")
            parent = entries[rel]["id"]
        if parent != run.outputs["checkpoint"]:
            problems.append("the last checkpoint is not the run's checkpoint output")
        found.checks.append(Check.verdict(f"{run.name}.checkpoints", not problems,
                                          claimed=sorted(entries), recomputed=expected,
                                          message="; ".join(problems)))
    found.section(f"{run.name}.checkpoints", (), work)


def _tokenizer_of(objects: Objects) -> Callable[[str], Any]:
    return lambda checkpoint: load_tokenizer(objects, checkpoint)[0]


def _end_of_turn(objects: Objects, run: Run, found: Findings) -> None:
    """The ``end_of_turn`` claim of a train run: the token the base checkpoint's own chat
    template closes an assistant turn with (docs/format.md §6.9), which labels end at."""
    def work() -> None:
        turn = checkpoint_end_of_turn(objects, run.inputs["base"], _tokenizer_of(objects))
        if isinstance(turn, str):
            found.skipped["end_of_turn"] = f"not recomputed: {turn}"
        else:
            found.values["end_of_turn"] = turn
    found.section(f"{run.name}.template", ("end_of_turn",), work)


def _convert_gguf(objects: Objects, run: Run, found: Findings) -> None:
    _parameters(objects, run, found)

    def work() -> None:
        found.checks.extend(convert_checks(objects, run, found.values, _tokenizer_of(objects)))
    found.section(f"{run.name}.gguf", ("gguf_sha256", "gguf_tensors", "gguf_parameters",
                                       "end_of_turn"), work)
    _environment(objects, run, found)


def _train(objects: Objects, run: Run, found: Findings) -> None:
    name = run.name
    _parameters(objects, run, found)
    _checkpoints(objects, run, found)
    if "end_of_turn" in run.receipt["claims"]:
        _end_of_turn(objects, run, found)
    journals = run.receipt["journals"]
    journal_ids = list(journals.values()) if isinstance(journals, dict) else list(journals)
    checks, ranks = journal_checks(objects, journal_ids, name)
    found.checks.extend(checks)
    found.checks.append(agreement_check(ranks, name, run.params))
    # Wall time and memory are measurements no retained data can recompute; the journal/1
    # records carry what each rank measured, so the claim must be exactly what they say.
    records = []
    for oid in journal_ids:
        try:
            records.append(objects.record_of(oid, "journal/1"))
        except Unusable:
            continue  # reported by journal_checks
    records.sort(key=lambda r: r["rank"])
    _environment(objects, run, found, records)
    if records and all("loop_seconds" in r for r in records):
        found.values["loop_seconds"] = Exact(records[0]["loop_seconds"])
    else:
        found.skipped["loop_seconds"] = "no journal record carries the loop seconds measured"
    if records and all("peak_memory_bytes" in r for r in records):
        found.values["peak_memory_bytes"] = [r["peak_memory_bytes"] for r in records]
    else:
        found.skipped["peak_memory_bytes"] = "no journal record carries the peak memory measured"
    if 0 not in ranks:
        for claim in ("updates", "update_seconds", "median_update_seconds", "bytes_communicated",
                      "targets", "weighted_targets", "tokens_per_second", *LOSS_CLAIMS):
            found.skipped[claim] = "rank 0's journal is not readable"
        return
    steps = effective_steps(ranks[0])
    sets: dict[str, dict[str, Any]] = {}

    def schedule() -> None:
        count, ids = 0, set()
        for key in ("documents", "replay"):
            if key in run.inputs:
                record = objects.record_of(run.inputs[key], "tasks/1")
                sets[key] = record
                count += record["count"]
                ids |= set(record["ids"])
        found.checks.append(schedule_check(
            steps, seed=run.params.get("schedule_seed"), documents=count,
            n_steps=run.params.get("steps"), batch=run.params.get("batch"), ids=ids, name=name))
    found.section(f"{name}.schedule", (), schedule)
    every_step = [e for rank in sorted(ranks) for e in effective_steps(ranks[rank])]
    found.checks.append(lr_check(every_step, run.params, name))
    found.section(f"{name}.journals.parameters", (),
                  lambda: found.checks.extend(parameter_digest_checks(objects, run, ranks)))
    found.section(f"{name}.state", (),
                  lambda: found.checks.append(published_state_check(objects, run)))
    found.checks.append(weighted_targets_check(
        every_step, run.params, set(sets.get("replay", {}).get("ids", [])),
        set(sets.get("documents", {}).get("ids", [])), name))
    pvalues, failed, needs = (parameter_findings(objects, run.outputs["checkpoint"])
                              if "checkpoint" in run.outputs else ({}, {}, {}))
    diloco = is_diloco(run.params)
    found.checks.append(bytes_check(
        every_step, world=run.params.get("world"), parameters=pvalues.get("parameters"),
        not_rechecked=needs.get("parameters"),
        why_not=failed.get("parameters", "the run output no checkpoint"), name=name,
        diloco=diloco))
    if diloco:
        found.section(f"{name}.journals.outer", (), lambda: found.checks.extend(
            diloco_checks(ranks, run.params, name=name, parameters=pvalues.get("parameters"),
                          parameter_bytes=pvalues.get("parameter_bytes"),
                          rebuilt=_rebuilt_digests(objects, run),
                          not_rechecked=needs.get("parameter_bytes"),
                          why_not=failed.get("parameter_bytes",
                                             "the run output no checkpoint"))))
    values, problems = run_values(steps, effective_outer_steps(ranks[0]) if diloco else ())
    if problems:
        found.checks.append(Check.failed(f"{name}.journals.steps", "; ".join(problems)))
    found.values.update(values)
    losses, why = loss_values(steps)
    found.values.update(losses)
    for claim in LOSS_CLAIMS if why else ():
        found.skipped[claim] = f"not recomputed from rank 0's journal: {why}"
    for rank in sorted(ranks):
        rank_values, _ = run_values(effective_steps(ranks[rank]),
                                    effective_outer_steps(ranks[rank]) if diloco else ())
        for key, value in rank_values.items():
            found.per_rank.setdefault(key, []).append(value)
    agreed = [e.get("parameters") for e in ranks[0] if e.get("event") == "agreed"]
    if "agreed_parameters" in found.values and agreed:
        found.checks.append(Check.verdict(
            f"{name}.journals.final_parameters", agreed[-1] == found.values["agreed_parameters"],
            claimed=agreed[-1], recomputed=found.values["agreed_parameters"],
            message="the ranks' last agreed digest is not that of the output checkpoint"))


def _rebuilt_digests(objects: Objects, run: Run) -> dict[int, str]:
    """Step -> the ranks' digest rebuilt from the weights of that step's checkpoint."""
    rebuilt = {}
    for step, checkpoint in run_checkpoints(objects, run).items():
        values, _failed, _needs = parameter_findings(objects, checkpoint)
        if "agreed_parameters" in values:
            rebuilt[step] = values["agreed_parameters"]
    return rebuilt


def _serve(objects: Objects, run: Run, found: Findings) -> None:
    def work() -> None:
        log = objects.bytes(run.outputs["requests"])
        claims = {k: c["value"] for k, c in run.receipt["claims"].items()
                  if c["verifier"] == "throughput"}
        prefix = f"{run.name}.claims"
        facts = serve_run(objects, run, found)
        try:
            checks = check_serving(log, claims, prefix=prefix, run=facts)
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
    _environment(objects, run, found)


def serve_run(objects: Objects, run: Run, found: Findings) -> ServeRun:
    """The serve action's facts about its log, and ``<run>.committed``: the served model and
    task set are those its commitment fixed (the model a subject, the tasks the dev set of
    the committed prepared inputs)."""
    tasks = objects.record_of(run.inputs["tasks"], "tasks/1")
    task_ids = tuple(i for i in tasks["ids"] if isinstance(i, str))
    committed_dev, problems = None, []
    commitment = run.inputs.get("commitment")
    if commitment is None:
        problems.append("the serve cites no commitment")
    else:
        subjects = objects.record_of(commitment, "commitment/1")["subjects"]
        if run.inputs.get("model") not in subjects.values():
            problems.append("the served model is not a subject of its commitment")
        prepared = subjects.get("prepared")
        if prepared is None:
            problems.append("the commitment fixes no prepared inputs")
        else:
            dev = objects.record_of(prepared, "commitment/1")["subjects"].get("dev")
            if dev is None:
                problems.append("the prepared inputs hold no dev set")
            else:
                committed_dev = frozenset(objects.record_of(dev, "tasks/1")["ids"])
                if dev != run.inputs["tasks"]:
                    problems.append("the served task set is not the committed dev set")
    found.checks.append(Check.verdict(f"{run.name}.committed", not problems,
                                      recomputed=len(committed_dev or ()),
                                      message="; ".join(problems)))
    return ServeRun(run_id=run.receipt["action"].removeprefix("blake3:")[:12],
                    task_ids=task_ids, committed_dev=committed_dev,
                    requests=run.params.get("requests"), replicas=run.params.get("replicas"),
                    attempts=run.params.get("attempts"))


def _conversations(objects: Objects, run: Run, found: Findings) -> None:
    """A conversations run: its sets rechecked, and the selection redone from the corpus."""
    def work() -> None:
        found.checks.extend(check_selection(objects, name=run.name, params=run.params,
                                            inputs=run.inputs, outputs=run.outputs,
                                            values=found.values,
                                            not_rechecked=found.not_rechecked))
    found.section(f"{run.name}.selection", (*CORPUS_CLAIMS, *OUTPUT_CLAIMS), work)
    _environment(objects, run, found)


def _probes(objects: Objects, run: Run, found: Findings) -> None:
    """A probes run: the published prompts, the answers' decoding and the retention set."""
    def work() -> None:
        found.checks.extend(check_probes(objects, name=run.name, params=run.params,
                                         inputs=run.inputs, outputs=run.outputs,
                                         values=found.values))
    found.section(f"{run.name}.probes", ("probes", "dropped", "ended_with_eos",
                                         "hit_token_limit"), work)
    _environment(objects, run, found)


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
    "train": RecipeRules(verifiers=frozenset({"parameters", "journals", "template"}),
                         check=_train),
    "convert-gguf": RecipeRules(verifiers=frozenset({"parameters", "gguf", "template"}),
                                check=_convert_gguf),
    "serve": RecipeRules(verifiers=frozenset({"throughput"}), check=_serve),
    "conversations": RecipeRules(verifiers=frozenset({"selection"}), check=_conversations),
    "probes": RecipeRules(verifiers=frozenset({"probes"}), check=_probes),
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
