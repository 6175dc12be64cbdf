"""report.json's numbers recomputed by the verifiers from retained objects (docs/experiment.md §6).

Each function returns one section shaped as the ``report`` recipe writes it, built only from
the verifiers' own parts: answers re-scored by ``checker`` against targets derived from each
task's case (``evaluation.scoring.rescore``), paired statistics and the contract from ``stats``,
journals read by ``schedule`` and made resume-aware by ``training.entries.effective_steps``, the
request log recomputed by ``throughput``. Exact values stay exact (``Fraction``); the
comparison rules of ``compare`` relate them to the report's floats.

Definitions (as the report publishes them):
- learning: per arm, correct / valid / reasons / by family (in family order) / by variant /
  held-out variants (in the test set, in no training task); ``retention_mean_loss`` the mean
  of the arm's retained per-probe losses. Comparisons: every arm against the seed (with the
  contract), each clean arm against the damaged arm of its world, and each clean multi-rank
  arm against each clean one-rank arm; wins are baseline wrong and candidate right.
- training: rank 0's totals over its effective steps are the arm's headline; every rank's
  are listed; ``parameters_agree`` means every rank's last agreed digest is the same.
  Loop seconds and peak memory (``claimed_only``) are what the ranks' journal/1 records
  carry, which the train receipt claims; no journal entry can recompute them.
- serving: per phase, distinct requests, attempts, failed attempts and the log's metrics.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from ..core.errors import InvalidArgument
from ..core.runs import Run
from ..evaluation.scoring import Scored, contract_claim, losses_of, rescore, retention_claims
from ..evaluation.stats import (
    CONTRACT_MAX_P,
    CONTRACT_MAX_RETENTION_UPPER,
    CONTRACT_MIN_GAIN,
    Paired,
    paired_comparison,
)
from ..records.closure import Objects
from ..serving.throughput import PHASES, read_log, recompute
from ..tasks.checker import FAMILIES
from ..tasks.tasksets import task_lines
from ..training.entries import effective_steps
from ..training.journals import mean_loss
from ..training.schedule import read_journal
from .inputs import BASELINE, Inputs, commitment_subjects, documents_kind, world_of

REPORT_FORMATS = {1: "nscas-report/2", 2: "nscas-report/3"}
"""report.json's format by report recipe version (version 2 adds ``action``)."""
PREPARED_SETS = ("test", "dev", "train", "damaged", "replay", "retention")


CLAIMED_ONLY_NOTE = ("self-reported: loop wall time and peak memory as the train run measured "
                     "them; no journal entry records them, so this report cannot recompute them")
