"""``verify`` on train and serve receipts built by hand (the recipes' own runs are too slow
here): journals hash-chained as verifiers/training/schedule.py documents, documents per the seeded
schedule, the ranks' agreed digest computed with the training code's own function."""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from pathlib import Path
from typing import Any

import pytest
import rfc8785

from nscas.objects.digests import Digest
from nscas.recipes.train.schedule import document_schedule
from nscas.verifiers.core.results import Report
from nscas.verifiers.verify import exit_code, verify

from .conftest import Pipeline

STEPS, BATCH, SEED, WORLD = 5, 4, 7, 2


@pytest.fixture(scope="module")
def agreed_digest(pipeline: Pipeline, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The ranks' parameter digest of the seed model, by the training code itself."""
    from transformers import AutoModelForCausalLM

    from nscas.recipes.train.exchange import parameter_digest

    files = pipeline.record(pipeline.output("init", "checkpoint"))["files"]
    model_dir = tmp_path_factory.mktemp("seed-model") / "model"
    pipeline.store.materialise(Digest.parse(files), model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    return parameter_digest(model).hex()


def chain(entries: list[dict[str, Any]]) -> tuple[bytes, str | None]:
    """A journal blob: canonical lines, each with ``prev`` and ``hash``; and its head."""
    lines, prev = [], None
    for entry in entries:
        body = {**entry, "prev": prev}
        body["hash"] = hashlib.sha256(rfc8785.dumps(body)).hexdigest()
        lines.append(rfc8785.dumps(body) + b"\n")
        prev = body["hash"]
    return b"".join(lines), prev


def documents(p: Pipeline) -> list[str]:
    train = p.record(p.output("prepare", "train"))["ids"]
    replay = p.record(p.output("prepare", "replay"))["ids"]
    return train + replay


LR, WARMUP, GROUNDED, REPLAY = 3e-5, 8, 8, 1
"""STEPS < WARMUP: every update is a warmup step, lr·(s+1)/warmup (docs/experiment.md §3)."""
TARGETS_PER_DOCUMENT = 10
LOOP_SECONDS = [4.5, 4.75]
PEAK = [123456789, 123456000]


def parameter_bytes(p: Pipeline) -> int:
    """Bytes one update all-reduces on two ranks: 4 per FP32 parameter (the init claim)."""
    return 4 * p.record(p.receipt("init"))["claims"]["parameters"]["value"]


def rank_entries(p: Pipeline, rank: int, digest: str, *, schedule: list[list[int]] | None = None,
                 loss_shift: float = 0.0) -> list[dict[str, Any]]:
    ids = documents(p)
    replay = set(p.record(p.output("prepare", "replay"))["ids"])
    schedule = schedule or document_schedule(len(ids), steps=STEPS, batch=BATCH, seed=SEED)
    entries: list[dict[str, Any]] = [{"event": "agreed", "rank": rank, "step": 0,
                                      "parameters": digest}]
    for index, batch in enumerate(schedule):
        entries.append({
            "rank": rank, "step": index + 1, "loss": 2.5 - 0.1 * index + loss_shift,
            "targets": TARGETS_PER_DOCUMENT * len(batch),
            "weighted_targets": sum(TARGETS_PER_DOCUMENT * (REPLAY if ids[i] in replay
                                                            else GROUNDED) for i in batch),
            "lr": LR * (index + 1) / WARMUP,
            "grad_norm": 1.25, "documents": [ids[i] for i in batch], "indices": batch,
            "tokens": 500 + index, "seconds": 0.5 + 0.25 * index + 0.01 * rank,
            "bytes_communicated": parameter_bytes(p),
        })
    entries.append({"event": "agreed", "rank": rank, "step": STEPS, "parameters": digest})
    return entries


def claims_for(p: Pipeline, entries: list[dict[str, Any]]) -> dict[str, Any]:
    steps = [e for e in entries if "event" not in e]
    seconds = [e["seconds"] for e in steps]
    init = p.record(p.receipt("init"))["claims"]

    def claim(value: Any, verifier: str = "journals") -> dict[str, Any]:
        return {"value": value, "verifier": verifier}

    return {
        "updates": claim(len(steps)),
        "update_seconds": claim(sum(seconds)),
        "median_update_seconds": claim(statistics.median(seconds)),
        "bytes_communicated": claim(sum(e["bytes_communicated"] for e in steps)),
        "targets": claim(sum(e["targets"] for e in steps)),
        "weighted_targets": claim(sum(e["weighted_targets"] for e in steps)),
        "tokens_per_second": claim(sum(e["tokens"] for e in steps) / sum(seconds)),
        "first_loss": claim(steps[0]["loss"]),
        "last_loss": claim(steps[-1]["loss"]),
        "mean_loss": claim(math.fsum(e["loss"] for e in steps) / len(steps)),
        "loop_seconds": claim(LOOP_SECONDS[0]),
        "peak_memory_bytes": claim(PEAK),
        "parameter_digest": claim(init["parameter_digest"]["value"], "parameters"),
        "sha256_stream": claim(init["sha256_stream"]["value"], "parameters"),
    }


def train_receipt(p: Pipeline, per_rank: list[list[dict[str, Any]]] | list[bytes], *,
                  heads: list[str | None] | None = None,
                  claims: dict[str, Any] | None = None) -> str:
    """Store journals, an action and a receipt of a two-rank train run; returns the receipt."""
    store = p.store
    journals = []
    for rank, entries in enumerate(per_rank):
        blob, head = (entries, None) if isinstance(entries, bytes) else chain(entries)
        if heads is not None:
            head = heads[rank]
        journals.append(str(store.put_record({
            "nscas": "journal/1", "rank": rank, "world": WORLD,
            "entries": str(store.put_bytes(blob)), "head": head,
            "loop_seconds": LOOP_SECONDS[rank], "peak_memory_bytes": PEAK[rank]})))
    init = p.record(p.receipt("init"))
    init_action = p.record(init["action"])
    action = store.put_record({
        "nscas": "action/1", "recipe": "train@1", "code": init_action["code"],
        "inputs": {"base": p.output("init", "checkpoint"),
                   "documents": p.output("prepare", "train"),
                   "replay": p.output("prepare", "replay")},
        "params": {"schedule_seed": SEED, "steps": STEPS, "batch": BATCH, "world": WORLD,
                   "lr": LR, "warmup": WARMUP, "grounded_weight": GROUNDED,
                   "replay_weight": REPLAY, "device": "cpu", "checkpoint_steps": []}})
    first = per_rank[0] if not isinstance(per_rank[0], bytes) else []
    # The seed's weights stand in for the trained ones, as the last step's checkpoint.
    seed = p.record(p.output("init", "checkpoint"))
    final = store.put_record({**seed, "step": STEPS})
    info = store.info(final)
    steps = store.put_record({"nscas": "tree/1", "entries": {f"step-{STEPS:06d}": {
        "id": str(final), "size": info.size, "sha256": info.sha256}}})
    return str(store.put_record({
        "nscas": "receipt/1", "action": str(action), "environment": init["environment"],
        "outputs": {"checkpoint": str(final), "checkpoints": str(steps)}, "journals": journals,
        "claims": claims if claims is not None else claims_for(p, first),
        "started": "2026-01-01T00:00:00+00:00", "finished": "2026-01-01T00:01:00+00:00",
        "status": "succeeded"}))


def statuses(report: Report, receipt: str) -> dict[str, str]:
    prefix = f"train.{receipt[7:15]}."
    return {c.name.removeprefix(prefix): c.status for c in report.checks
            if c.name.startswith(prefix)}


def failed(report: Report, receipt: str) -> set[str]:
    return {name for name, status in statuses(report, receipt).items() if status == "failed"}


def test_an_honest_run_verifies(pipeline: Pipeline, agreed_digest: str) -> None:
    ranks = [rank_entries(pipeline, r, agreed_digest) for r in range(WORLD)]
    receipt = train_receipt(pipeline, ranks)
    report = verify(receipt, store=pipeline.store_dir)
    assert report.ok, [c for c in report.failures]
    seen = statuses(report, receipt)
    for name in ("journal0.lines", "journal0.chain", "journal0.head", "journal1.chain",
                 "journals.ranks", "journals.agree", "schedule", "journals.final_parameters",
                 "claims.updates", "claims.update_seconds", "claims.median_update_seconds",
                 "claims.bytes_communicated", "claims.tokens_per_second",
                 "claims.parameter_digest", "claims.sha256_stream", "claims.loop_seconds",
                 "claims.peak_memory_bytes", "claims.first_loss", "claims.last_loss",
                 "claims.mean_loss", "journals.lr", "journals.weighted_targets",
                 "journals.bytes_communicated", "environment"):
        assert seen[name] == "passed", name
    check = next(c for c in report.checks if c.name.endswith(".claims.update_seconds"))
    assert check.recomputed == pytest.approx(sum(0.5 + 0.25 * i for i in range(STEPS)))
    losses = {c.name.rpartition(".")[2]: c.recomputed for c in report.checks
              if c.name.endswith(("claims.first_loss", "claims.last_loss", "claims.mean_loss"))}
    assert losses == {"first_loss": 2.5, "last_loss": 2.5 - 0.1 * (STEPS - 1),
                      "mean_loss": math.fsum(2.5 - 0.1 * i for i in range(STEPS)) / STEPS}


@pytest.mark.parametrize(("claim", "forge"), [
    ("mean_loss", lambda v: math.nextafter(v, math.inf)),  # one ulp: the mean compares exactly
    ("first_loss", lambda v: v - 0.1),
    ("last_loss", lambda v: 2.5),
    ("mean_loss", lambda v: str(v)),
])
def test_a_forged_loss_claim_fails(pipeline: Pipeline, agreed_digest: str, claim: str,
                                   forge: Any) -> None:
    ranks = [rank_entries(pipeline, r, agreed_digest) for r in range(WORLD)]
    claims = claims_for(pipeline, ranks[0])
    claims[claim]["value"] = forge(claims[claim]["value"])
    receipt = train_receipt(pipeline, ranks, claims=claims)
    report = verify(receipt, store=pipeline.store_dir)
    assert failed(report, receipt) == {f"claims.{claim}"}
    assert exit_code(report) == 1


def test_journals_rewritten_to_other_losses_fail_the_loss_claims(
        pipeline: Pipeline, agreed_digest: str) -> None:
    """Every rank's journal rewritten consistently (chains rehashed, heads matching, the ranks
    agreeing) to losses the receipt does not claim: only the loss claims can tell."""
    honest = claims_for(pipeline, rank_entries(pipeline, 0, agreed_digest))
    ranks = [rank_entries(pipeline, r, agreed_digest, loss_shift=0.25) for r in range(WORLD)]
    receipt = train_receipt(pipeline, ranks, claims=honest)
    assert failed(verify(receipt, store=pipeline.store_dir), receipt) == {
        "claims.first_loss", "claims.last_loss", "claims.mean_loss"}
    # One step's loss alone: the mean still tells.
    ranks = [rank_entries(pipeline, r, agreed_digest) for r in range(WORLD)]
    for entries in ranks:
        entries[3]["loss"] += 1e-9
    receipt = train_receipt(pipeline, ranks, claims=honest)
    assert failed(verify(receipt, store=pipeline.store_dir), receipt) == {"claims.mean_loss"}


@pytest.mark.parametrize("loss", ["2.5", -0.5, None, True, 1.7e308])
def test_a_journal_loss_that_is_no_finite_number_fails_the_loss_claims(
        pipeline: Pipeline, agreed_digest: str, loss: Any) -> None:
    ranks = [rank_entries(pipeline, r, agreed_digest) for r in range(WORLD)]
    honest = claims_for(pipeline, ranks[0])
    for entries in ranks:
        for entry in entries[1:] if loss == 1.7e308 else entries[2:3]:
            if "event" not in entry:
                entry["loss"] = loss
    receipt = train_receipt(pipeline, ranks, claims=honest)
    report = verify(receipt, store=pipeline.store_dir)
    assert failed(report, receipt) == {"claims.first_loss", "claims.last_loss",
                                       "claims.mean_loss"}
    why = next(c.message for c in report.checks if c.name.endswith("claims.mean_loss"))
    assert ("overflows" if loss == 1.7e308 else "lack a finite loss >= 0") in why


def test_an_edited_journal_line_breaks_the_chain(pipeline: Pipeline, agreed_digest: str) -> None:
    ranks = [rank_entries(pipeline, r, agreed_digest) for r in range(WORLD)]
    blob, head = chain(ranks[1])
    lines = blob.split(b"\n")
    entry = json.loads(lines[2])
    entry["loss"] = 0.01  # edited after the fact, hash left as it was
    lines[2] = rfc8785.dumps(entry)
    receipt = train_receipt(pipeline, [ranks[0], b"\n".join(lines)], heads=[chain(ranks[0])[1],
                                                                            head])
    assert "journal1.chain" in failed(verify(receipt, store=pipeline.store_dir), receipt)


def test_ranks_that_disagree_fail(pipeline: Pipeline, agreed_digest: str) -> None:
    ranks = [rank_entries(pipeline, 0, agreed_digest),
             rank_entries(pipeline, 1, agreed_digest, loss_shift=0.5)]
    receipt = train_receipt(pipeline, ranks)
    assert failed(verify(receipt, store=pipeline.store_dir), receipt) == {"journals.agree"}


def test_documents_off_the_schedule_fail(pipeline: Pipeline, agreed_digest: str) -> None:
    schedule = document_schedule(len(documents(pipeline)), steps=STEPS, batch=BATCH, seed=SEED)
    schedule[1], schedule[2] = schedule[2], schedule[1]
    ranks = [rank_entries(pipeline, r, agreed_digest, schedule=schedule) for r in range(WORLD)]
    receipt = train_receipt(pipeline, ranks)
    report = verify(receipt, store=pipeline.store_dir)
    assert failed(report, receipt) == {"schedule"}
    message = next(c.message for c in report.checks if c.name.endswith(".schedule"))
    assert "step 2" in message and "step 3" in message


def test_wrong_heads_digests_and_claims_fail(pipeline: Pipeline, agreed_digest: str) -> None:
    ranks = [rank_entries(pipeline, r, "0" * 64) for r in range(WORLD)]
    claims = claims_for(pipeline, ranks[0])
    claims["update_seconds"]["value"] *= 1.5
    claims["bytes_communicated"]["value"] += 1
    receipt = train_receipt(pipeline, ranks, heads=[None, chain(ranks[1])[1]], claims=claims)
    assert failed(verify(receipt, store=pipeline.store_dir), receipt) == {
        "journal0.head", "journals.final_parameters", "claims.update_seconds",
        "claims.bytes_communicated"}


def test_a_missing_rank_fails(pipeline: Pipeline, agreed_digest: str) -> None:
    receipt = train_receipt(pipeline, [rank_entries(pipeline, 0, agreed_digest)])
    # The per-rank peak memory claim names two ranks: one journal cannot back it either.
    assert failed(verify(receipt, store=pipeline.store_dir), receipt) == {
        "journals.ranks", "claims.peak_memory_bytes"}


# --- serve -------------------------------------------------------------------------------

def serve_receipt(p: Pipeline, claims: dict[str, Any]) -> str:
    lines = []
    for i in range(4):
        lines.append({"request_id": f"run-{i}", "task_id": f"task-{i % 2}", "phase": "single",
                      "attempt": 0, "endpoint": "http://127.0.0.1:9000", "start": float(i),
                      "end": i + 0.5 + 0.1 * i, "ok": True, "status": 200, "error": None,
                      "output_ids": [1, 2, i % 2], "cached": False})
    log = "".join(json.dumps(x) + "\n" for x in lines).encode()
    init = p.record(p.receipt("init"))
    action = p.store.put_record({
        "nscas": "action/1", "recipe": "serve@1", "code": p.record(init["action"])["code"],
        "inputs": {"model": p.output("init", "checkpoint")}, "params": {"concurrency": 1}})
    return str(p.store.put_record({
        "nscas": "receipt/1", "action": str(action), "environment": init["environment"],
        "outputs": {"requests": str(p.store.put_bytes(log))}, "journals": [],
        "claims": {k: {"value": v, "verifier": "throughput"} for k, v in claims.items()},
        "started": "2026-01-01T00:00:00+00:00", "finished": "2026-01-01T00:01:00+00:00",
        "status": "succeeded"}))


def test_a_serve_receipt_without_its_evidence_proves_nothing(pipeline: Pipeline) -> None:
    """A request log whose run names no committed task set or replicas cannot show what was
    served: every claim fails, even those whose numbers the log alone would reproduce (the
    real three-phase logs are rechecked in test_tamper_bundles and test_tamper_classes)."""
    wall = 3 + 0.5 + 0.3
    honest = {"single.successes": 4, "single.requests_per_second": 4 / wall,
              "cache_hits": 0, "identical_outputs": True}
    receipt = serve_receipt(pipeline, {**honest, "speedup": 2.0})
    report = verify(receipt, store=pipeline.store_dir)
    prefix = f"serve.{receipt[7:15]}."
    bad = {c.name.removeprefix(prefix) for c in report.checks if c.status == "failed"}
    assert bad >= {"requests", *(f"claims.{c}" for c in honest), "claims.speedup"}
    assert exit_code(report) == 1


def test_the_schedule_check_uses_indices_not_positions(tmp_path: Path) -> None:
    # Same documents in another order within a step are another batch: not allowed.
    from nscas.verifiers.training.journals import schedule_check

    schedule = document_schedule(10, steps=2, batch=3, seed=SEED)
    steps = [{"step": s + 1, "indices": list(b), "documents": [f"d{i}" for i in b]}
             for s, b in enumerate(schedule)]
    ids = {f"d{i}" for i in range(10)}
    ok = schedule_check(steps, seed=SEED, documents=10, n_steps=2, batch=3, ids=ids, name="t")
    assert ok.status == "passed"
    steps[1] = {**steps[1], "indices": list(reversed(steps[1]["indices"]))}
    bad = schedule_check(steps, seed=SEED, documents=10, n_steps=2, batch=3, ids=ids, name="t")
    assert bad.status == "failed" and "step 2" in bad.message
