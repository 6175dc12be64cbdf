"""Per-update parameter digests in the journals and the published optimizer state
(docs/experiment.md §3.8, §3.9): each digest is the weights' of its step's checkpoint, and each
published state is the state that step left.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core.errors import RecordParseError
from ..core.results import Check
from ..records.closure import Objects, Unusable
from ..records.reading import parse_json
from .checkpoints import parameter_findings
from .entries import effective_steps, is_diloco, is_hex_digest, is_int, is_real, problems_check
from .journals import LR_TOLERANCE, learning_rate

STATE_FORMAT = "nscas-train-state/1"


STATE_TENSORS = "optimizer.safetensors"


STATE_RECORD = "state.json"


def run_checkpoints(objects: Objects, run: Any) -> dict[int, str]:
    """Step -> checkpoint ID of a train run's ``checkpoints`` output (entries ``step-NNNNNN``);
    empty when it cannot be read (``<run>.checkpoints`` reports that)."""
    try:
        entries = objects.record_of(run.outputs["checkpoints"], "tree/1")["entries"]
    except (Unusable, KeyError):
        return {}
    found = {}
    for rel, entry in entries.items():
        if rel.startswith("step-") and rel[5:].isdigit():
            found[int(rel[5:])] = entry["id"]
    return found


def digest_steps(params: Mapping[str, Any]) -> int:
    """``parameter_digests`` of a train action (0 for an action from before the param)."""
    every = params.get("parameter_digests", 0)
    return every if is_int(every) and every >= 0 else 0


def parameter_digest_checks(objects: Objects, run: Any,
                            ranks: Mapping[int, list[Mapping[str, Any]]]) -> list[Check]:
    """``<run>.journals.parameters``: step s carries ``parameters`` exactly when
    ``parameter_digests`` N > 0 and s % N == 0, a 64-hex BLAKE3; at a step with an ``agreed``
    event it is the agreed digest, and at a checkpoint step the digest rebuilt from that
    checkpoint's weights. ``<run>.journals.parameters.replay``: the digests nothing but a
    replay of training rechecks (docs/verify.md), by step, skipped as needing a model run."""
    name = run.name
    every = digest_steps(run.params)
    # DiLoCo: a step's digest is the rank's own, before any outer step; the outer events'
    # digests are the ones compared with agreements and checkpoints (diloco_checks).
    local = is_diloco(run.params)
    checkpoints = run_checkpoints(objects, run)
    rebuilt: dict[int, str] = {}
    for at, checkpoint in checkpoints.items():
        values, _failed, _needs = parameter_findings(objects, checkpoint)
        if "agreed_parameters" in values:
            rebuilt[at] = values["agreed_parameters"]
    problems: list[str] = []
    between: dict[str, str] = {}
    for rank, entries in sorted(ranks.items()):
        agreed = {e.get("step"): e.get("parameters") for e in entries
                  if e.get("event") == "agreed"}
        for entry in effective_steps(entries):
            step, digest = entry.get("step"), entry.get("parameters")
            if not is_int(step):
                continue  # the schedule check reports it
            wanted = every > 0 and step % every == 0
            if not wanted:
                if "parameters" in entry:
                    problems.append(f"rank {rank} step {step} carries a digest, but "
                                    f"parameter_digests is {every}")
                continue
            if not is_hex_digest(digest):
                problems.append(f"rank {rank} step {step}: parameters {str(digest)[:20]!r} is "
                                "not a BLAKE3 hex digest")
                continue
            if local:
                if rank == min(ranks):
                    between[str(step)] = digest
                continue
            if step in agreed and agreed[step] != digest:
                problems.append(f"rank {rank} step {step}: the digest is not the one agreed "
                                "at that step")
            if step in rebuilt and rebuilt[step] != digest:
                problems.append(f"rank {rank} step {step}: the digest is not that of the "
                                "checkpoint's weights")
            if rank == min(ranks) and step not in agreed and step not in rebuilt:
                between[str(step)] = digest
    checks = [problems_check(f"{name}.journals.parameters", problems,
                        recomputed=f"every {every} update(s)" if every else "none")]
    if between:
        why = (f"{len(between)} per-update digest(s) of rank {min(ranks)}'s own inner steps "
               "(diloco) would need a rerun of every rank; no replay of DiLoCo exists"
               if local else
               f"{len(between)} per-update digest(s) between checkpoints are rechecked only "
               "by replaying the training (--replay-steps, from a published state)")
        checks.append(Check.skipped(f"{name}.journals.parameters.replay", why,
                                    needs="model", claimed=between))
    return checks


def state_record_problems(objects: Objects, run: Any, step: int,
                          checkpoint: Mapping[str, Any]) -> tuple[dict[str, Any] | None,
                                                                   list[str]]:
    """The published state of the checkpoint of ``step`` (its ``state`` tree): exactly
    ``optimizer.safetensors`` and ``state.json``; ``state.json`` exactly ``format``, ``step``,
    ``world`` and ``groups``, its step the checkpoint's, its world the run's, two groups
    holding the checkpoint's parameters with two or more dimensions (weight decay
    ``weight_decay``) and the others (0), each at the learning rate of update ``step``.
    Returns the parsed state.json (None if unusable) and the problems."""
    where = f"step {step}'s state"
    tree = objects.record_of(checkpoint["state"], "tree/1")
    entries = tree["entries"]
    if sorted(entries) != sorted((STATE_RECORD, STATE_TENSORS)):
        return None, [f"{where} holds {sorted(entries)}, not {STATE_RECORD} and {STATE_TENSORS}"]
    try:
        value = parse_json(objects.bytes(entries[STATE_RECORD]["id"]), what=STATE_RECORD)
    except RecordParseError as exc:
        return None, [f"{where}: {exc.message}"]
    if not isinstance(value, dict) or set(value) != {"format", "step", "world", "groups"}:
        return None, [f"{where}: {STATE_RECORD} is not exactly format, step, world, groups"]
    problems = []
    params = run.params
    if value["format"] != STATE_FORMAT:
        problems.append(f"{where}: format {value['format']!r}, not {STATE_FORMAT}")
    if value["step"] != step or not is_int(value["step"]):
        problems.append(f"{where}: step {value['step']!r}")
    if value["world"] != params.get("world") or not is_int(value["world"]):
        problems.append(f"{where}: world {value['world']!r}, the params say "
                        f"{params.get('world')!r}")
    shapes = {n: t["shape"] for n, t in
              objects.record_of(checkpoint["params"], "params/1")["tensors"].items()}
    matrices = {n for n, s in shapes.items() if len(s) >= 2}
    groups = value["groups"]
    decay = params.get("weight_decay", 0.01)
    lr, warmup, total = params.get("lr"), params.get("warmup"), params.get("steps")
    want_lr = (learning_rate(step - 1, lr=float(lr), warmup=warmup, steps=total)
               if is_real(lr) and is_int(warmup) and is_int(total) else None)
    if not (isinstance(groups, list) and len(groups) == 2 and all(
            isinstance(g, dict) and set(g) == {"params", "lr", "weight_decay"}
            and isinstance(g["params"], list) for g in groups)):
        problems.append(f"{where}: groups are not two {{params, lr, weight_decay}}")
        return None, problems
    for index, (group, members, wd) in enumerate(zip(
            groups, (matrices, set(shapes) - matrices), (decay, 0.0), strict=True)):
        if sorted(map(str, group["params"])) != sorted(members) or len(group["params"]) != len(
                members):
            problems.append(f"{where}: group {index} is not the checkpoint's parameters with "
                            f"{'two or more' if index == 0 else 'fewer than two'} dimensions")
        if not is_real(group["weight_decay"]) or group["weight_decay"] != wd:
            problems.append(f"{where}: group {index} weight decay {group['weight_decay']!r}, "
                            f"not {wd!r}")
        got = group["lr"]
        if want_lr is None or not is_real(got) or abs(got - want_lr) > (
                LR_TOLERANCE.rel * abs(want_lr) + LR_TOLERANCE.abs):
            problems.append(f"{where}: group {index} lr {got!r}, the schedule gives {want_lr!r}")
    return (value if not problems else None), problems


def published_state_check(objects: Objects, run: Any) -> Check:
    """``<run>.state``: the checkpoints of ``publish_state`` steps, and only those, carry a
    published state, each as ``state_record_problems`` requires."""
    name = f"{run.name}.state"
    publish = run.params.get("publish_state", [])
    if not isinstance(publish, list):
        return Check.failed(name, f"publish_state is {publish!r}")
    problems = []
    published = []
    for step, oid in sorted(run_checkpoints(objects, run).items()):
        record = objects.record_of(oid, "checkpoint/1")
        has = "state" in record
        if has != (step in publish):
            problems.append(f"the checkpoint of step {step} {'carries' if has else 'lacks'} "
                            f"a state, but publish_state is {publish}")
        if has:
            published.append(step)
            if not isinstance(record["state"], str):
                problems.append(f"step {step}'s state is not a link")
                continue
            problems += state_record_problems(objects, run, step, record)[1]
    return problems_check(name, problems, claimed=publish, recomputed=published)