"""Fixed prose of every ``claimed_only`` part, regenerated exactly."""
SERIES = {"loss_by_step": "loss", "lr_by_step": "lr", "grad_norm_by_step": "grad_norm"}
"""Per-rank series by effective step (the training figure's lines), from these members."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Learning:
    """The recomputed ``learning`` and ``contract`` sections and what the claims need."""

    section: dict[str, Any]
    contract: dict[str, Any]
    test_ids: list[str]
    tests: list[dict[str, Any]]
    """The prepared test set's task lines, in order (the page shows their prompts and
    targets)."""
    held_out: list[Any]
    scored: dict[str, Scored]
    """Re-scored answers by arm, in report order."""
    versus_seed: dict[str, Paired]


def _exact(value: Fraction) -> str:
    return f"{value.numerator}/{value.denominator}"


def learning(objects: Objects, ins: Inputs) -> Learning:
    _, test = task_lines(objects, ins.prepare.outputs["test"])
    if not test:
        raise InvalidArgument("prepared test set", "it is empty")
    _, train = task_lines(objects, ins.prepare.outputs["train"])
    held_out = sorted({line["task"]["variant"] for line in test}
                      - {line["task"]["variant"] for line in train})
    ids = [line["id"] for line in test]
    scored: dict[str, Scored] = {}
    losses: dict[str, dict[str, float]] = {}
    for arm, run in ins.evaluate.items():
        s, problems = rescore(objects, run.receipt, run.action)
        if problems or s.ids != ids:
            raise InvalidArgument(f"{run.name} generations", problems[0] if problems
                                  else "they are not for the prepared test ids in order")
        scored[arm] = s
        if "retention" in run.outputs:
            probes = objects.record_of(run.inputs["retention"], "tasks/1")["ids"]
            losses[arm] = losses_of(objects, run.outputs["retention"], probes)
    subjects = commitment_subjects(objects, ins)
    arms = {arm: _arm(objects, ins, arm, s, held_out, losses.get(arm), subjects)
            for arm, s in scored.items()}
    compared, contracts, versus = _comparisons(ins, scored, losses)
    section = {"baseline": BASELINE, "documents": len(ids), "held_out_variants": held_out,
               "arms": arms, "comparisons": compared}
    return Learning(section=section, contract=contracts, test_ids=ids, tests=test,
                    held_out=held_out, scored=scored, versus_seed=versus)


def _tally(keys: list[Any], s: Scored, order: list[Any]) -> dict[str, dict[str, int]]:
    return {str(k): {"correct": sum(1 for x, r in zip(keys, s.results, strict=True)
                                    if x == k and r.correct),
                     "documents": keys.count(k)} for k in order}


def _arm(objects: Objects, ins: Inputs, arm: str, s: Scored, held_out: list[Any],
         losses: Mapping[str, float] | None, subjects: Mapping[str, str]) -> dict[str, Any]:
    run = ins.evaluate[arm]
    model = run.inputs["model"]
    n = len(s.results)
    correct = sum(r.correct for r in s.results)
    held = [r.correct for v, r in zip(s.variants, s.results, strict=True) if v in held_out]
    trained = ins.train.get(arm)
    return {
        "evaluation": run.id,
        "model": model,
        "parameter_digest": objects.record_of(model, "checkpoint/1")["params"],
        "committed_as": next((k for k, v in sorted(subjects.items()) if v == model), None),
        "trained_on": documents_kind(ins.prepare, trained) if trained else None,
        "world": world_of(trained) if trained else None,
        "documents": n,
        "correct": correct,
        "accuracy": Fraction(correct, n),
        "valid_json_objects": sum(r.valid_json_object for r in s.results),
        "reasons": dict(Counter(r.reason for r in s.results)),
        "by_family": _tally(s.families, s, [f for f in FAMILIES if f in s.families]),
        "by_variant": _tally(s.variants, s, sorted(set(s.variants))),
        "held_out": {"variants": held_out, "correct": sum(held), "documents": len(held)},
        "retention_mean_loss": _mean(losses),
    }


def _mean(losses: Mapping[str, float] | None) -> float | None:
    """Mean retained per-probe loss; None for an arm without retention (0 for no probes)."""
    if losses is None:
        return None
    return math.fsum(losses.values()) / len(losses) if losses else 0.0


def _retention(base: Mapping[str, float], cand: Mapping[str, float]) -> dict[str, Any]:
    if list(base) != list(cand):
        raise InvalidArgument("retention losses", "two evaluations scored other probes")
    r = retention_claims(dict(base), dict(cand))
    return {"n": len(cand), "mean": r["retention_mean_change"],
            "se": r["retention_standard_error"], "upper": r["retention_upper"],
            "improved": r["retention_improved"], "worsened": r["retention_worsened"]}


def _compare(kind: str, base: str, cand: str, scored: Mapping[str, Scored],
             losses: Mapping[str, Mapping[str, float]]) -> tuple[dict[str, Any], Paired]:
    b, c = scored[base].correct(), scored[cand].correct()
    result = paired_comparison(b, c)
    item: dict[str, Any] = {
        "kind": kind, "candidate": cand, "baseline": base, "documents": result.documents,
        "baseline_correct": sum(b.values()), "candidate_correct": sum(c.values()),
        "wins": result.wins, "losses": result.losses, "gain": result.gain,
        "gain_exact": _exact(result.gain), "p": result.p, "p_exact": _exact(result.p),
        "gain_points": result.gain * 100,
        "retention": (_retention(losses[base], losses[cand])
                      if base in losses and cand in losses else None),
    }
    return item, result


def _contract(result: Paired, upper: float | None) -> dict[str, Any]:
    ok = contract_claim(result.gain, result.p, upper)
    return {
        "gain": {"value": result.gain, "at_least": CONTRACT_MIN_GAIN, "passed": ok["gain"]},
        "p": {"value": result.p, "at_most": CONTRACT_MAX_P, "passed": ok["p"]},
        "retention_upper": {"value": upper, "at_most": CONTRACT_MAX_RETENTION_UPPER,
                            "passed": ok["retention_upper"]},
        "passed": all(ok.values()),
    }


def _comparisons(ins: Inputs, scored: Mapping[str, Scored],
                 losses: Mapping[str, Mapping[str, float]]
                 ) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Paired]]:
    out: list[dict[str, Any]] = []
    contracts: dict[str, Any] = {}
    versus: dict[str, Paired] = {}
    for arm in scored:
        if arm == BASELINE:
            continue
        item, result = _compare("versus_seed", BASELINE, arm, scored, losses)
        upper = item["retention"]["upper"] if item["retention"] else None
        item["contract"] = contracts[arm] = _contract(result, upper)
        versus[arm] = result
        out.append(item)
    kinds = {arm: (documents_kind(ins.prepare, ins.train[arm]), world_of(ins.train[arm]))
             for arm in scored if arm in ins.train}
    for clean, (docs, world) in kinds.items():
        if docs != "clean":
            continue
        for other, (other_docs, other_world) in kinds.items():
            if other_docs == "damaged" and other_world == world:
                out.append(_compare("clean_versus_damaged", other, clean, scored, losses)[0])
            if other_docs == "clean" and world > 1 and other_world == 1:
                out.append(_compare("pair_versus_single", other, clean, scored, losses)[0])
    return out, contracts, versus


# --- training ----------------------------------------------------------------------------

def _rank_numbers(entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    steps = effective_steps(entries)
    seconds = [float(e["seconds"]) for e in steps]
    total = math.fsum(seconds)
    tokens = sum(e["tokens"] for e in steps)
    agreed = [e["parameters"] for e in entries if e.get("event") == "agreed"]
    return {
        "updates": len(steps),
        "update_seconds": total,
        "median_update_seconds": statistics.median(seconds) if seconds else 0.0,
        "bytes_communicated": sum(e["bytes_communicated"] for e in steps),
        "targets": sum(e["targets"] for e in steps),
        "weighted_targets": sum(e["weighted_targets"] for e in steps),
        "tokens": tokens,
        "tokens_per_second": tokens / total if total else 0.0,
        "final_parameters": agreed[-1] if agreed else None,
        **{key: [e[member] for e in steps] for key, member in SERIES.items()},
        "steps": [e["step"] for e in steps],
    }


def _train_arm(objects: Objects, ins: Inputs, run: Run) -> dict[str, Any]:
    world = world_of(run)
    ranks: dict[int, dict[str, Any]] = {}
    records: dict[int, Mapping[str, Any]] = {}
    for oid in run.receipt["journals"]:
        record = objects.record_of(oid, "journal/1")
        if record["world"] != world or record["rank"] in ranks:
            raise InvalidArgument(f"{run.name} journals", f"{oid} is rank {record['rank']} of "
                                  f"{record['world']}, which does not fit world {world}")
        ranks[record["rank"]] = _rank_numbers(read_journal(objects.bytes(record["entries"])))
        records[record["rank"]] = record
    if sorted(ranks) != list(range(world)):
        raise InvalidArgument(f"{run.name} journals", f"ranks {sorted(ranks)} for world {world}")
    if any(r["steps"] != list(range(1, len(r["steps"]) + 1)) or r["steps"] != ranks[0]["steps"]
           for r in ranks.values()):
        raise InvalidArgument(f"{run.name} journals", "the ranks do not hold the same steps 1..n")
    head = ranks[0]
    finals = {r["final_parameters"] for r in ranks.values()}
    checkpoint = run.outputs["checkpoint"]
    totals = ("updates", "update_seconds", "median_update_seconds", "bytes_communicated",
              "targets", "weighted_targets", "tokens", "tokens_per_second")
    per_rank = (*totals, *SERIES)
    losses = head["loss_by_step"]
    return {
        "receipt": run.id,
        "world": world,
        "device": run.params.get("device", "cpu"),
        "hosts": int(run.params.get("nnodes", 1)),
        "documents": documents_kind(ins.prepare, run),
        "base": str(run.inputs.get("base")),
        "from_seed": run.inputs.get("base") == ins.evaluate[BASELINE].inputs.get("model"),
        "checkpoint": checkpoint,
        "parameter_digest": objects.record_of(checkpoint, "checkpoint/1")["params"],
        "parameters_agree": len(finals) == 1 and None not in finals,
        "final_parameters_blake3": head["final_parameters"],
        **{k: head[k] for k in totals},
        "bytes_per_update": (Fraction(head["bytes_communicated"], head["updates"])
                             if head["updates"] else 0),
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        # Shown when the train receipt claims it (receipts from before the claim do not).
        **({"mean_loss": mean_loss(losses)}
           if "mean_loss" in run.receipt["claims"] else {}),
        "loss_by_step": losses,
        "ranks": [{"rank": rank, **{k: ranks[rank][k] for k in per_rank}}
                  for rank in sorted(ranks)],
        "claimed_only": _measured(run, [records[rank] for rank in sorted(records)]),
    }


def _measured(run: Run, records: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Loop seconds (rank 0's) and peak memory (per rank) as the journal records carry them,
    which is what the train receipt claims; the claims where the records carry none."""
    claims = run.claims
    loop = (records[0]["loop_seconds"] if all("loop_seconds" in r for r in records)
            else claims.get("loop_seconds"))
    peak = ([r["peak_memory_bytes"] for r in records]
            if all("peak_memory_bytes" in r for r in records) else claims.get("peak_memory_bytes"))
    return {"loop_seconds": loop, "peak_memory_bytes": peak, "note": CLAIMED_ONLY_NOTE}


