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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nscas.errors import RecipeError
from nscas.objects.digests import Digest
from nscas.recipes.train.journal import LOSS_CLAIMS, effective_steps, loss_claims, read_journal
from nscas.store.protocol import ObjectReader

from .audit import Audit
from .evidence import BASELINE, Evidence, Run, documents_kind

CLAIMED_ONLY = ("loop_seconds", "peak_memory_bytes")
CLAIMED_ONLY_NOTE = ("self-reported: loop wall time and peak memory as the train run measured "
                     "them; no journal entry records them, so this report cannot recompute them")
SERIES = {"loss_by_step": "loss", "lr_by_step": "lr", "grad_norm_by_step": "grad_norm"}
"""Per-rank series by effective step, from these journal entry members."""


def _rank_steps(store: ObjectReader, run: Run, journal_id: Digest, scratch: Path
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


@dataclass(frozen=True, slots=True, kw_only=True)
class RankNumbers:
    """One rank's totals over its effective steps, and its series by step."""

    rank: int
    updates: int
    update_seconds: float
    median_update_seconds: float
    bytes_communicated: int
    targets: int
    weighted_targets: int
    tokens: int
    tokens_per_second: float
    final_parameters: str | None
    """The BLAKE3 of the parameters the ranks last agreed on; None if no agreement is journaled."""
    loss_by_step: tuple[float, ...]
    lr_by_step: tuple[float, ...]
    grad_norm_by_step: tuple[float, ...]

    def totals(self) -> dict[str, Any]:
        return {"updates": self.updates, "update_seconds": self.update_seconds,
                "median_update_seconds": self.median_update_seconds,
                "bytes_communicated": self.bytes_communicated, "targets": self.targets,
                "weighted_targets": self.weighted_targets, "tokens": self.tokens,
                "tokens_per_second": self.tokens_per_second}

    def to_json(self) -> dict[str, Any]:
        """``ranks[]`` of a training arm (no final parameters: the arm says whether they agree)."""
        return {"rank": self.rank, **self.totals(),
                **{key: list(getattr(self, key)) for key in SERIES}}


def rank_numbers(rank: int, steps: list[dict[str, Any]],
                 entries: list[dict[str, Any]]) -> RankNumbers:
    """One rank's totals over its effective steps."""
    seconds = [e["seconds"] for e in steps]
    update_seconds = sum(seconds)
    tokens = sum(e["tokens"] for e in steps)
    agreed = [e for e in entries if e.get("event") == "agreed"]
    return RankNumbers(
        rank=rank,
        updates=len(steps),
        update_seconds=update_seconds,
        median_update_seconds=statistics.median(seconds) if seconds else 0.0,
        bytes_communicated=sum(e["bytes_communicated"] for e in steps),
        targets=sum(e["targets"] for e in steps),
        weighted_targets=sum(e["weighted_targets"] for e in steps),
        tokens=tokens,
        tokens_per_second=tokens / update_seconds if update_seconds else 0.0,
        final_parameters=agreed[-1]["parameters"] if agreed else None,
        **{key: tuple(e[member] for e in steps) for key, member in SERIES.items()},
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimedOnly:
    """What the run measured of itself and no journal entry records (shown, never compared)."""

    loop_seconds: Any
    peak_memory_bytes: Any
    """Per rank, as the receipt claims it."""

    def to_json(self) -> dict[str, Any]:
        return {"loop_seconds": self.loop_seconds, "peak_memory_bytes": self.peak_memory_bytes,
                "note": CLAIMED_ONLY_NOTE}


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainArm:
    """One trained arm (report.json ``training.arms.<arm>``); headline numbers are rank 0's."""

    receipt: Digest
    world: int
    device: str
    hosts: int
    documents: str
    """``clean``, ``damaged`` or ``other``."""
    base: Digest | None
    from_seed: bool
    checkpoint: Digest
    parameter_digest: str
    parameters_agree: bool
    ranks: tuple[RankNumbers, ...]
    """By rank; rank 0 first."""
    claimed_only: ClaimedOnly
    shows_mean_loss: bool
    """The train receipt claims ``mean_loss`` (receipts from before the claim do not)."""

    @property
    def head(self) -> RankNumbers:
        return self.ranks[0]

    @property
    def bytes_per_update(self) -> float:
        head = self.head
        return head.bytes_communicated / head.updates if head.updates else 0

    def to_json(self) -> dict[str, Any]:
        losses = self.head.loss_by_step
        return {
            "receipt": str(self.receipt),
            "world": self.world,
            "device": self.device,
            "hosts": self.hosts,
            "documents": self.documents,
            "base": str(self.base),
            "from_seed": self.from_seed,
            "checkpoint": str(self.checkpoint),
            "parameter_digest": self.parameter_digest,
            "parameters_agree": self.parameters_agree,
            "final_parameters_blake3": self.head.final_parameters,
            **self.head.totals(),
            "bytes_per_update": self.bytes_per_update,
            "first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None,
            **({"mean_loss": loss_claims(losses).get("mean_loss")} if self.shows_mean_loss
               else {}),
            "loss_by_step": list(losses),
            "ranks": [r.to_json() for r in self.ranks],
            "claimed_only": self.claimed_only.to_json(),
        }


def train_arm(store: ObjectReader, ev: Evidence, arm: str, run: Run, scratch: Path,
              audit: Audit) -> TrainArm:
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
    numbers = tuple(rank_numbers(rank, *ranks[rank]) for rank in sorted(ranks))
    step_lists = {rank: [e["step"] for e in ranks[rank][0]] for rank in ranks}
    if any(s != list(range(1, len(s) + 1)) or s != step_lists[0] for s in step_lists.values()):
        raise RecipeError(f"{run.name}: the ranks' journals do not hold the same steps 1..n")
    finals = {n.final_parameters for n in numbers}
    head = numbers[0]
    checkpoint = run.output("checkpoint")
    params_id = store.get_record(checkpoint)["params"]
    claims = run.claims
    summary = TrainArm(
        receipt=run.receipt,
        world=world,
        device=run.params.get("device", "cpu"),
        hosts=int(run.params.get("nnodes", 1)),
        documents=documents_kind(ev.prepare, run),
        base=run.input("base"),
        from_seed=run.input("base") == ev.evaluate[BASELINE].input("model"),
        checkpoint=checkpoint,
        parameter_digest=params_id,
        parameters_agree=len(finals) == 1 and None not in finals,
        ranks=numbers,
        claimed_only=ClaimedOnly(loop_seconds=claims.get("loop_seconds"),
                                 peak_memory_bytes=claims.get("peak_memory_bytes")),
        shows_mean_loss="mean_loss" in claims,
    )
    audit.claim(run, "parameter_digest", params_id)
    for name in ("updates", "update_seconds", "median_update_seconds", "bytes_communicated",
                 "targets", "weighted_targets", "tokens_per_second"):
        audit.claim(run, name, getattr(head, name))
    losses = loss_claims(head.loss_by_step)
    for name in LOSS_CLAIMS:
        audit.claim(run, name, losses.get(name))
    return summary


@dataclass(frozen=True, slots=True, kw_only=True)
class Ratio:
    """A clean multi-rank arm against a clean one-rank arm (``training.ratios[]``)."""

    pair: str
    single: str
    update_seconds: float | None
    median_update_seconds: float | None
    loop_seconds: float | None
    """Claimed only, as the loop times are."""
    allocated_device_seconds_in_loop: float | None

    def to_json(self) -> dict[str, Any]:
        return {"pair": self.pair, "single": self.single, "update_seconds": self.update_seconds,
                "median_update_seconds": self.median_update_seconds,
                "claimed_only": {
                    "loop_seconds": self.loop_seconds,
                    "allocated_device_seconds_in_loop": self.allocated_device_seconds_in_loop,
                    "note": CLAIMED_ONLY_NOTE}}


def ratios(arms: Mapping[str, TrainArm]) -> list[Ratio]:
    """Each clean multi-rank arm against each clean one-rank arm: how much slower, how much more."""
    out = []
    for pair, p in arms.items():
        for single, s in arms.items():
            if not (p.documents == s.documents == "clean" and p.world > 1 and s.world == 1):
                continue
            loop_p, loop_s = p.claimed_only.loop_seconds, s.claimed_only.loop_seconds
            out.append(Ratio(
                pair=pair, single=single,
                update_seconds=_ratio(p.head.update_seconds, s.head.update_seconds),
                median_update_seconds=_ratio(p.head.median_update_seconds,
                                             s.head.median_update_seconds),
                loop_seconds=_ratio(loop_p, loop_s),
                allocated_device_seconds_in_loop=_ratio(
                    loop_p * p.world if loop_p is not None else None,
                    loop_s * s.world if loop_s is not None else None),
            ))
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


@dataclass(frozen=True, slots=True, kw_only=True)
class Training:
    """report.json's ``training`` part."""

    arms: Mapping[str, TrainArm]
    ratios: tuple[Ratio, ...]

    def to_json(self) -> dict[str, Any]:
        return {"arms": {k: v.to_json() for k, v in self.arms.items()},
                "ratios": [r.to_json() for r in self.ratios]}


def training_section(store: ObjectReader, ev: Evidence, scratch: Path,
                     audit: Audit) -> Training | None:
    if not ev.train:
        return None
    arms = {arm: train_arm(store, ev, arm, run, scratch, audit) for arm, run in ev.train.items()}
    return Training(arms=arms, ratios=tuple(ratios(arms)))
