"""Replay: recheck a sample of an evaluation's answers against its committed weights.

Plain verification rechecks everything derived from the retained answers but takes on trust
that the answers came from the committed checkpoint. ``nscas verify --replay N`` closes that
gap for a sample the producer cannot choose: N test tasks per evaluated arm, drawn with the
auditor's seed (plus any task the auditor names), are fed through the checkpoint with the
retained answer as the continuation of the retained prompt (docs/format.md §7.8), and each is
judged by ``greedy``: identical to a greedy decoding, consistent with one up to near ties,
or not. The model comes from the checkpoint's own files through transformers and torch;
nothing here imports nscas (docs/format.md §7.1).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.errors import RecordParseError
from ..core.results import Check
from ..core.runs import Run
from ..evaluation.scoring import generation_keys, load_tokenizer, losses_of
from ..records.closure import Objects, Unusable
from ..tasks.chat import TemplateError, end_of_turn, template_source, turns_renderer
from .greedy import Answer, Precision, Tolerance, answer_scores, judge, stopping_problem
from .models import IGNORE, encode_turns, loaded_model
from .options import ReplayOptions, sample_tasks

RETENTION_TOLERANCE = 1e-3
"""Largest relative difference between a replayed and a retained retention loss: FP32 sums of
the same token losses in another order, or on other hardware."""


def run_precision(run: Run) -> Precision:
    """What the run's decoder computed in: BF16 autocast only for ``precision = "bf16"`` on
    CUDA (docs/experiment.md §4.2), FP32 otherwise."""
    cuda = run.params.get("device") == "cuda"
    return "bf16" if cuda and run.params.get("precision", "bf16") == "bf16" else "fp32"


def replay_precision(run: Run, device: str) -> Precision:
    """The run's precision where the replay's device can compute in it: BF16 only on CUDA."""
    return "bf16" if device == "cuda" and run_precision(run) == "bf16" else "fp32"


def replay_run(objects: Objects, run: Run, options: ReplayOptions, tolerance: Tolerance,
                deadline: float | None, name: str) -> list[Check]:
    lines = _generations(objects, run)
    ids = [g["id"] for g in lines]
    by_id = {g["id"]: g for g in lines}
    chosen = sample_tasks(ids, options)
    unknown = [t for t in options.tasks if t not in by_id]
    limit = run.params.get("max_new_tokens")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise Unusable(run.id, "has no positive integer max_new_tokens to check answers with")
    _tokenizer, stops = load_tokenizer(objects, run.inputs["model"])
    if not stops:
        raise Unusable(run.inputs["model"], "names no end-of-turn token, so the answers' "
                       "stopping rule cannot be checked")
    answers: list[Answer] = []
    left: list[str] = []
    with loaded_model(objects, run.inputs["model"], options.device) as model:
        for done, task in enumerate(chosen):
            if deadline is not None and time.monotonic() > deadline:
                left = chosen[done:]
                break
            answers.append(replay_answer(model, by_id[task], stops=stops, max_new_tokens=limit,
                                         device=options.device, tolerance=tolerance))
            if options.progress is not None:
                options.progress(run.name, done + 1, len(chosen))
        retention = _retention(objects, run, model, options.device, deadline)
    return [answers_check(name, answers, left, unknown, tolerance, options),
            *([] if retention is None else [retention])]


def answers_check(name: str, answers: Sequence[Answer], left: Sequence[str],
                   unknown: Sequence[str], tolerance: Tolerance, options: ReplayOptions
                   ) -> Check:
    """``<run>.replay``: failed if an answer failed, not rechecked if one is unexplained or
    the time bound left some, else passed."""
    by = {v: [a for a in answers if a.verdict == v]
          for v in ("identical", "consistent", "unexplained", "failed")}
    where = (f"seed {options.seed}, replayed on {options.device} in "
             f"{tolerance.replay.upper()}, run in {tolerance.run.upper()}")
    summary = f"{len(answers)} replayed ({where}): {len(by['identical'])} identical"
    deviations = [d for a in answers for d in a.deviations if d.deficit <= d.tolerance]
    if by["consistent"]:
        largest = max(deviations, key=lambda d: d.deficit / d.tolerance)
        task = next(a.task for a in answers if largest in a.deviations)
        summary += (f", {len(by['consistent'])} consistent within near ties (largest deficit "
                    f"{largest.deficit:.3g} at {task} token {largest.position}, tolerance "
                    f"{largest.tolerance:.3g})")
    for verdict, label in (("unexplained", "not rechecked"), ("failed", "failed")):
        if by[verdict]:
            summary += f", {len(by[verdict])} {label}"
    if unknown:
        summary += f"; not among this run's tasks: {', '.join(unknown)}"
    detail = "; ".join(a.describe() for a in (by["failed"] or by["unexplained"])[:5])
    recomputed: dict[str, Any] = {v: [a.task for a in group] for v, group in by.items()}
    recomputed["replayed"] = [a.task for a in answers]
    recomputed["largest_deficit"] = max((d.deficit for a in answers for d in a.deviations),
                                        default=0.0)
    recomputed["tolerance"] = tolerance.describe()
    if by["failed"]:
        return Check.failed(name, f"{summary}; {detail}", recomputed=recomputed)
    if by["unexplained"]:
        return Check.skipped(name, f"{summary}; {detail}", needs="model")
    if left:
        return Check.skipped(name, f"{summary}; the time bound left {len(left)} unreplayed",
                             needs="model")
    return Check.passed(name, recomputed=recomputed, message=summary)


def _retention(objects: Objects, run: Run, model: Any, device: str,
               deadline: float | None) -> Check | None:
    """Every retention probe's loss recomputed from the weights (docs/experiment.md §3's
    labels, FP32 as the evaluation computes it) against the retained one."""
    if "retention" not in run.inputs or "retention" not in run.outputs:
        return None  # plain verification reports a missing output
    name = f"{run.name}.replay.retention"
    if deadline is not None and time.monotonic() > deadline:
        return Check.skipped(name, "the time bound left the retention losses unreplayed",
                             needs="model")
    record = objects.record_of(run.inputs["retention"], "tasks/1")
    retained = losses_of(objects, run.outputs["retention"], list(record["ids"]))
    try:
        lines = objects.lines(record["records"], "retention probes")
    except RecordParseError as exc:
        raise Unusable(record["records"], exc.message) from None
    tokenizer, _eos = load_tokenizer(objects, run.inputs["model"])
    if tokenizer is None:
        return Check.failed(name, "the checkpoint has no usable tokenizer.json")
    files = objects.record_of(objects.record_of(run.inputs["model"], "checkpoint/1")["files"],
                              "tree/1")
    try:
        render = turns_renderer(*template_source(objects, files["entries"]))
        turn = end_of_turn(objects, files["entries"], tokenizer)["id"]
    except TemplateError as exc:
        return Check.failed(name, str(exc))
    worst, problems = 0.0, []
    for line in lines:
        try:
            ids, labels = encode_turns(line, render, tokenizer, turn)
        except (TemplateError, ValueError) as exc:
            problems.append(f"probe {line.get('id')}: {exc}")
            continue
        loss = _mean_loss(model, ids, labels, device)
        probe = line.get("id")
        want = retained.get(probe) if isinstance(probe, str) else None
        if want is None:
            continue  # losses_of checked the ids
        relative = abs(loss - want) / max(abs(want), 1e-12)
        worst = max(worst, relative)
        if relative > RETENTION_TOLERANCE:
            problems.append(f"probe {line['id']}: {loss:.6g} replayed, {want:.6g} retained")
    message = (f"{len(lines)} probes, largest relative difference {worst:.2e} "
               f"(tolerance {RETENTION_TOLERANCE:g})")
    if problems:
        return Check.failed(name, f"{message}; " + "; ".join(problems[:5]),
                            recomputed=worst)
    return Check.passed(name, recomputed=worst, message=message)


def _mean_loss(model: Any, ids: list[int], labels: list[int], device: str) -> float:
    """Mean FP32 next-token cross-entropy over the labelled positions."""
    import torch
    import torch.nn.functional as F

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits
    shifted = logits[0, :-1].float()
    target = torch.tensor(labels[1:], device=device)
    total = F.cross_entropy(shifted, target, ignore_index=IGNORE, reduction="sum")
    return float(total) / max(sum(1 for t in labels if t != IGNORE), 1)


def _generations(objects: Objects, run: Run) -> list[dict[str, Any]]:
    """The run's generation lines, each well-formed (plain verification reports others)."""
    try:
        lines = objects.lines(run.outputs["generations"], "generations")
    except RecordParseError as exc:
        raise Unusable(run.outputs["generations"], exc.message) from None
    keys = generation_keys(run.action)
    good = []
    for g in lines:
        if set(g) != keys or not isinstance(g["id"], str):
            raise Unusable(run.outputs["generations"], "holds a malformed generation line")
        ids = (g["prompt_ids"], g["output_ids"])
        if not all(isinstance(x, list) and x and all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in x)
                for x in ids):
            raise Unusable(run.outputs["generations"],
                           f"line {g['id']} has no usable prompt or output ids")
        good.append(g)
    return good


def replay_answer(model: Any, line: Mapping[str, Any], *, stops: set[int],
                  max_new_tokens: int, device: str, tolerance: Tolerance) -> Answer:
    """One generation line judged against ``model`` (``greedy.judge``), its stopping rule
    with it."""
    prompt, out = list(line["prompt_ids"]), list(line["output_ids"])
    stopping = stopping_problem(out, stops, max_new_tokens)
    try:
        scores = answer_scores(model, prompt, out, device, tolerance.replay)
    except (IndexError, RuntimeError, ValueError) as exc:  # ids the model cannot take
        raise Unusable(str(line["id"]), f"does not go through the model ({exc})") from None
    if max(out) >= scores.shape[-1]:
        raise Unusable(str(line["id"]), "an output id lies beyond the model's vocabulary")
    return judge(str(line["id"]), out, scores, tolerance, stopping)
