"""DiLoCo runs (``sync = "diloco"``, docs/experiment.md §3.13): each rank's step entries name
the documents it took (``local_indices``, its share ``indices[r::W]``) and its own weighted
target count; ``outer`` events follow every ``inner_steps``-th step, the same on every
rank, their digest the checkpoint's at checkpoint steps, their bytes the checkpoint's
parameter bytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.results import Check, Needs
from .entries import close_enough, effective_steps, is_hex_digest, is_int, is_real, problems_check

OUTER_KEYS = frozenset({"event", "rank", "step", "outer_step", "pseudo_gradient_norm",
                        "bytes_sent", "seconds", "parameters", "prev", "hash"})
"""Exactly the members of an ``outer`` event (docs/experiment.md §3.8)."""


def effective_outer_steps(entries: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The ``outer`` events that led to the final parameters (a ``resume`` from step k drops
    those after k written before it), in journal order."""
    kept: list[Mapping[str, Any]] = []
    for entry in entries:
        if entry.get("event") == "resume":
            start = entry.get("from_step")
            kept = [e for e in kept if is_int(e.get("step")) and is_int(start)
                    and e["step"] <= start]
        elif entry.get("event") == "outer":
            kept.append(entry)
    return kept


def diloco_checks(ranks: Mapping[int, list[Mapping[str, Any]]], params: Mapping[str, Any], *,
                  name: str, parameters: int | None, element_size: int | None = None,
                  parameter_bytes: int | None = None, rebuilt: Mapping[int, str] | None = None,
                  not_rechecked: tuple[Needs, str] | None = None,
                  why_not: str | None = None) -> list[Check]:
    """The DiLoCo evidence of a run's journals:

    - ``<run>.journals.diloco.schedule``: each rank's step entry names ``local_indices``
      ``indices[r::W]`` (the documents it took of the seeded batch) and an integer
      ``local_weighted_targets``; over the ranks these sum to the step's ``weighted_targets``;
    - ``<run>.journals.outer``: every rank's effective ``outer`` events are exactly one per
      ``inner_steps`` steps (``step = outer_step · H``, ``steps / H`` of them), each with
      exactly the documented members, a finite non-negative norm and seconds and a digest;
    - ``<run>.journals.outer.agree``: all ranks record the same digest, norm and bytes after
      every outer step; at a step with an ``agreed`` event the digest is the agreed one, at a
      checkpoint step (``rebuilt``) the one rebuilt from the checkpoint's weights;
    - ``<run>.journals.outer.bytes``: ``bytes_sent`` is the checkpoint's parameter bytes
      (Σ numel × element size, ``parameter_bytes``, or ``parameters × element_size``) on two
      or more ranks, 0 on one.
    """
    world, steps, h = params.get("world"), params.get("steps"), params.get("inner_steps")
    if not (is_int(world) and world >= 1 and is_int(steps) and steps >= 1 and is_int(h)
            and h >= 1):
        return [Check.failed(f"{name}.journals.outer", f"the params give no usable DiLoCo "
                             f"shape (world {world!r}, steps {steps!r}, inner_steps {h!r})")]
    schedule_problems: list[str] = []
    shares: dict[Any, list[Any]] = {}
    for rank, entries in sorted(ranks.items()):
        for entry in effective_steps(entries):
            step, indices = entry.get("step"), entry.get("indices")
            local, weighted = entry.get("local_indices"), entry.get("local_weighted_targets")
            if not isinstance(indices, list) or local != indices[rank::world]:
                schedule_problems.append(f"rank {rank} step {step}: local_indices are not "
                                         f"its share indices[{rank}::{world}]")
            if not is_int(weighted) or weighted < 1:
                schedule_problems.append(f"rank {rank} step {step}: local_weighted_targets "
                                         f"{weighted!r} is not a positive integer")
                continue
            shares.setdefault(step, []).append((weighted, entry.get("weighted_targets")))
    if len(ranks) == world:
        for step, pairs in sorted(shares.items(), key=lambda kv: str(kv[0])):
            total = sum(w for w, _ in pairs)
            if len(pairs) == world and total != pairs[0][1]:
                schedule_problems.append(f"step {step}: the ranks' local_weighted_targets sum "
                                         f"to {total}, not weighted_targets {pairs[0][1]!r}")
    checks = [problems_check(f"{name}.journals.diloco.schedule", schedule_problems,
                        recomputed=len(shares))]

    expected = [(k * h, k) for k in range(1, steps // h + 1)]
    shape_problems: list[str] = []
    per_rank: dict[int, list[Mapping[str, Any]]] = {}
    for rank, entries in sorted(ranks.items()):
        outer = effective_outer_steps(entries)
        per_rank[rank] = outer
        got = [(e.get("step"), e.get("outer_step")) for e in outer]
        if got != expected:
            shape_problems.append(f"rank {rank}: outer steps at (step, outer_step) {got[:3]}..."
                                  f" ({len(got)}), expected {expected[:3]}... ({len(expected)})")
        for e in outer:
            where = f"rank {rank} outer step {e.get('outer_step')!r}"
            if set(e) != OUTER_KEYS:
                shape_problems.append(f"{where}: members {sorted(set(e) ^ OUTER_KEYS)} differ "
                                      "from the documented ones")
            for key in ("pseudo_gradient_norm", "seconds"):
                v = e.get(key)
                if not (is_real(v) and math.isfinite(v) and v >= 0):
                    shape_problems.append(f"{where}: {key} {v!r} is not a finite number >= 0")
            if not is_hex_digest(e.get("parameters")):
                shape_problems.append(f"{where}: parameters is not a BLAKE3 hex digest")
    checks.append(problems_check(f"{name}.journals.outer", shape_problems,
                            recomputed=len(expected)))

    agree_problems: list[str] = []
    base_rank = min(per_rank, default=0)  # the loop below runs only when there is a rank
    for rank, outer in sorted(per_rank.items()):
        agreed = {e.get("step"): e.get("parameters") for e in ranks[rank]
                  if e.get("event") == "agreed"}
        for e in outer:
            step, digest = e.get("step"), e.get("parameters")
            if step in agreed and agreed[step] != digest:
                agree_problems.append(f"rank {rank} step {step}: the outer digest is not the "
                                      "one agreed at that step")
            if rebuilt and isinstance(step, int) and step in rebuilt and rebuilt[step] != digest:
                agree_problems.append(f"rank {rank} step {step}: the outer digest is not that "
                                      "of the checkpoint's weights")
        if rank == base_rank:
            continue
        mine = [(e.get("outer_step"), e.get("parameters"), e.get("bytes_sent")) for e in outer]
        theirs = [(e.get("outer_step"), e.get("parameters"), e.get("bytes_sent"))
                  for e in per_rank[base_rank]]
        if mine != theirs:
            agree_problems.append(f"rank {rank}: outer steps (digest or bytes) differ from "
                                  f"rank {base_rank}'s")
        elif not all(close_enough(a.get("pseudo_gradient_norm"), b.get("pseudo_gradient_norm"))
                     for a, b in zip(outer, per_rank[base_rank], strict=True)):
            agree_problems.append(f"rank {rank}: pseudo-gradient norms differ from rank "
                                  f"{base_rank}'s")
    checks.append(problems_check(f"{name}.journals.outer.agree", agree_problems,
                            recomputed=len(per_rank)))

    bytes_name = f"{name}.journals.outer.bytes"
    if parameter_bytes is None and parameters is not None and element_size is not None:
        parameter_bytes = parameters * element_size
    if world == 1:
        want: int | None = 0
    elif parameter_bytes is not None:
        want = parameter_bytes
    elif not_rechecked is not None:
        checks.append(Check.skipped(bytes_name, "the bytes per outer step follow from the "
                                    "checkpoint's parameters: " + not_rechecked[1],
                                    needs=not_rechecked[0]))
        return checks
    else:
        checks.append(Check.failed(bytes_name, f"the parameter bytes are unknown: {why_not}"))
        return checks
    sent = [(rank, e.get("outer_step"), e.get("bytes_sent")) for rank, outer in
            sorted(per_rank.items()) for e in outer]
    wrong = [(r, s) for r, s, b in sent if not is_int(b) or b != want]
    checks.append(Check.verdict(
        bytes_name, not wrong, claimed=sent[0][2] if sent else None, recomputed=want,
        message=f"(rank, outer step) {wrong[:3]} do not send {want} bytes "
                f"({'one rank: none' if world == 1 else 'numel x element size of every parameter'})"))
    return checks