def _ratio(a: Any, b: Any) -> Any:
    return a / b if a is not None and b else None


def training(objects: Objects, ins: Inputs) -> dict[str, Any] | None:
    if not ins.train:
        return None
    arms = {arm: _train_arm(objects, ins, run) for arm, run in ins.train.items()}
    ratios = []
    for pair, p in arms.items():
        for single, s in arms.items():
            if not (p["documents"] == s["documents"] == "clean" and p["world"] > 1
                    and s["world"] == 1):
                continue
            loop_p = p["claimed_only"]["loop_seconds"]
            loop_s = s["claimed_only"]["loop_seconds"]
            ratios.append({
                "pair": pair, "single": single,
                "update_seconds": _ratio(p["update_seconds"], s["update_seconds"]),
                "median_update_seconds": _ratio(p["median_update_seconds"],
                                                s["median_update_seconds"]),
                "claimed_only": {
                    "loop_seconds": _ratio(loop_p, loop_s),
                    "allocated_device_seconds_in_loop": _ratio(
                        loop_p * p["world"] if loop_p is not None else None,
                        loop_s * s["world"] if loop_s is not None else None),
                    "note": CLAIMED_ONLY_NOTE,
                },
            })
    return {"arms": arms, "ratios": ratios}


# --- serving, prepared sets, header ------------------------------------------------------

