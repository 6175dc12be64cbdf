"""The ``evaluate`` recipe's claims, recomputed from its retained generations (docs/experiment.md §4).

Every generation's text is re-scored with the verifiers' own strict checker against the
target the task rules give for its case (not the target text the run used), so neither the
``checks`` blob nor the claims are trusted. Where the model's tokenizer is available (its
``tokenizer.json`` in the checkpoint's files), each text is also re-decoded from its output
ids, which catches an edited answer even when everything above it was rewritten to match.
Paired statistics re-score the baseline evaluation the same way. Retention losses need the
model and are not recomputed; their summary statistics are.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from ..core.errors import InvalidArgument, RecordParseError, TaskError, VerifierError
from ..core.results import Check
from ..records.closure import Objects, Unusable
from ..records.reading import parse_json
from ..tasks.chat import TemplateError, end_of_turn, prompt_renderer, template_source
from ..tasks.checker import CheckResult, check_answer, compute_target
from ..tasks.tasksets import Task, expected_target, task_lines
from .stats import (
    CONTRACT_MAX_P,
    CONTRACT_MAX_RETENTION_UPPER,
    CONTRACT_MIN_GAIN,
    paired_comparison,
    retention,
)

GENERATION_KEYS = frozenset({"id", "prompt_ids", "output_ids", "text", "ended_with_eos",
                             "hit_token_limit"})
"""The members of an evaluate ``generations`` line (its timing is a ``timings`` line)."""
TIMING_KEYS = frozenset({"seconds", "tokens_per_second"})
TIMING_LINE_KEYS = frozenset({"id"}) | TIMING_KEYS
"""The members of an evaluate ``timings`` line: what the run measured, per task."""
TIMED_GENERATION_KEYS = GENERATION_KEYS | TIMING_KEYS
"""The members of a ``probes`` generation line, and of an ``evaluate@1`` one: it carries its
timing itself (``evaluate@1`` had no ``timings`` output)."""


def generation_keys(action: Mapping[str, Any]) -> frozenset[str]:
    """The members of a generation line of the evaluate run of ``action``, by its version."""
    return TIMED_GENERATION_KEYS if action.get("recipe") == "evaluate@1" else GENERATION_KEYS
_SHOWN = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class Scored:
    """One evaluation re-scored: per task, in task order."""

    ids: list[str]
    families: list[str]
    variants: list[int]
    results: list[CheckResult]
    generations: list[dict[str, Any]]
    prompts: list[str]

    def correct(self) -> dict[str, bool]:
        return {i: r.correct for i, r in zip(self.ids, self.results, strict=True)}


def _problems(name: str, problems: list[str], **values: Any) -> Check:
    if not problems:
        return Check.passed(name, **values)
    more = f" (and {len(problems) - _SHOWN} more)" if len(problems) > _SHOWN else ""
    return Check.failed(name, f"{len(problems)} problem(s): " + "; ".join(problems[:_SHOWN])
                        + more, **values)


def rescore(objects: Objects, receipt: Mapping[str, Any],
            action: Mapping[str, Any]) -> tuple[Scored, list[str]]:
    """Re-score an evaluate receipt's generations; also returns shape problems found."""
    tasks_record, lines = task_lines(objects, action["inputs"]["tasks"])
    damaged = tasks_record.get("control") == "damaged"
    try:
        gens = objects.lines(receipt["outputs"]["generations"], "generations")
    except RecordParseError as exc:
        raise Unusable(receipt["outputs"]["generations"], exc.message) from None
    problems = []
    if [g.get("id") for g in gens] != [line["id"] for line in lines]:
        problems.append(f"generations cover {len(gens)} ids, the task set {len(lines)} "
                        "(or another order)")
    results, families, variants = [], [], []
    by_id = {g.get("id"): g for g in gens}
    keys = generation_keys(action)
    for number, line in enumerate(lines, start=1):
        g = by_id.get(line["id"])
        case = line["task"]
        families.append(case.get("family"))
        variants.append(case.get("variant"))
        if g is None or set(g) != keys or not isinstance(g["text"], str):
            problems.append(f"task {number}: no well-formed generation line")
            results.append(check_answer("", "{}"))
            continue
        try:
            task = Task(index=number - 1, case=case, prompt=line["prompt"], id=line["id"],
                        clean=compute_target(case))
            target = expected_target(task, damaged)
        except (TaskError, TypeError, KeyError, ValueError) as exc:
            raise Unusable(action["inputs"]["tasks"], f"task {number} has no usable case "
                           f"({exc})") from None
        results.append(check_answer(g["text"], target))
    scored = Scored(ids=[line["id"] for line in lines], families=families, variants=variants,
                    results=results, generations=[by_id.get(line["id"], {}) for line in lines],
                    prompts=[line["prompt"] for line in lines])
    return scored, problems


