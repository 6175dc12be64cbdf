"""Recipe ``prepare``: the grounded task sets, the damaged control, replay and retention."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from nscas.errors import InvalidInput
from nscas.objects.digests import Digest
from nscas.recipes.common import tasks as T
from nscas.recipes.common.checker import check
from nscas.recipes.common.conversations import (
    Kind,
    conversations_jsonl,
    standin_conversations,
    validate_conversations,
)
from nscas.runs.recipe import Claim, InputSpec, Recipe, RecipeResult, RunContext
from nscas.store.protocol import ObjectReader, ObjectStore

VERSION = "1"


@dataclass(frozen=True, slots=True, kw_only=True)
class Counts:
    """Tasks per role; generated in the order test, dev, train."""

    test: int = 256
    """Final test tasks (all four wording variants)."""
    dev: int = 64
    """Development tasks (variants 0 and 1)."""
    train: int = 768
    """Training tasks (variants 0 and 1)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PrepareParams:
    seed: int = T.DEFAULT_SEED
    """Task seed: with the wordings it fixes every case, prompt and identity."""
    counts: Counts = field(default_factory=Counts)
    """Tasks per role."""
    grounded_weight: int = 8
    """Loss weight of grounded training documents (1..16)."""
    replay_weight: int = 1
    """Loss weight of replay conversations (1..16)."""
    max_length: int = 1024
    """Longest document in tokens; checked here when a tokenizer is given, else by train."""
    replay_count: int = 256
    """Size of the generated stand-in replay set (used only without a replay input)."""
    retention_count: int = 128
    """Size of the generated stand-in retention set (used only without a retention input)."""
    standin_seed: int = 20260913
    """Seed of the stand-in conversations."""

    def validate(self) -> str | None:
        for name in ("grounded_weight", "replay_weight"):
            if not 1 <= getattr(self, name) <= 16:
                return f"{name} must be between 1 and 16, got {getattr(self, name)}"
        for role in T.ROLES:
            if getattr(self.counts, role) < 0:
                return f"counts.{role} must not be negative"
        if self.max_length < 1 or self.replay_count < 0 or self.retention_count < 0:
            return "max_length must be positive and stand-in counts not negative"
        return None


def run(ctx: RunContext) -> RecipeResult:
    p: PrepareParams = ctx.params
    store = ctx.store
    if "wordings" in ctx.inputs:
        wordings_id = ctx.inputs["wordings"]
        wordings = T.parse_wordings_bytes(store.get_bytes(wordings_id))
    else:
        wordings_bytes = T.default_wordings_bytes()
        wordings = T.parse_wordings_bytes(wordings_bytes)
        wordings_id = store.put_bytes(wordings_bytes)
    counts = {role: getattr(p.counts, role) for role in T.ROLES}
    ctx.progress.start(None, "generating tasks")
    roles = T.generate_all(counts, p.seed, wordings)
    damaged = T.damaged_tasks(roles["train"])
    changed = [d for d, t in zip(damaged, roles["train"], strict=True) if d.target != t.target]
    if any(check(d.target, t.target).correct for d, t in zip(damaged, roles["train"], strict=True) if d is not t):
        raise InvalidInput("a damaged target passes the checker")  # damage_target guards this too
    outputs: dict[str, Any] = {}
    common = {"seed": p.seed, "wordings": str(wordings_id)}
    for role in T.ROLES:
        weight = p.grounded_weight if role == "train" else 1
        outputs[role] = _tasks(store, role, roles[role], weight, common)
    outputs["damaged"] = _tasks(store, "train", damaged, p.grounded_weight, {**common, "control": "damaged"})
    wanted: tuple[tuple[Kind, int], ...] = (("replay", p.replay_count),
                                           ("retention", p.retention_count))
    for kind, count in wanted:
        outputs[kind] = _conversations(ctx, kind, count, p)
    outputs["prepared"] = store.put_record({
        "nscas": "commitment/1", "purpose": "prepared inputs of the cooperative-learning experiment",
        "subjects": {**{k: str(v) for k, v in outputs.items()}, "wordings": str(wordings_id)},
        "previous": None,
    })
    claims: dict[str, Claim] = {
        "counts": Claim(value={r: len(roles[r]) for r in T.ROLES}, verifier="tasks"),
        "counts_by_family": Claim(value={r: T.counts_by(roles[r], "family") for r in T.ROLES}, verifier="tasks"),
        "counts_by_variant": Claim(value={r: T.counts_by(roles[r], "variant") for r in T.ROLES}, verifier="tasks"),
        "damaged_count": Claim(value=len(changed), verifier="tasks"),
        "damaged_fail_checker": Claim(value=True, verifier="tasks"),
        "replay_count": Claim(value=store.get_record(outputs["replay"])["count"], verifier="tasks"),
        "retention_count": Claim(value=store.get_record(outputs["retention"])["count"], verifier="tasks"),
    }
    if "tokenizer" in ctx.inputs:
        claims.update(_target_counts(ctx, roles, damaged, outputs))
    ctx.progress.finish()
    return RecipeResult(outputs=outputs, claims=claims)


