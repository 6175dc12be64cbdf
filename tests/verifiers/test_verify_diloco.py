"""``verify`` on a DiLoCo train receipt built by hand (sync = "diloco", docs/experiment.md
§3.13): each rewritten field of the journals fails exactly the check that recomputes it, even
when the tamperer re-chains the journals and recomputes every claim from them."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Any

import pytest

from nscas.recipes.train.schedule import document_schedule
from nscas.verifiers.verify import verify

from .conftest import Pipeline
from .test_verify_train import (  # noqa: F401 - agreed_digest is a fixture
    GROUNDED,
    LOOP_SECONDS,
    LR,
    PEAK,
    REPLAY,
    TARGETS_PER_DOCUMENT,
    WARMUP,
    agreed_digest,
    chain,
    documents,
    failed,
    parameter_bytes,
    statuses,
)

STEPS, H, BATCH, SEED, WORLD = 4, 2, 4, 7, 2


def diloco_entries(p: Pipeline, rank: int, digest: str) -> list[dict[str, Any]]:
    ids = documents(p)
    replay = set(p.record(p.output("prepare", "replay"))["ids"])

    def weighted(batch: list[int]) -> int:
        return sum(TARGETS_PER_DOCUMENT * (REPLAY if ids[i] in replay else GROUNDED)
                   for i in batch)

    schedule = document_schedule(len(ids), steps=STEPS, batch=BATCH, seed=SEED)
    entries: list[dict[str, Any]] = [{"event": "agreed", "rank": rank, "step": 0,
                                      "parameters": digest}]
    for index, batch in enumerate(schedule):
        step = index + 1
        entries.append({
            "rank": rank, "step": step, "loss": 2.5 - 0.1 * index + 0.01 * rank,
            "targets": TARGETS_PER_DOCUMENT * len(batch), "weighted_targets": weighted(batch),
            "lr": LR * step / WARMUP, "grad_norm": 1.25 + rank, "documents": [ids[i] for i in batch],
            "indices": batch, "tokens": 500 + index, "seconds": 0.5 + 0.25 * index,
            "bytes_communicated": 0, "local_indices": batch[rank::WORLD],
            "local_weighted_targets": weighted(batch[rank::WORLD]),
        })
        if step % H == 0:
            entries.append({"event": "outer", "rank": rank, "step": step, "outer_step": step // H,
                            "pseudo_gradient_norm": 0.125 * step, "bytes_sent": parameter_bytes(p),
                            "seconds": 0.0625, "parameters": digest})
    entries.append({"event": "agreed", "rank": rank, "step": STEPS, "parameters": digest})
    return entries


def claims_for(p: Pipeline, entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Every journals claim recomputed from rank 0's entries, as a consistent tamperer would."""
    steps = [e for e in entries if "event" not in e]
    outer = [e for e in entries if e.get("event") == "outer"]
    seconds = [e["seconds"] for e in steps]
    total = sum(seconds) + sum(e["seconds"] for e in outer)
    init = p.record(p.receipt("init"))["claims"]

    def claim(value: Any, verifier: str = "journals") -> dict[str, Any]:
        return {"value": value, "verifier": verifier}

    return {
        "updates": claim(len(steps)), "update_seconds": claim(total),
        "median_update_seconds": claim(statistics.median(seconds)),
        "bytes_communicated": claim(sum(e["bytes_communicated"] for e in steps)
                                    + sum(e["bytes_sent"] for e in outer)),
        "targets": claim(sum(e["targets"] for e in steps)),
        "weighted_targets": claim(sum(e["weighted_targets"] for e in steps)),
        "tokens_per_second": claim(sum(e["tokens"] for e in steps) / total),
        "outer_steps": claim(len(outer)),
        "first_loss": claim(steps[0]["loss"]), "last_loss": claim(steps[-1]["loss"]),
        "mean_loss": claim(math.fsum(e["loss"] for e in steps) / len(steps)),
        "loop_seconds": claim(LOOP_SECONDS[0]), "peak_memory_bytes": claim(PEAK),
        "parameter_digest": claim(init["parameter_digest"]["value"], "parameters"),
        "sha256_stream": claim(init["sha256_stream"]["value"], "parameters"),
    }


