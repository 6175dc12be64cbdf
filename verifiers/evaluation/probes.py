"""Recipe ``probes`` rechecked: the published prompt set, the structure of its outputs, and
every answer's decoding (docs/experiment.md §2.2).

The prompts must be the published set, byte for byte: its SHA-256 is pinned here
(``PROMPTS_SHA256``), so a run that answered other prompts cannot pass. The answers are the
seed model's greedy output: only a model run reproduces the output ids (not rechecked,
needs a model), but with the checkpoint's own tokenizer each prompt's ids, each text's
decoding, the end-of-turn flags and the retention set built from them are all rechecked.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from ..core.errors import VerifierError
from ..core.results import Check
from ..records.closure import Objects
from .scoring import (
    TIMED_GENERATION_KEYS,
    Scored,
    generation_checks,
    load_tokenizer,
    prompt_encoder,
)

PROMPTS_SHA256 = "3a9f3be2c07a8b03a3935aa62292fbe502679f72b3b96f35527838f38d9fc0d2"
"""SHA-256 of the published prompt set (the recipe's ``probes.json``, version 1)."""


class ProbesError(VerifierError):
    """An output of a probes run is not what the recipe writes."""


def _jsonl(data: bytes, what: str) -> list[Any]:
    try:
        text = data.decode("utf-8")
        if text and not text.endswith("\n"):
            raise ValueError("the last line lacks its newline")
        return [json.loads(line) for line in text.split("\n")[:-1]]
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProbesError(f"{what} is not JSON lines ({exc})") from None


def published_prompts(data: bytes) -> list[tuple[str, str]]:
    """(id, prompt) of the prompt set; raises ``ProbesError`` unless it is the published one."""
    digest = hashlib.sha256(data).hexdigest()
    if digest != PROMPTS_SHA256:
        raise ProbesError(f"the prompt set has SHA-256 {digest}, not the published "
                          f"{PROMPTS_SHA256}")
    return [(p["id"], p["prompt"]) for p in json.loads(data)["prompts"]]


def retention_lines(prompts: list[tuple[str, str]], texts: list[str]) -> tuple[bytes, list[str]]:
    """The retention blob the recipe writes from the answers, and the dropped probe ids."""
    lines, dropped = [], []
    for (pid, prompt), text in zip(prompts, texts, strict=True):
        if not text.strip():
            dropped.append(pid)
            continue
        record = {"id": pid, "messages": [{"role": "user", "content": prompt},
                                          {"role": "assistant", "content": text}]}
        lines.append(json.dumps(record, separators=(",", ":")).encode() + b"\n")
    return b"".join(lines), dropped


def check_probes(objects: Objects, *, name: str, params: Mapping[str, Any],
                 inputs: Mapping[str, str], outputs: Mapping[str, str],
                 values: dict[str, Any]) -> list[Check]:
    """Checks of a probes run; fills ``values`` with the recomputed claims."""
    prompts = published_prompts(objects.bytes(outputs["prompts"]))
    checks = [Check.passed(f"{name}.prompts", recomputed=PROMPTS_SHA256)]
    generations = _jsonl(objects.bytes(outputs["generations"]), "generations")
    ids = [g.get("id") if isinstance(g, dict) else None for g in generations]
    if ids != [pid for pid, _ in prompts]:
        checks.append(Check.failed(f"{name}.generations.ids", "the generations are not one per "
                                   "published prompt, in order", recomputed=len(prompts)))
        return checks
    tokenizer, eos = load_tokenizer(objects, inputs["model"])
    scored = Scored(ids=ids, families=[], variants=[], results=[], generations=generations,
                    prompts=[p for _, p in prompts])
    checks.extend(generation_checks(
        scored, max_new_tokens=params.get("max_new_tokens"), tokenizer=tokenizer, eos=eos,
        name=f"{name}.answers", prompt_ids=prompt_encoder(objects, inputs["model"], tokenizer),
        keys=TIMED_GENERATION_KEYS))
    texts = [g.get("text") for g in generations]
    if not all(isinstance(t, str) for t in texts):
        raise ProbesError("a generation's text is not a string")
    expected, dropped = retention_lines(prompts, texts)
    checks.append(Check.verdict(
        f"{name}.retention", objects.bytes(outputs["retention"]) == expected,
        recomputed=len(prompts) - len(dropped),
        message="the retention set is not the published prompts with the generated answers"))
    checks.append(Check.skipped(
        f"{name}.answers.output_ids", "the answers are the seed model's greedy output: only "
        "a model run reproduces them (rerun the probes to check)", needs="model"))
    values.update({"probes": len(prompts) - len(dropped), "dropped": dropped,
                   "ended_with_eos": sum(g.get("ended_with_eos") is True for g in generations),
                   "hit_token_limit": sum(g.get("hit_token_limit") is True
                                          for g in generations)})
    return checks
