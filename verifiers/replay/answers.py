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

import os
import random
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from ..bundle.loading import model_folder
from ..core.errors import RecordParseError
from ..core.results import Check
from ..core.runs import Run
from ..evaluation.scoring import generation_keys, load_tokenizer, losses_of
from ..records.closure import Objects, Unusable, weights_omitted
from ..tasks.chat import TemplateError, end_of_turn, template_source, turns_renderer
from ..tasks.tasksets import read_lines
from .greedy import Answer, Precision, Tolerance, answer_scores, judge, stopping_problem

IGNORE = -100
RETENTION_TOLERANCE = 1e-3
"""Largest relative difference between a replayed and a retained retention loss: FP32 sums of
the same token losses in another order, or on other hardware."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayOptions:
    """What the auditor asked to replay."""

    count: int
    """Tasks drawn per evaluated arm."""
    seed: int
    """Seed of the draw (the auditor's, so the producer cannot choose the sample)."""
    tasks: tuple[str, ...] = ()
    """Task ids replayed in every arm besides the drawn ones."""
    device: str = "cpu"
    """``cpu`` or ``cuda``."""
    time_limit: float | None = None
    """Seconds for the whole replay; what is left when they run out is listed as not
    rechecked."""
    progress: Callable[[str, int, int], None] | None = field(default=None, compare=False)
    """``(arm, done, total)`` after each replayed task."""
    steps: int = 0
    """Training updates replayed after each published optimizer state (``replaytrain``);
    0: none."""


def sample_tasks(ids: Sequence[str], options: ReplayOptions) -> list[str]:
    """The drawn tasks of one arm in task order, then the named ones it has."""
    rng = random.Random(options.seed)
    drawn = sorted(rng.sample(range(len(ids)), min(options.count, len(ids))))
    chosen = [ids[i] for i in drawn]
    return chosen + [t for t in options.tasks if t in ids and t not in chosen]


def environment(device: str, precision: str) -> dict[str, Any]:
    """Where the replay ran, as the verify report records it."""
    import torch

    env: dict[str, Any] = {"device": device, "precision": precision,
                           "torch": torch.__version__}
    if device == "cuda":
        env["device_name"] = torch.cuda.get_device_name()
    return env


def replay_receipts(objects: Objects, receipts: Sequence[str], options: ReplayOptions
                    ) -> list[Check]:
    """``replay_evaluations`` of the succeeded evaluate runs among ``receipts`` (in order);
    receipts that cannot be read are plain verification's findings, not replay's."""
    runs = []
    for oid in receipts:
        try:
            receipt = objects.record_of(oid, "receipt/1")
            action = objects.record_of(receipt["action"], "action/1")
        except Unusable:
            continue
        recipe = str(action.get("recipe", "")).partition("@")[0]
        if recipe in ("evaluate", "train") and receipt.get("status") == "succeeded":
            runs.append(Run(id=oid, name=f"{recipe}.{oid[7:15]}", receipt=receipt,
                            action=action, recipe=recipe))
    return replay_evaluations(objects, runs, options)


def replay_evaluations(objects: Objects, runs: Sequence[Run], options: ReplayOptions
                       ) -> list[Check]:
    """A ``replay`` check per evaluate run, a ``replay.training`` check per train run when
    ``options.steps`` > 0 (``replaytrain``), and one naming where the replay ran."""
    from .training import replay_trainings  # it builds on this module's model loading

    evaluations = [r for r in runs if r.recipe == "evaluate"]
    checks: list[Check] = []
    deadline = None if options.time_limit is None else time.monotonic() + options.time_limit
    precisions = set()
    for run in evaluations:
        name = f"{run.name}.replay"
        tolerance = Tolerance(run=run_precision(run), replay=replay_precision(run, options.device))
        precisions.add(tolerance.replay)
        if weights_omitted(objects, run.inputs["model"]):
            checks.append(Check.skipped(name, "the bundle omits the weights a replay needs",
                                        needs="weights"))
            continue
        try:
            checks.extend(_replay_run(objects, run, options, tolerance, deadline, name))
        except Unusable as exc:
            checks.append(Check.failed(name, f"cannot replay: {exc}"))
    trained = replay_trainings(objects, runs, options)
    checks.extend(trained)
    if evaluations or trained:
        env = environment(options.device, "/".join(sorted(precisions)) or "fp32")
        checks.append(Check.passed(
            "replay.environment", recomputed={**env, "seed": options.seed,
                                              "count": options.count,
                                              "steps": options.steps},
            message=f"replayed on {env.get('device_name', env['device'])} "
                    f"({env['precision']}, torch {env['torch']}), seed {options.seed}"))
    return checks


def run_precision(run: Run) -> Precision:
    """What the run's decoder computed in: BF16 autocast only for ``precision = "bf16"`` on
    CUDA (docs/experiment.md §4.2), FP32 otherwise."""
    cuda = run.params.get("device") == "cuda"
    return "bf16" if cuda and run.params.get("precision", "bf16") == "bf16" else "fp32"


def replay_precision(run: Run, device: str) -> Precision:
    """The run's precision where the replay's device can compute in it: BF16 only on CUDA."""
    return "bf16" if device == "cuda" and run_precision(run) == "bf16" else "fp32"


def _replay_run(objects: Objects, run: Run, options: ReplayOptions, tolerance: Tolerance,
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
    with _model(objects, run.inputs["model"], options.device) as model:
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
        lines = read_lines(objects.bytes(record["records"]), "retention probes")
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
            ids, labels = _encode(line, render, tokenizer, turn)
        except (TemplateError, ValueError) as exc:
            problems.append(f"probe {line.get('id')}: {exc}")
            continue
        loss = _mean_loss(model, ids, labels, device)
        want = retained.get(line.get("id"))
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


def _messages(line: Mapping[str, Any]) -> list[dict[str, str]]:
    """A probe's chat messages: its ``messages``, or a grounded ``prompt`` and ``target``."""
    if "messages" in line:
        messages = line["messages"]
        if not isinstance(messages, list) or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str) for m in messages):
            raise ValueError("messages are not {role, content} strings")
        return [{"role": m["role"], "content": m["content"]} for m in messages]
    if isinstance(line.get("prompt"), str) and isinstance(line.get("target"), str):
        return [{"role": "user", "content": line["prompt"]},
                {"role": "assistant", "content": line["target"]}]
    raise ValueError("has neither messages nor a prompt and target")