def diloco_receipt(p: Pipeline, per_rank: list[list[dict[str, Any]]], *,
                   claims: dict[str, Any] | None = None, **params: Any) -> str:
    store = p.store
    journals = []
    for rank, entries in enumerate(per_rank):
        blob, head = chain(entries)
        journals.append(str(store.put_record({
            "nscas": "journal/1", "rank": rank, "world": WORLD,
            "entries": str(store.put_bytes(blob)), "head": head,
            "loop_seconds": LOOP_SECONDS[rank], "peak_memory_bytes": PEAK[rank]})))
    init = p.record(p.receipt("init"))
    action = store.put_record({
        "nscas": "action/1", "recipe": "train@1", "code": p.record(init["action"])["code"],
        "inputs": {"base": p.output("init", "checkpoint"),
                   "documents": p.output("prepare", "train"),
                   "replay": p.output("prepare", "replay")},
        "params": {"schedule_seed": SEED, "steps": STEPS, "batch": BATCH, "world": WORLD,
                   "lr": LR, "warmup": WARMUP, "grounded_weight": GROUNDED,
                   "replay_weight": REPLAY, "device": "cpu", "checkpoint_steps": [],
                   "sync": "diloco", "inner_steps": H, "outer_lr": 0.7, "outer_momentum": 0.9,
                   **params}})
    seed = p.record(p.output("init", "checkpoint"))
    final = store.put_record({**seed, "step": STEPS})
    info = store.info(final)
    tree = store.put_record({"nscas": "tree/1", "entries": {f"step-{STEPS:06d}": {
        "id": str(final), "size": info.size, "sha256": info.sha256}}})
    return str(store.put_record({
        "nscas": "receipt/1", "action": str(action), "environment": init["environment"],
        "outputs": {"checkpoint": str(final), "checkpoints": str(tree)}, "journals": journals,
        "claims": claims if claims is not None else claims_for(p, per_rank[0]),
        "started": "2026-01-01T00:00:00+00:00", "finished": "2026-01-01T00:01:00+00:00",
        "status": "succeeded"}))


DILOCO_CHECKS = ("journals.diloco.schedule", "journals.outer", "journals.outer.agree",
                 "journals.outer.bytes", "journals.agree", "journals.bytes_communicated",
                 "schedule", "journals.final_parameters", "claims.outer_steps",
                 "claims.bytes_communicated", "claims.update_seconds", "claims.first_loss",
                 "claims.last_loss", "claims.mean_loss", "params")


def test_an_honest_diloco_run_verifies(pipeline: Pipeline, agreed_digest: str) -> None:  # noqa: F811
    ranks = [diloco_entries(pipeline, r, agreed_digest) for r in range(WORLD)]
    receipt = diloco_receipt(pipeline, ranks)
    report = verify(receipt, store=pipeline.store_dir)
    assert report.ok, [c for c in report.failures]
    seen = statuses(report, receipt)
    for name in DILOCO_CHECKS:
        assert seen[name] == "passed", name
    bytes_check = next(c for c in report.checks if c.name.endswith(".journals.outer.bytes"))
    assert bytes_check.recomputed == parameter_bytes(pipeline)  # numel x 4 (FP32 weights)


Edit = Callable[[list[list[dict[str, Any]]]], None]


def _entries(ranks: list[list[dict[str, Any]]], rank: int, *, event: str | None = None,
             step: int) -> dict[str, Any]:
    return next(e for e in ranks[rank] if e.get("event") == event and e.get("step") == step)


def _swap_local(ranks: list[list[dict[str, Any]]]) -> None:
    entry = _entries(ranks, 1, step=3)
    entry["local_indices"] = list(reversed(entry["local_indices"]))


def _more_local_targets(ranks: list[list[dict[str, Any]]]) -> None:
    _entries(ranks, 0, step=2)["local_weighted_targets"] += 1


def _other_outer_digest(ranks: list[list[dict[str, Any]]]) -> None:
    _entries(ranks, 1, event="outer", step=2)["parameters"] = "ab" * 32


def _other_final_digest(ranks: list[list[dict[str, Any]]]) -> None:
    for rank in ranks:
        next(e for e in rank if e.get("event") == "outer" and e["step"] == STEPS)[
            "parameters"] = "cd" * 32