def answer_claims(scored: Scored) -> dict[str, Any]:
    by_family: dict[str, int] = {}
    by_variant: dict[str, int] = {}
    for family, variant, result in zip(scored.families, scored.variants, scored.results,
                                       strict=True):
        by_family[family] = by_family.get(family, 0) + result.correct
        by_variant[str(variant)] = by_variant.get(str(variant), 0) + result.correct
    return {
        "documents": len(scored.ids),
        "correct": sum(r.correct for r in scored.results),
        "valid_json_objects": sum(r.valid_json_object for r in scored.results),
        "correct_by_family": by_family,
        "correct_by_variant": by_variant,
    }


def check_lines(objects: Objects, checks_id: str, scored: Scored, name: str) -> Check:
    """The run's ``checks`` blob must say what the re-scoring says, line by line."""
    try:
        lines = objects.lines(checks_id, "checks")
    except RecordParseError as exc:
        return Check.failed(name, exc.message)
    expected = [{"id": i, "family": f, "variant": v, **r.to_dict()}
                for i, f, v, r in zip(scored.ids, scored.families, scored.variants,
                                      scored.results, strict=True)]
    problems = []
    if len(lines) != len(expected):
        problems.append(f"{len(lines)} lines for {len(expected)} tasks")
    for number, (got, want) in enumerate(zip(lines, expected, strict=False), start=1):
        if got != want:
            diff = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
            problems.append(f"line {number} ({want['id'][:12]}): {', '.join(diff)} differ")
    return _problems(name, problems, recomputed=sum(r.correct for r in scored.results))


def _rate_problem(number: int, tokens: int, timing: Mapping[str, Any]) -> str | None:
    """Why a line's ``tokens_per_second`` is not its ``tokens / seconds``, if it is not."""
    seconds, rate = timing["seconds"], timing["tokens_per_second"]
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) \
            or not math.isfinite(seconds) or seconds < 0:
        return f"line {number}: seconds is not a finite number of seconds"
    expected_rate = tokens / seconds if seconds > 0 else 0.0
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isclose(
            rate, expected_rate, rel_tol=1e-9, abs_tol=1e-12):
        return f"line {number}: tokens_per_second is not tokens / seconds"
    return None


def timing_checks(objects: Objects, timings_id: str, scored: Scored, name: str) -> Check:
    """``<name>.timings``: one ``{id, seconds, tokens_per_second}`` line per generation, in
    task order, its rate the generation's output tokens over its seconds. The seconds
    themselves are self-reported (docs/verify.md)."""
    try:
        lines = objects.lines(timings_id, "timings")
    except RecordParseError as exc:
        return Check.failed(name, exc.message)
    problems = []
    if [line.get("id") for line in lines] != scored.ids:
        problems.append(f"{len(lines)} lines that are not the {len(scored.ids)} task ids in "
                        "order")
    for number, (line, g) in enumerate(zip(lines, scored.generations, strict=False), start=1):
        if set(line) != TIMING_LINE_KEYS:
            problems.append(f"line {number}: members {sorted(line)} are not "
                            f"{sorted(TIMING_LINE_KEYS)}")
            continue
        out = g.get("output_ids")
        if isinstance(out, list) and (why := _rate_problem(number, len(out), line)):
            problems.append(why)
    return _problems(name, problems, recomputed=len(lines))