def _encode(line: Mapping[str, Any], render: Callable[[list[dict[str, str]], bool], str],
            tokenizer: Any, turn: int) -> tuple[list[int], list[int]]:
    """Token ids and labels: each answer from its first token through the end of its turn."""
    messages = _messages(line)

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False).ids)

    ids = encode(render(messages, False))
    labels = [IGNORE] * len(ids)
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(encode(render(messages[:index], True)))
        if turn not in ids[start:]:
            raise ValueError(f"assistant message {index} has no end-of-turn token after it")
        end = ids.index(turn, start)
        labels[start:end + 1] = ids[start:end + 1]
    return ids, labels


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
        lines = read_lines(objects.bytes(run.outputs["generations"]), "generations")
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


@contextmanager
def _model(objects: Objects, checkpoint: str, device: str) -> Iterator[Any]:
    """The checkpoint's model in FP32 on ``device``, loaded from its own files."""
    import torch
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory(prefix="nscas-replay-") as tmp, ExitStack() as files:
        root = checkpoint_dir(objects, checkpoint, Path(tmp), files)
        try:
            with _quiet():
                model = AutoModelForCausalLM.from_pretrained(root, dtype=torch.float32)
        except Exception as exc:  # transformers raises many kinds for a directory it cannot load
            raise Unusable(checkpoint, f"does not load as a model ({type(exc).__name__}: "
                           f"{exc})") from None
        model.to(device).eval()
        yield model


def checkpoint_dir(objects: Objects, checkpoint: str, root: Path, files: ExitStack) -> Path:
    """The folder a reader loads ``checkpoint`` from: in a bundle, its own model folder, once
    it holds exactly the checkpoint's files (``loading.model_folder``); elsewhere ``root``
    made a directory of the checkpoint's files, links to verified copies kept open in
    ``files`` (close it only after the model is loaded). Unsafe paths are refused."""
    folder = model_folder(objects, checkpoint)
    if folder is not None:
        return folder
    tree = objects.record_of(objects.record_of(checkpoint, "checkpoint/1")["files"], "tree/1")
    for rel, entry in sorted(tree["entries"].items()):
        path = PurePosixPath(rel)
        if path.is_absolute() or ".." in path.parts or not path.parts:
            raise Unusable(checkpoint, f"names an unsafe file path {rel!r}")
        target = root.joinpath(*path.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        source = files.enter_context(objects.as_file(entry["id"], name=path.name))
        os.symlink(Path(source).resolve(), target)
    return root


@contextmanager
def _quiet() -> Iterator[None]:
    """No transformers progress bar on the auditor's terminal while a model loads."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()


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