def serving(objects: Objects, ins: Inputs) -> dict[str, Any] | None:
    run = ins.serve
    if run is None:
        return None
    attempts = read_log(objects.bytes(run.outputs["requests"]))
    numbers = recompute(attempts)
    phases = {}
    for phase in PHASES:
        stats = numbers.phases.get(phase)
        if stats is None:
            raise InvalidArgument("request log", f"it holds no {phase!r} phase")
        mine = [a for a in attempts if a.phase == phase]
        phases[phase] = {
            "requests": stats.requests, "attempts": len(mine),
            "failed_attempts": sum(1 for a in mine if not a.ok),
            "successes": stats.successes, "wall_seconds": stats.wall_seconds,
            "requests_per_second": stats.requests_per_second,
            "median_latency_seconds": stats.median_latency_seconds,
            "p95_latency_seconds": stats.p95_latency_seconds,
        }
    model = run.inputs["model"]
    served = [arm for arm, t in ins.train.items() if t.outputs.get("checkpoint") == model]
    return {
        "receipt": run.id, "model": model, "served_arm": served[0] if served else None,
        "replicas": int(run.params.get("replicas", 2)),
        "concurrency": run.params.get("concurrency"),
        "device": run.params.get("device", "cpu"), "phases": phases,
        "throughput_ratio": numbers.throughput_ratio,
        "failure_retries": numbers.failure_retries,
        "identical_outputs": numbers.identical_outputs, "cache_hits": numbers.cache_hits,
    }


def prepared(objects: Objects, ins: Inputs) -> dict[str, Any]:
    """Sizes of the prepared sets and how many damaged targets differ from the clean ones."""
    sets: dict[str, dict[str, Any]] = {}
    lines: dict[str, list[dict[str, Any]]] = {}
    for name in PREPARED_SETS:
        oid = ins.prepare.outputs[name]
        record = objects.record_of(oid, "tasks/1")
        lines[name] = objects.lines(record["records"], f"prepared {name} records")
        sets[name] = {"id": oid, "count": len(lines[name])}
        if "standin" in record:
            sets[name]["standin"] = record["standin"]
    clean = {line.get("id"): line.get("target") for line in lines["train"]}
    damaged = sum(1 for line in lines["damaged"] if clean.get(line.get("id")) != line.get("target"))
    return {"receipt": ins.prepare.id, "prepared": ins.prepare.outputs["prepared"],
            "sets": sets, "damaged_targets": damaged}


def header(objects: Objects, ins: Inputs, params: Mapping[str, Any], *, version: int = 1,
           action: str | None = None) -> dict[str, Any]:
    """The report's format, title (version 2: and its action ID), inputs, prepared sets and
    commitment."""
    commitment = ins.commit.outputs["commitment"]
    named = {"action": action} if version >= 2 else {}
    return {
        "format": REPORT_FORMATS[version],
        "title": params.get("title"),
        **named,
        "inputs": {run.name: run.id for run in ins.runs()},
        "prepared": prepared(objects, ins),
        "commitment": {"id": commitment, "subjects": commitment_subjects(objects, ins)},
    }


def learning_claims(result: Learning) -> dict[str, Any]:
    """The learning claims as the report defines them, from the recomputation."""
    values: dict[str, Any] = {"documents": result.section["documents"]}
    for arm, a in result.section["arms"].items():
        values[f"correct.{arm}"] = a["correct"]
    for arm, paired in result.versus_seed.items():
        values[f"gain.{arm}"] = paired.gain
        values[f"p.{arm}"] = paired.p
        values[f"p_exact.{arm}"] = f"{paired.p.numerator}/{paired.p.denominator}"
        values[f"contract.{arm}"] = result.contract[arm]["passed"]
    return values
