"""Training: per-arm numbers recomputed from the per-rank journals (docs/experiment.md §3).

Each ``journal/1`` record links a hash-chained JSONL blob; the chain is checked by the train
recipe's own reader, the record's ``head`` must be the chain's last hash, and the steps that
count are the train recipe's ``effective_steps`` (a resumed run's redone steps drop out).
Headline numbers are rank 0's, as each rank times its own updates; every rank's are listed.
Every rank's loss, learning rate and gradient norm by effective step are listed under
``ranks`` (the training figure draws them). Loop seconds and peak memory are no journal
entry's: they are shown as the run measured them (its journal/1 records, which its receipt
claims), under ``claimed_only``, and never feed a comparison of retained data.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nscas.digests import Digest
from nscas.errors import RecipeError
from nscas.recipes.train.journal import effective_steps, read_journal

from .audit import Audit
from .evidence import BASELINE, Evidence, Run, documents_kind

CLAIMED_ONLY = ("loop_seconds", "peak_memory_bytes")
CLAIMED_ONLY_NOTE = ("self-reported: loop wall time and peak memory as the train run measured "
                     "them; no journal entry records them, so this report cannot recompute them")
SERIES = {"loss_by_step": "loss", "lr_by_step": "lr", "grad_norm_by_step": "grad_norm"}
"""Per-rank series by effective step, from these journal entry members."""


def _rank_steps(store: Any, run: Run, journal_id: Digest, scratch: Path
                ) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """(journal record, its effective step entries, all its entries), chain checked."""
    record = store.get_record(journal_id)
    if record.get("nscas") != "journal/1":
        raise RecipeError(f"{run.name}: {journal_id} is not a journal/1 record")
    path = scratch / f"{run.receipt.hex}-{journal_id.hex}.jsonl"
    path.write_bytes(store.get_bytes(Digest.parse(record["entries"])))
    try:
        state = read_journal(path)
    except RecipeError as exc:
        raise RecipeError(f"{run.name}: journal {journal_id} is damaged: {exc.message}") from None
    if state.dropped_partial or state.head != record["head"]:
        raise RecipeError(f"{run.name}: journal {journal_id} names head {record['head']}, but its "
                          f"entries end at {state.head}"
                          + (" with a torn last line" if state.dropped_partial else ""))
    return record, effective_steps(state.entries), list(state.entries)


def rank_numbers(steps: list[dict[str, Any]], entries: list[dict[str, Any]]) -> dict[str, Any]:
    """One rank's totals over its effective steps."""
    seconds = [e["seconds"] for e in steps]
    update_seconds = sum(seconds)
    tokens = sum(e["tokens"] for e in steps)
    agreed = [e for e in entries if e.get("event") == "agreed"]
    return {
        "updates": len(steps),
        "update_seconds": update_seconds,
        "median_update_seconds": statistics.median(seconds) if seconds else 0.0,
        "bytes_communicated": sum(e["bytes_communicated"] for e in steps),
        "targets": sum(e["targets"] for e in steps),
        "weighted_targets": sum(e["weighted_targets"] for e in steps),
        "tokens": tokens,
        "tokens_per_second": tokens / update_seconds if update_seconds else 0.0,
        "final_parameters": agreed[-1]["parameters"] if agreed else None,
        **{key: [e[member] for e in steps] for key, member in SERIES.items()},
    }


def train_arm(store: Any, ev: Evidence, arm: str, run: Run, scratch: Path,
              audit: Audit) -> dict[str, Any]:
    world = int(run.params.get("world", 1))
    ranks: dict[int, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
    for text in run.record["journals"]:
        record, steps, entries = _rank_steps(store, run, Digest.parse(text), scratch)
        if record["world"] != world or record["rank"] in ranks:
            raise RecipeError(f"{run.name}: journal {text} is rank {record['rank']} of "
                              f"{record['world']}, which does not fit a run of world {world}")
        ranks[record["rank"]] = (steps, entries)
    if sorted(ranks) != list(range(world)):
        raise RecipeError(f"{run.name}: a run of world {world} needs one journal per rank; the "
                          f"receipt holds journals of ranks {sorted(ranks)}")
    numbers = {rank: rank_numbers(*ranks[rank]) for rank in sorted(ranks)}
    step_lists = {rank: [e["step"] for e in ranks[rank][0]] for rank in ranks}
    if any(s != list(range(1, len(s) + 1)) or s != step_lists[0] for s in step_lists.values()):
        raise RecipeError(f"{run.name}: the ranks' journals do not hold the same steps 1..n")
    finals = {n["final_parameters"] for n in numbers.values()}
    head = numbers[0]
    totals = {k: v for k, v in head.items() if k != "final_parameters" and k not in SERIES}
    checkpoint = run.output("checkpoint")
    params_id = store.get_record(checkpoint)["params"]
    claims = run.claims
    summary: dict[str, Any] = {
        "receipt": str(run.receipt),
        "world": world,
        "device": run.params.get("device", "cpu"),
        "hosts": int(run.params.get("nnodes", 1)),
        "documents": documents_kind(ev.prepare, run),
        "base": str(run.input("base")),
        "from_seed": run.input("base") == ev.evaluate[BASELINE].input("model"),
        "checkpoint": str(checkpoint),
        "parameter_digest": params_id,
        "parameters_agree": len(finals) == 1 and None not in finals,
        "final_parameters_blake3": head["final_parameters"],
        **totals,
        "bytes_per_update": head["bytes_communicated"] / head["updates"] if head["updates"] else 0,
        "first_loss": ranks[0][0][0]["loss"] if ranks[0][0] else None,
        "last_loss": ranks[0][0][-1]["loss"] if ranks[0][0] else None,
        "loss_by_step": [e["loss"] for e in ranks[0][0]],
        "ranks": [{"rank": r, **{k: v for k, v in n.items() if k != "final_parameters"}}
                  for r, n in numbers.items()],
        "claimed_only": {**{k: claims.get(k) for k in CLAIMED_ONLY}, "note": CLAIMED_ONLY_NOTE},
    }
    audit.claim(run, "parameter_digest", params_id)
    for name in ("updates", "update_seconds", "median_update_seconds", "bytes_communicated",
                 "targets", "weighted_targets", "tokens_per_second"):
        audit.claim(run, name, head[name])
    return summary


def ratios(arms: Mapping[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each clean multi-rank arm against each clean one-rank arm: how much slower, how much more."""
    out = []
    for pair, p in arms.items():
        for single, s in arms.items():
            if not (p["documents"] == s["documents"] == "clean" and p["world"] > 1
                    and s["world"] == 1):
                continue
            loop_p, loop_s = p["claimed_only"]["loop_seconds"], s["claimed_only"]["loop_seconds"]
            out.append({
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
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def training_section(store: Any, ev: Evidence, scratch: Path,
                     audit: Audit) -> dict[str, Any] | None:
    if not ev.train:
        return None
    arms = {arm: train_arm(store, ev, arm, run, scratch, audit) for arm, run in ev.train.items()}
    return {"arms": arms, "ratios": ratios(arms)}