def _tasks(store: ObjectStore, role: str, tasks: list[T.Task], weight: int,
           extra: dict[str, Any]) -> Digest:
    records = store.put_bytes(T.records_jsonl(tasks, weight))
    return store.put_record({"nscas": "tasks/1", "role": role, "records": str(records),
                             "count": len(tasks), "ids": [t.id for t in tasks], **extra})


def _conversations(ctx: RunContext, kind: Kind, count: int, p: PrepareParams) -> Digest:
    store = ctx.store
    weight = p.replay_weight if kind == "replay" else 1
    if kind in ctx.inputs:
        records = validate_conversations(store.get_bytes(ctx.inputs[kind]))
        standin = False
    else:
        records = standin_conversations(kind, count, p.standin_seed)
        standin = True
    lines = [{**r, "weight": weight} for r in records]
    blob = store.put_bytes(conversations_jsonl(lines))
    record: dict[str, Any] = {"nscas": "tasks/1", "role": kind, "records": str(blob), "count": len(lines),
                              "ids": [r["id"] for r in records], "standin": standin}
    if standin:
        record["note"] = (f"stand-in: {count} synthetic conversations generated by nscas "
                          f"(seed {p.standin_seed}); not the published corpus")
    return store.put_record(record)


def _target_counts(ctx: RunContext, roles: dict[str, list[T.Task]], damaged: list[T.Task],
                   outputs: dict[str, Any]) -> dict[str, Claim]:
    """Tokenised target counts per training arm, and the max_length check (needs a tokenizer)."""
    from transformers import AutoTokenizer

    from nscas.recipes.common.tokenise import encode_document

    p: PrepareParams = ctx.params
    tok_dir = ctx.workdir / "tokenizer"
    ctx.store.materialise(ctx.inputs["tokenizer"], tok_dir)
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    replay = [json.loads(line) for line in ctx.store.get_bytes(
        _records_id(ctx.store, outputs["replay"])).decode().splitlines()]
    claims = {}
    for arm, tasks in (("clean", roles["train"]), ("damaged", damaged)):
        docs = [t.to_record(p.grounded_weight) for t in tasks] + replay
        encoded = [encode_document(tokenizer, d, max_length=p.max_length) for d in docs]
        claims[f"{arm}.targets"] = Claim(value=sum(e.targets for e in encoded), verifier="tasks")
        claims[f"{arm}.weighted_targets"] = Claim(
            value=sum(e.targets * d["weight"] for e, d in zip(encoded, docs, strict=True)), verifier="tasks")
    for role in ("test", "dev"):
        for t in roles[role]:
            encode_document(tokenizer, t.to_record(1), max_length=p.max_length)
    return claims


def _records_id(store: ObjectReader, tasks_id: Digest) -> Digest:
    return Digest.parse(store.get_record(tasks_id)["records"])


RECIPE = Recipe(
    name="prepare",
    version=VERSION,
    params=PrepareParams,
    inputs={
        "wordings": InputSpec(kind="blob", required=False, doc="wording object (JSON)"),
        "replay": InputSpec(kind="blob", required=False, doc="replay conversations (JSONL)"),
        "retention": InputSpec(kind="blob", required=False, doc="retention probes (JSONL)"),
        "tokenizer": InputSpec(kind="tree/1", required=False, doc="tokenizer, to count targets"),
    },
    outputs=("test", "dev", "train", "damaged", "replay", "retention", "prepared"),
    run=run,
    doc="Grounded tasks (docs/experiment.md §1), the damaged control, replay and retention sets.",
)