def generation_checks(scored: Scored, *, max_new_tokens: Any, tokenizer: Any, eos: set[int],
                      name: str, prompt_ids: Callable[[str], list[int]] | None = None,
                      keys: frozenset[str] = GENERATION_KEYS) -> list[Check]:
    """Each generation is internally consistent and, with a tokenizer, decodes to its text.
    ``keys`` are a line's members (``TIMED_GENERATION_KEYS``: it carries its timing, whose
    rate is then checked too)."""
    problems = []
    for number, g in enumerate(scored.generations, start=1):
        if set(g) != keys:
            continue  # reported by the re-scoring
        out = g["output_ids"]
        if not (isinstance(out, list) and all(isinstance(t, int) for t in out)):
            problems.append(f"line {number}: output_ids is not a list of token ids")
            continue
        ended = bool(out) and out[-1] in eos if eos else g["ended_with_eos"]
        if g["ended_with_eos"] is not ended:
            problems.append(f"line {number}: ended_with_eos contradicts its last token")
        limit = isinstance(max_new_tokens, int) and not g["ended_with_eos"] \
            and len(out) == max_new_tokens
        if g["hit_token_limit"] is not limit:
            problems.append(f"line {number}: hit_token_limit contradicts {len(out)} tokens")
        if isinstance(max_new_tokens, int) and len(out) > max_new_tokens:
            problems.append(f"line {number}: {len(out)} tokens exceed max_new_tokens")
        elif isinstance(max_new_tokens, int) and not ended and len(out) < max_new_tokens:
            # Generation stops at an end-of-turn (or eos) token or at max_new_tokens, nowhere
            # else (docs/format.md §6): anything shorter is a cut answer.
            problems.append(f"line {number}: stops after {len(out)} tokens, neither at an "
                            f"end-of-turn token nor at max_new_tokens ({max_new_tokens})")
        if keys >= TIMING_KEYS and (why := _rate_problem(number, len(out), g)):
            problems.append(why)
    checks = [_problems(f"{name}.generations", problems, recomputed=len(scored.generations))]
    if tokenizer is None:
        reason = ("the model's tokenizer.json is not available or not readable, so the texts "
                  "cannot be shown to decode from the output ids")
        return [*checks, Check.failed(f"{name}.decoded", reason),
                Check.failed(f"{name}.prompts", reason)]
    decoded, prompts = [], []
    for number, (g, prompt) in enumerate(zip(scored.generations, scored.prompts, strict=True),
                                         start=1):
        if set(g) != keys:
            continue
        try:
            visible = g["output_ids"][:-1] if g["ended_with_eos"] else g["output_ids"]
            if tokenizer.decode(visible, skip_special_tokens=True) != g["text"]:
                decoded.append(f"line {number}: text is not the decoding of output_ids")
            if prompt_ids is None:
                prompts.append(f"line {number}: no chat template to render the prompt with")
            elif g["prompt_ids"] != prompt_ids(prompt):
                prompts.append(f"line {number}: prompt_ids are not the task's prompt rendered "
                               "with the checkpoint's chat template")
        except (TypeError, ValueError, OverflowError) as exc:
            decoded.append(f"line {number}: ids cannot be decoded ({exc})")
        except VerifierError as exc:
            prompts.append(f"line {number}: {exc.message}")
    return [*checks, _problems(f"{name}.decoded", decoded, recomputed=len(scored.generations)), _problems(f"{name}.prompts", prompts, recomputed=len(scored.generations))]


def prompt_encoder(objects: Objects, model_id: str, tokenizer: Any
                   ) -> Callable[[str], list[int]] | None:
    """The token ids a model is given for a prompt, by the checkpoint's own chat template
    (``chat.render_prompt``) and tokenizer; None when the checkpoint has no usable template."""
    if tokenizer is None:
        return None
    try:
        files = objects.record_of(objects.record_of(model_id, "checkpoint/1")["files"], "tree/1")
        render = prompt_renderer(*template_source(objects, files["entries"]))
    except (Unusable, TemplateError):
        return None

    def encode(prompt: str) -> list[int]:
        return list(tokenizer.encode(render(prompt), add_special_tokens=False).ids)
    return encode


