"""Training journals (docs/experiment.md §3.8): each rank's hash chain and head
(``schedule.check_journal``); the ranks agree step by step; each step's documents are the
seeded schedule's batch; the per-run claims (updates, update seconds, bytes communicated,
losses, ...) are recomputed from the step entries.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.compare import Exact, Tolerance
from ..core.errors import InvalidArgument, LogFormatError
from ..core.results import Check, Needs
from ..records.closure import Objects, Unusable
from .entries import close_enough, effective_steps, is_diloco, is_int, is_real, problems_check
from .schedule import check_journal, document_schedule, read_journal


def journal_checks(objects: Objects, journal_ids: Sequence[str],
                   name: str) -> tuple[list[Check], dict[int, list[Mapping[str, Any]]]]:
    """Chain and head of every rank's journal; returns each readable rank's entries."""
    checks: list[Check] = []
    ranks: dict[int, list[Mapping[str, Any]]] = {}
    listed: list[int] = []
    worlds = set()
    for oid in journal_ids:
        try:
            record = objects.record_of(oid, "journal/1")
            data = objects.bytes(record["entries"])
        except Unusable as exc:
            checks.append(Check.failed(f"{name}.journal.{oid[7:15]}", f"unusable: {exc.why}"))
            continue
        rank = record["rank"]
        listed.append(rank)
        worlds.add(record["world"])
        checks.extend(check_journal(data, head=record["head"], name=f"{name}.journal{rank}"))
        try:
            ranks[rank] = read_journal(data)
        except LogFormatError:
            continue
        checks.append(_journal_record_check(record, ranks[rank], f"{name}.journal{rank}.record"))
    world = next(iter(worlds)) if len(worlds) == 1 else None
    expected = (list(range(world)) if isinstance(world, int) and world == len(journal_ids)
                else None)
    ok = expected is not None and sorted(listed) == expected
    checks.append(Check.verdict(f"{name}.journals.ranks", ok, claimed=sorted(listed),
                                recomputed=expected if expected else sorted(worlds)[:3],
                                message="one journal per rank 0..world-1 with one world size "
                                        "is required"))
    return checks, ranks


def _journal_record_check(record: Mapping[str, Any], entries: list[Mapping[str, Any]],
                          name: str) -> Check:
    """The journal/1 record and its entries speak of one rank and one history: every entry
    names the record's rank, and ``resumed_from`` is the step of the last ``resume`` event
    (null when the run never resumed, or resumed from step 0)."""
    problems = []
    wrong = [n for n, e in enumerate(entries, start=1) if e.get("rank") != record["rank"]]
    if wrong:
        problems.append(f"{len(wrong)} entries name another rank than {record['rank']} "
                        f"(first: line {wrong[0]})")
    resumes = [e.get("from_step") for e in entries if e.get("event") == "resume"]
    expected = (resumes[-1] or None) if resumes else None
    if record.get("resumed_from") != expected or isinstance(record.get("resumed_from"), bool):
        problems.append(f"resumed_from is {record.get('resumed_from')!r}, the entries say "
                        f"{expected!r}")
    return Check.verdict(name, not problems, claimed=record.get("resumed_from"),
                         recomputed=expected, message="; ".join(problems))


GLOBAL_STEP_KEYS = ("documents", "indices", "targets", "weighted_targets", "lr")
"""Step-entry members every rank shares in a DiLoCo run (the rest are the rank's own)."""


def agreement_check(ranks: Mapping[int, list[Mapping[str, Any]]], name: str,
                    params: Mapping[str, Any] | None = None) -> Check:
    """Every rank made the same steps on the same documents with the same numbers (in a
    DiLoCo run: the same global batch and lr; ``diloco_checks`` compares the outer steps)."""
    if len(ranks) < 2:
        return Check.passed(f"{name}.journals.agree", recomputed=len(ranks),
                            message="one rank: nothing to compare")
    problems = []
    base_rank = min(ranks)
    base = effective_steps(ranks[base_rank])
    base_agreed = [(e.get("step"), e.get("parameters")) for e in ranks[base_rank]
                   if e.get("event") == "agreed"]
    for rank, entries in sorted(ranks.items()):
        if rank == base_rank:
            continue
        steps = effective_steps(entries)
        if [e.get("step") for e in steps] != [e.get("step") for e in base]:
            problems.append(f"rank {rank}: other step numbers than rank {base_rank}")
            continue
        keys = (GLOBAL_STEP_KEYS if params is not None and is_diloco(params)
                else (*GLOBAL_STEP_KEYS, "loss", "grad_norm", "parameters"))
        for mine, theirs in zip(steps, base, strict=True):
            for key in keys:
                if not close_enough(mine.get(key), theirs.get(key)):
                    problems.append(f"rank {rank} step {mine.get('step')}: {key} differs")
        agreed = [(e.get("step"), e.get("parameters")) for e in entries
                  if e.get("event") == "agreed"]
        if agreed != base_agreed:
            problems.append(f"rank {rank}: parameter digest events differ from rank {base_rank}")
    return problems_check(f"{name}.journals.agree", problems, recomputed=len(ranks))


def schedule_check(steps: list[Mapping[str, Any]], *, seed: Any, documents: int, n_steps: Any,
                   batch: Any, ids: set[str], name: str) -> Check:
    """Step ``s`` trained batch ``s - 1`` of the seeded schedule, and nothing else."""
    try:
        schedule = document_schedule(seed, documents, n_steps, batch)
    except InvalidArgument as exc:
        return Check.failed(f"{name}.schedule", f"cannot rebuild the schedule: {exc.message}")
    problems = []
    numbers = [e.get("step") for e in steps]
    if numbers != list(range(1, len(schedule) + 1)):
        problems.append(f"steps are {numbers[:3]}..., expected 1..{len(schedule)}")
    id_of: dict[int, Any] = {}
    for entry in steps:
        step = entry.get("step")
        if not isinstance(step, int) or not 1 <= step <= len(schedule):
            continue
        batch_indices = schedule[step - 1]
        indices = entry.get("indices")
        docs = entry.get("documents")
        if indices is None and isinstance(docs, list) and all(isinstance(d, int) for d in docs):
            indices = docs
        if indices != batch_indices:
            problems.append(f"step {step}: documents are not the scheduled batch")
            continue
        if isinstance(docs, list) and docs is not indices:
            for index, doc in zip(indices, docs, strict=False):
                if id_of.setdefault(index, doc) != doc or (ids and doc not in ids):
                    problems.append(f"step {step}: document {doc!r} is not document {index}")
                    break
    return problems_check(f"{name}.schedule", problems, recomputed=len(schedule))


INTEGER_FIELDS = ("targets", "weighted_targets", "tokens", "bytes_communicated")
"""Step-entry members that are counts: integers, compared exactly."""


LR_TOLERANCE = Tolerance(None, rel=1e-12, abs=0.0,
                         why="math.cos may differ by an ulp between C libraries")


SUM_TOLERANCE = "floating sums of per-step seconds taken in another order"


FP32_BYTES = 4
"""Bytes of one FP32 parameter's gradient (docs/experiment.md §3: FP32 parameters)."""


def run_values(steps: list[Mapping[str, Any]], outer: Sequence[Mapping[str, Any]] = ()
               ) -> tuple[dict[str, Any], list[str]]:
    """Claims recomputed from one rank's effective step entries (and, for DiLoCo, its
    effective outer steps: their seconds count in ``update_seconds``, their ``bytes_sent`` in
    ``bytes_communicated``). Counts must be integers in every entry (a float count is a
    problem, never summed); seconds must be finite numbers."""
    problems = []
    for key in ("seconds", *INTEGER_FIELDS):
        check = is_real if key == "seconds" else is_int
        bad = [e.get("step") for e in steps if not check(e.get(key))
               or (key == "seconds" and not math.isfinite(e[key]))
               or (key != "seconds" and e[key] < 0)]
        if bad:
            what = "a finite number" if key == "seconds" else "a non-negative integer"
            problems.append(f"steps {bad[:3]} lack {what} {key!r}")
    bad_outer = [e.get("outer_step") for e in outer
                 if not (is_real(e.get("seconds")) and math.isfinite(e["seconds"])
                         and is_int(e.get("bytes_sent")) and e["bytes_sent"] >= 0)]
    if bad_outer:
        problems.append(f"outer steps {bad_outer[:3]} lack finite seconds or integer bytes_sent")
    if problems or not steps:
        return {}, problems or ["no step entries"]
    seconds = [float(e["seconds"]) for e in steps]
    total = math.fsum([*seconds, *(float(e["seconds"]) for e in outer)])
    tokens = sum(e["tokens"] for e in steps)
    values: dict[str, Any] = {
        "updates": len(steps),
        "update_seconds": Tolerance(total, why=SUM_TOLERANCE),
        "median_update_seconds": Tolerance(statistics.median(seconds), why=SUM_TOLERANCE),
        "bytes_communicated": (sum(e["bytes_communicated"] for e in steps)
                               + sum(e["bytes_sent"] for e in outer)),
        "targets": sum(e["targets"] for e in steps),
        "weighted_targets": sum(e["weighted_targets"] for e in steps),
        "tokens": tokens,
        "tokens_per_second": Tolerance(tokens / total if total > 0 else 0.0, why=SUM_TOLERANCE),
    }
    if outer:
        values["outer_steps"] = len(outer)
    return values, []


LOSS_CLAIMS = ("first_loss", "last_loss", "mean_loss")
"""A train run's claims of its training loss (docs/format.md §3.10)."""


def loss_values(steps: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Exact], str | None]:
    """``first_loss``, ``last_loss`` and ``mean_loss`` recomputed from one rank's effective
    step entries, each compared exactly: the first and last step's ``loss``, and the mean
    ``math.fsum(losses) / len(losses)`` (the exact sum rounded once, then one division).
    Every step's loss must be a finite number ``>= 0`` (the objective of docs/experiment.md
    §3.3); otherwise nothing is recomputed and the reason is returned."""
    losses = [_loss(e.get("loss")) for e in steps]
    bad = [e.get("step") for e, loss in zip(steps, losses, strict=True) if loss is None]
    if bad:
        return {}, f"steps {bad[:3]} lack a finite loss >= 0"
    finite = [loss for loss in losses if loss is not None]
    mean = mean_loss(finite)
    if mean is None:
        return {}, "no step entries" if not finite else "the losses' sum overflows a float"
    return {"first_loss": Exact(finite[0]), "last_loss": Exact(finite[-1]),
            "mean_loss": Exact(mean)}, None