def _other_norm(ranks: list[list[dict[str, Any]]]) -> None:
    _entries(ranks, 1, event="outer", step=2)["pseudo_gradient_norm"] = 9.0


def _fewer_bytes(ranks: list[list[dict[str, Any]]]) -> None:
    for rank in ranks:
        for e in rank:
            if e.get("event") == "outer":
                e["bytes_sent"] //= 2


def _drop_outer(ranks: list[list[dict[str, Any]]]) -> None:
    for r, rank in enumerate(ranks):
        ranks[r] = [e for e in rank if not (e.get("event") == "outer" and e["step"] == 2)]


def _renumber_outer(ranks: list[list[dict[str, Any]]]) -> None:
    for rank in ranks:
        next(e for e in rank if e.get("event") == "outer" and e["step"] == 2)["outer_step"] = 7


def _inner_bytes(ranks: list[list[dict[str, Any]]]) -> None:
    for rank in ranks:
        next(e for e in rank if "event" not in e)["bytes_communicated"] = 8


def _nan_norm(ranks: list[list[dict[str, Any]]]) -> None:
    for rank in ranks:
        _entries([rank], 0, event="outer", step=2)["pseudo_gradient_norm"] = -1.0


@pytest.mark.parametrize(("edit", "expected"), [
    (_swap_local, {"journals.diloco.schedule"}),
    (_more_local_targets, {"journals.diloco.schedule"}),
    (_other_outer_digest, {"journals.outer.agree"}),
    (_other_final_digest, {"journals.outer.agree"}),
    (_other_norm, {"journals.outer.agree"}),
    (_fewer_bytes, {"journals.outer.bytes"}),
    (_drop_outer, {"journals.outer"}),
    (_renumber_outer, {"journals.outer"}),
    (_inner_bytes, {"journals.bytes_communicated"}),
    (_nan_norm, {"journals.outer"}),
])
def test_each_rewritten_field_fails(pipeline: Pipeline, agreed_digest: str,  # noqa: F811
                                    edit: Edit, expected: set[str]) -> None:
    ranks = [diloco_entries(pipeline, r, agreed_digest) for r in range(WORLD)]
    edit(ranks)
    receipt = diloco_receipt(pipeline, ranks)  # claims recomputed from the rewritten journal
    assert failed(verify(receipt, store=pipeline.store_dir), receipt) == expected


def test_a_claimed_outer_step_count_is_rechecked(pipeline: Pipeline, agreed_digest: str  # noqa: F811
                                                 ) -> None:
    ranks = [diloco_entries(pipeline, r, agreed_digest) for r in range(WORLD)]
    claims = claims_for(pipeline, ranks[0])
    claims["outer_steps"]["value"] += 1
    receipt = diloco_receipt(pipeline, ranks, claims=claims)
    assert failed(verify(receipt, store=pipeline.store_dir), receipt) == {"claims.outer_steps"}


def test_the_loss_claimed_is_rank_0s_own(pipeline: Pipeline, agreed_digest: str  # noqa: F811
                                        ) -> None:
    """A DiLoCo rank journals its own objective; the claims are rank 0's, not another's."""
    ranks = [diloco_entries(pipeline, r, agreed_digest) for r in range(WORLD)]
    claims = {**claims_for(pipeline, ranks[0]),
              **{k: v for k, v in claims_for(pipeline, ranks[1]).items() if k.endswith("_loss")}}
    receipt = diloco_receipt(pipeline, ranks, claims=claims)
    assert failed(verify(receipt, store=pipeline.store_dir), receipt) == {
        "claims.first_loss", "claims.last_loss", "claims.mean_loss"}


def test_checkpoint_steps_off_the_outer_boundary_fail_the_params(
        pipeline: Pipeline, agreed_digest: str) -> None:  # noqa: F811
    ranks = [diloco_entries(pipeline, r, agreed_digest) for r in range(WORLD)]
    receipt = diloco_receipt(pipeline, ranks, checkpoint_steps=[1])
    assert "params" in failed(verify(receipt, store=pipeline.store_dir), receipt)