def load_tokenizer(objects: Objects, model_id: str) -> tuple[Any, set[int]]:
    """The ``tokenizers`` tokenizer of a checkpoint and its end-of-turn ids, or (None, {})."""
    try:
        files = objects.record_of(objects.record_of(model_id, "checkpoint/1")["files"], "tree/1")
        entry = files["entries"].get("tokenizer.json")
        if entry is None:
            return None, set()
        text = objects.bytes(entry["id"]).decode("utf-8")
    except (Unusable, UnicodeDecodeError):
        return None, set()
    from tokenizers import Tokenizer  # heavy; only when an evaluation is verified

    try:
        tokenizer = Tokenizer.from_str(text)
    except Exception:  # the Rust library raises bare Exception for a file it cannot parse
        return None, set()
    # The ids generation stops at, as the evaluate recipe takes them (docs/format.md §6.9):
    # the end-of-turn token its chat template closes a turn with, and the tokenizer's own eos
    # token (tokenizer_config.json). A template without one gives none: the recipe refuses it.
    eos: set[int] = set()
    with contextlib.suppress(TemplateError, Unusable):
        eos.add(end_of_turn(objects, files["entries"], tokenizer)["id"])
    entry = files["entries"].get("tokenizer_config.json")
    if entry is not None:
        try:
            config = parse_json(objects.bytes(entry["id"]), what="tokenizer_config.json")
        except (Unusable, RecordParseError):
            config = None
        token = config.get("eos_token") if isinstance(config, dict) else None
        if isinstance(token, dict):
            token = token.get("content")
        token_id = tokenizer.token_to_id(token) if isinstance(token, str) else None
        if token_id is not None:
            eos.add(token_id)
    return tokenizer, eos


def paired_claims(candidate: Scored, baseline: Scored) -> tuple[dict[str, Any], Any]:
    """wins, losses, accuracy_gain and exact_one_sided_p from two re-scored evaluations."""
    if candidate.ids != baseline.ids:
        raise InvalidArgument("baseline", "the baseline evaluated other task ids or another "
                              "order")
    result = paired_comparison(baseline.correct(), candidate.correct())
    return {"wins": result.wins, "losses": result.losses, "accuracy_gain": result.gain,
            "exact_one_sided_p": result.p}, result


def losses_of(objects: Objects, blob: str, probes: list[str]) -> dict[str, float]:
    """A retention blob's ``{id, loss}`` lines; ids must be the probes, in order."""
    try:
        lines = objects.lines(blob, "retention losses")
    except RecordParseError as exc:
        raise Unusable(blob, exc.message) from None
    if [line.get("id") for line in lines] != probes:
        raise Unusable(blob, "its ids are not the retention probes in order")
    losses = {}
    for line in lines:
        loss = line.get("loss")
        if isinstance(loss, bool) or not isinstance(loss, int | float) or not math.isfinite(loss):
            raise Unusable(blob, f"probe {line['id']} has no finite loss")
        losses[line["id"]] = float(loss)
    return losses


def retention_claims(base: dict[str, float], cand: dict[str, float]) -> dict[str, Any]:
    se: float | None
    upper: float | None
    if len(cand) >= 2:
        r = retention(base, cand)
        mean, se, upper, improved, worsened = r.mean, r.se, r.upper, r.improved, r.worsened
    else:  # no spread to estimate: the run reports no standard error and no upper bound
        changes = [cand[k] - base[k] for k in cand]
        mean = math.fsum(changes) / len(changes) if changes else 0.0
        se = upper = None
        improved = sum(1 for x in changes if x < 0)
        worsened = sum(1 for x in changes if x > 0)
    return {"retention_mean_change": mean, "retention_standard_error": se,
            "retention_upper": upper, "retention_improved": improved,
            "retention_worsened": worsened}


def contract_claim(gain: Fraction, p: Fraction, upper: float | None) -> dict[str, bool]:
    return {"gain": gain >= CONTRACT_MIN_GAIN, "p": p <= CONTRACT_MAX_P,
            "retention_upper": upper is not None
            and upper <= float(CONTRACT_MAX_RETENTION_UPPER)}