def mean_loss(losses: Sequence[Any]) -> float | None:
    """``math.fsum(losses) / len(losses)``; None when there are none, one is not a finite
    number ``>= 0``, or the sum overflows."""
    values = [v for v in map(_loss, losses) if v is not None]
    if not values or len(values) != len(losses):
        return None
    try:
        return math.fsum(values) / len(values)
    except OverflowError:
        return None


def _loss(value: Any) -> float | None:
    """``value`` as a float when it is a JSON number giving a finite float ``>= 0``."""
    if not is_real(value):
        return None
    try:
        loss = float(value)
    except OverflowError:
        return None
    return loss if math.isfinite(loss) and loss >= 0 else None


def learning_rate(step: int, *, lr: float, warmup: int, steps: int) -> float:
    """docs/experiment.md §3's learning rate of update ``step`` (0-based): ``lr·(s+1)/warmup`` while
    ``s < warmup``, then cosine from ``lr`` (first decay update) to ``0.1·lr`` (last one)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    decay = steps - warmup
    if decay <= 1:
        return lr
    progress = (step - warmup) / (decay - 1)
    return lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def lr_check(steps: list[Mapping[str, Any]], params: Mapping[str, Any], name: str) -> Check:
    """Every step entry's ``lr`` is the schedule's value for its step (step ``s`` is update
    ``s - 1``), within ``LR_TOLERANCE``."""
    check = f"{name}.journals.lr"
    lr, warmup, total = params.get("lr"), params.get("warmup"), params.get("steps")
    if not (is_real(lr) and math.isfinite(lr) and is_int(warmup) and warmup >= 0
            and is_int(total) and total >= 1):
        return Check.failed(check, f"the params give no usable schedule (lr {lr!r}, warmup "
                                   f"{warmup!r}, steps {total!r})")
    problems = []
    for entry in steps:
        step, got = entry.get("step"), entry.get("lr")
        if not is_int(step) or not 1 <= step <= total:
            problems.append(f"step {step!r} is not an update of a {total}-step schedule")
            continue
        want = learning_rate(step - 1, lr=float(lr), warmup=warmup, steps=total)
        if not is_real(got) or not math.isfinite(got) or abs(got - want) > (
                LR_TOLERANCE.rel * abs(want) + LR_TOLERANCE.abs):
            problems.append(f"step {step}: lr {got!r}, the schedule gives {want!r}")
    result = problems_check(check, problems, recomputed=len(steps))
    return _with_rule(result, LR_TOLERANCE.describe())


def _with_rule(check: Check, rule: str) -> Check:
    message = f"{check.message} [{rule}]" if check.message else rule
    return Check(name=check.name, status=check.status, claimed=check.claimed,
                 recomputed=check.recomputed, message=message, needs=check.needs)


def weighted_targets_check(steps: list[Mapping[str, Any]], params: Mapping[str, Any],
                           replay_ids: set[str], grounded_ids: set[str], name: str) -> Check:
    """``weighted_targets = Σ targets_i · w_i`` (docs/experiment.md §3) with grounded weight and replay
    weight from the params: exactly ``w · targets`` when a batch holds documents of one
    weight, and between ``min(w) · targets`` and ``max(w) · targets`` otherwise (the
    per-document target counts need the chat template)."""
    check = f"{name}.journals.weighted_targets"
    grounded, replay = params.get("grounded_weight"), params.get("replay_weight")
    if not (is_int(grounded) and is_int(replay) and grounded >= 0 and replay >= 0):
        return Check.failed(check, f"the params give no integer loss weights (grounded "
                                   f"{grounded!r}, replay {replay!r})")
    problems = []
    for entry in steps:
        docs, targets, weighted = (entry.get("documents"), entry.get("targets"),
                                   entry.get("weighted_targets"))
        if not (isinstance(docs, list) and is_int(targets) and is_int(weighted)):
            problems.append(f"step {entry.get('step')!r}: documents, targets or weighted "
                            "targets malformed")
            continue
        weights = set()
        for doc in docs:
            if isinstance(doc, str) and doc in replay_ids:
                weights.add(replay)
            elif isinstance(doc, str) and doc in grounded_ids:
                weights.add(grounded)
            else:
                problems.append(f"step {entry.get('step')}: document {str(doc)[:16]!r} is not "
                                "a training document")
                weights = set()
                break
        if not weights:
            continue
        low, high = min(weights) * targets, max(weights) * targets
        if not low <= weighted <= high:
            expected = f"{low}" if low == high else f"between {low} and {high}"
            problems.append(f"step {entry.get('step')}: weighted targets {weighted}, expected "
                            f"{expected} for {targets} targets")
    return problems_check(check, problems, recomputed=len(steps))


def bytes_check(steps: list[Mapping[str, Any]], *, world: Any, parameters: int | None,
                not_rechecked: tuple[Needs, str] | None, why_not: str | None,
                name: str, diloco: bool = False) -> Check:
    """Each update all-reduces every trained parameter's FP32 gradient once when the world
    has more than one rank: ``bytes_communicated = 4 · parameters`` per step, ``0`` alone.
    A DiLoCo inner step communicates nothing: 0 (its outer steps carry the bytes)."""
    check = f"{name}.journals.bytes_communicated"
    values = [e.get("bytes_communicated") for e in steps]
    if not is_int(world) or world < 1:
        return Check.failed(check, f"the params give no world size ({world!r})")
    if diloco:
        wrong = [e.get("step") for e, v in zip(steps, values, strict=True)
                 if not is_int(v) or v != 0]
        return Check.verdict(check, not wrong, claimed=values[0] if values else None,
                             recomputed=0, message=f"steps {wrong[:3]} communicate bytes, but "
                             "a diloco inner step communicates none")
    if world == 1:
        expected: int | None = 0
    elif parameters is not None:
        expected = FP32_BYTES * parameters
    elif not_rechecked is not None:
        return Check.skipped(check, "the bytes per update follow from the parameter count: "
                             + not_rechecked[1], needs=not_rechecked[0])
    else:
        return Check.failed(check, f"the parameter count is unknown: {why_not}")
    wrong = [e.get("step") for e, v in zip(steps, values, strict=True)
             if not is_int(v) or v != expected]
    why = "one rank: none" if world == 1 else "4 bytes per FP32 parameter gradient per update"
    return Check.verdict(check, not wrong, claimed=values[0] if values else None,
                         recomputed=expected,
                         message=f"steps {wrong[:3]} do not communicate {expected} bytes "
                                 f"({why})")
