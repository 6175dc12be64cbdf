"""The ``tokenizer``, ``init``, ``train`` and ``convert-gguf`` receipts rechecked
(docs/experiment.md §3, docs/format.md §3.3, §6.9).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.compare import Exact
from ..core.errors import RecordParseError
from ..core.results import Check
from ..core.runs import Run
from ..evaluation.scoring import load_tokenizer
from ..records.claims import Findings, environment_section
from ..records.closure import Objects, Unusable, weights_omitted
from ..records.reading import parse_json
from .checkpoints import parameter_findings, parameter_values
from .diloco import diloco_checks, effective_outer_steps
from .entries import effective_steps, is_diloco
from .gguf import checkpoint_end_of_turn, convert_checks
from .journals import (
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
from .state import parameter_digest_checks, published_state_check, run_checkpoints


def check_tokenizer(objects: Objects, run: Run, found: Findings) -> None:
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


def check_parameters(objects: Objects, run: Run, found: Findings) -> None:
    if "checkpoint" not in run.outputs:
        return
    values, skipped = parameter_values(objects, run.outputs["checkpoint"])
    found.values.update(values)
    if skipped and weights_omitted(objects, run.outputs["checkpoint"]):
        found.not_rechecked.update({claim: ("weights", why) for claim, why in skipped.items()})
    else:
        found.skipped.update(skipped)


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


def check_convert_gguf(objects: Objects, run: Run, found: Findings) -> None:
    check_parameters(objects, run, found)

    def work() -> None:
        found.checks.extend(convert_checks(objects, run, found.values, _tokenizer_of(objects)))
    found.section(f"{run.name}.gguf", ("gguf_sha256", "gguf_tensors", "gguf_parameters",
                                       "end_of_turn"), work)
    environment_section(objects, run, found)


def check_train(objects: Objects, run: Run, found: Findings) -> None:
    name = run.name
    check_parameters(objects, run, found)
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
    environment_section(objects, run, found, records)
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
