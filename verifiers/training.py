"""Checkpoints, parameter digests and training journals (SPEC 4, EXPERIMENT 3).

- A checkpoint's ``params/1`` is rebuilt from the ``*.safetensors`` files of its ``files``
  tree; its ID is the parameter digest.
- ``sha256_stream`` and the ranks' agreed BLAKE3 digest hash parameters in module
  registration order. Safetensors files store tensors sorted by name, so the order is
  derived from ``config.json`` for the architectures whose order is known (Llama).
- Journals: each rank's hash chain and head (``schedule.check_journal``); the ranks agree
  step by step; each step's documents are the seeded schedule's batch; the per-run claims
  (updates, update seconds, bytes communicated, ...) are recomputed from the step entries.

Step entries of the train recipe are the entries with a ``step`` and no ``event``; steps are
numbered from 1 (step ``s`` trains batch ``s - 1`` of the schedule); ``documents`` holds
document ids and ``indices`` their schedule indices; an ``{"event": "resume",
"from_step": k}`` entry discards the step entries after ``k`` written before it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from typing import Any

import blake3

from .closure import Objects, Unusable
from .errors import InvalidArgument, LogFormatError, RecordParseError, SafetensorsError
from .params import ParamsDigest, params_digest, read_header, sha256_stream
from .records import parse_json
from .report import Check
from .schedule import check_journal, document_schedule, read_journal

FLOAT_NOISE = 1e-6
"""Relative difference allowed between ranks' losses and gradient norms."""
_SHOWN = 5


def _problems(name: str, problems: list[str], **values: Any) -> Check:
    if not problems:
        return Check.passed(name, **values)
    more = f" (and {len(problems) - _SHOWN} more)" if len(problems) > _SHOWN else ""
    return Check.failed(name, f"{len(problems)} problem(s): " + "; ".join(problems[:_SHOWN])
                        + more, **values)


# --- checkpoints -------------------------------------------------------------------------

class Weights:
    """A checkpoint's weight files written to temporary files, and its config."""

    def __init__(self, objects: Objects, checkpoint: str) -> None:
        record = objects.record_of(checkpoint, "checkpoint/1")
        entries = objects.record_of(record["files"], "tree/1")["entries"]
        self.record = record
        self.weight_ids = [entries[p]["id"] for p in sorted(entries)
                           if p.endswith(".safetensors")]
        if not self.weight_ids:
            raise Unusable(record["files"], "the checkpoint's files hold no *.safetensors")
        self.config: dict[str, Any] | None = None
        if "config.json" in entries:
            try:
                value = parse_json(objects.bytes(entries["config.json"]["id"]), what="config")
                self.config = value if isinstance(value, dict) else None
            except RecordParseError:
                self.config = None
        self._objects = objects
        self._stack = ExitStack()
        self.paths: list[Any] = []

    def __enter__(self) -> Weights:
        for number, oid in enumerate(self.weight_ids):
            self.paths.append(self._stack.enter_context(
                self._objects.as_file(oid, f"weights-{number}.safetensors")))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def params(self) -> ParamsDigest:
        try:
            return params_digest(self.paths)
        except SafetensorsError as exc:
            raise Unusable(self.weight_ids[0], exc.message) from None

    def order(self) -> list[str] | None:
        """Parameter names in module registration order, when the architecture is known."""
        names = set()
        for path in self.paths:
            names |= set(read_header(path).tensors)
        return registration_order(self.config or {}, names)

    def ordered_blake3(self, order: Sequence[str]) -> str:
        """BLAKE3 hex over the raw bytes of the parameters in ``order`` (the ranks' digest)."""
        hasher = blake3.blake3()
        where = {}
        for path in self.paths:
            for name, spec in read_header(path).tensors.items():
                where[name] = (path, spec)
        for name in order:
            path, spec = where[name]
            with open(path, "rb") as stream:
                stream.seek(spec.begin)
                hasher.update(stream.read(spec.nbytes))
        return hasher.hexdigest()

    def counts(self) -> tuple[int, int]:
        """(tensors, scalars) over the weight files."""
        tensors = scalars = 0
        for path in self.paths:
            for spec in read_header(path).tensors.values():
                tensors += 1
                scalars += math.prod(spec.shape)
        return tensors, scalars


def registration_order(config: Mapping[str, Any], names: set[str]) -> list[str] | None:
    """The order ``named_parameters()`` yields for a Hugging Face Llama model, if ``names``
    are exactly its parameters (a tied ``lm_head`` is absent, as it is from the file)."""
    if config.get("model_type") != "llama" or not isinstance(config.get("num_hidden_layers"),
                                                              int):
        return None
    attn_bias, mlp_bias = bool(config.get("attention_bias")), bool(config.get("mlp_bias"))
    order = ["model.embed_tokens.weight"]
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            order.append(f"{prefix}self_attn.{proj}.weight")
            if attn_bias:
                order.append(f"{prefix}self_attn.{proj}.bias")
        for proj in ("gate_proj", "up_proj", "down_proj"):
            order.append(f"{prefix}mlp.{proj}.weight")
            if mlp_bias:
                order.append(f"{prefix}mlp.{proj}.bias")
        order += [f"{prefix}input_layernorm.weight", f"{prefix}post_attention_layernorm.weight"]
    order.append("model.norm.weight")
    if "lm_head.weight" in names:
        order.append("lm_head.weight")
    return order if set(order) == names else None


def checkpoint_checks(objects: Objects, checkpoint: str) -> list[Check]:
    """A checkpoint's ``params`` is the digest rebuilt from its weight files."""
    name = f"checkpoint.{checkpoint[7:15]}.params"
    values, skipped = parameter_values(objects, checkpoint)
    if "parameter_digest" not in values:
        return [Check.skipped(name, skipped["parameter_digest"])]
    claimed = objects.record_of(checkpoint, "checkpoint/1")["params"]
    rebuilt = values["parameter_digest"]
    return [Check.verdict(name, rebuilt == claimed, claimed=claimed, recomputed=rebuilt,
                          message="the params/1 rebuilt from the weight files differs")]


def parameter_values(objects: Objects, checkpoint: str) -> tuple[dict[str, Any], dict[str, str]]:
    """Recomputed parameter claims of a checkpoint, and the ones that cannot be (memoised)."""
    key = ("parameters", checkpoint)
    if key not in objects.memo:
        objects.memo[key] = _parameter_values(objects, checkpoint)
    return objects.memo[key]


def _parameter_values(objects: Objects, checkpoint: str) -> tuple[dict[str, Any], dict[str, str]]:
    values: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    try:
        with Weights(objects, checkpoint) as weights:
            values["parameter_digest"] = weights.params().id
            values["tensors"], values["parameters"] = weights.counts()
            order = weights.order()
            if order is None:
                reason = "registration order unknown for this architecture"
                skipped["sha256_stream"] = skipped["agreed_parameters"] = reason
            else:
                values["sha256_stream"] = sha256_stream(weights.paths, order)
                values["agreed_parameters"] = weights.ordered_blake3(order)
    except Unusable as exc:
        reason = f"weights unavailable: {exc.why}"
        for claim in ("parameter_digest", "tensors", "parameters", "sha256_stream",
                      "agreed_parameters"):
            skipped[claim] = reason
    return values, skipped


# --- journals ----------------------------------------------------------------------------

def effective_steps(entries: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Step entries that led to the final parameters, in step order (resume-aware)."""
    kept: dict[Any, Mapping[str, Any]] = {}
    for entry in entries:
        if entry.get("event") == "resume":
            start = entry.get("from_step")
            kept = {s: e for s, e in kept.items() if isinstance(s, int) and s <= start}
        elif "step" in entry and "event" not in entry:
            kept[entry["step"]] = entry
    # Numeric order for integer steps (10 after 9); anything else after them, by its text.
    return [kept[s] for s in sorted(kept, key=lambda s: (0, s, "") if isinstance(s, int)
                                     and not isinstance(s, bool) else (1, 0, str(s)))]


def journal_checks(objects: Objects, journal_ids: Sequence[str],
                   name: str) -> tuple[list[Check], dict[int, list[Mapping[str, Any]]]]:
    """Chain and head of every rank's journal; returns each readable rank's entries."""
    checks: list[Check] = []
    ranks: dict[int, list[Mapping[str, Any]]] = {}
    listed: list[int] = []
    worlds = set()
    for oid in journal_ids:
        try:
            record = objects.record_of(oid, "journal/1")
            data = objects.bytes(record["entries"])
        except Unusable as exc:
            checks.append(Check.skipped(f"{name}.journal.{oid[7:15]}", f"unusable: {exc.why}"))
            continue
        rank = record["rank"]
        listed.append(rank)
        worlds.add(record["world"])
        checks.extend(check_journal(data, head=record["head"], name=f"{name}.journal{rank}"))
        try:
            ranks[rank] = read_journal(data)
        except LogFormatError:
            continue
    expected = list(range(next(iter(worlds)))) if len(worlds) == 1 else None
    ok = expected is not None and sorted(listed) == expected and len(journal_ids) == len(expected)
    checks.append(Check.verdict(f"{name}.journals.ranks", ok, claimed=sorted(listed),
                                recomputed=expected if expected else sorted(worlds),
                                message="one journal per rank 0..world-1 with one world size "
                                        "is required"))
    return checks, ranks


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=FLOAT_NOISE, abs_tol=1e-12)
    return a == b


def agreement_check(ranks: Mapping[int, list[Mapping[str, Any]]], name: str) -> Check:
    """Every rank made the same steps on the same documents with the same numbers."""
    if len(ranks) < 2:
        return Check.passed(f"{name}.journals.agree", recomputed=len(ranks),
                            message="one rank: nothing to compare")
    problems = []
    base_rank = min(ranks)
    base = effective_steps(ranks[base_rank])
    base_agreed = [(e.get("step"), e.get("parameters")) for e in ranks[base_rank]
                   if e.get("event") == "agreed"]
    for rank, entries in sorted(ranks.items()):
        if rank == base_rank:
            continue
        steps = effective_steps(entries)
        if [e.get("step") for e in steps] != [e.get("step") for e in base]:
            problems.append(f"rank {rank}: other step numbers than rank {base_rank}")
            continue
        for mine, theirs in zip(steps, base, strict=True):
            for key in ("documents", "indices", "targets", "weighted_targets", "lr", "loss",
                        "grad_norm"):
                if not _close(mine.get(key), theirs.get(key)):
                    problems.append(f"rank {rank} step {mine.get('step')}: {key} differs")
        agreed = [(e.get("step"), e.get("parameters")) for e in entries
                  if e.get("event") == "agreed"]
        if agreed != base_agreed:
            problems.append(f"rank {rank}: parameter digest events differ from rank {base_rank}")
    return _problems(f"{name}.journals.agree", problems, recomputed=len(ranks))


def schedule_check(steps: list[Mapping[str, Any]], *, seed: Any, documents: int, n_steps: Any,
                   batch: Any, ids: set[str], name: str) -> Check:
    """Step ``s`` trained batch ``s - 1`` of the seeded schedule, and nothing else."""
    try:
        schedule = document_schedule(seed, documents, n_steps, batch)
    except InvalidArgument as exc:
        return Check.skipped(f"{name}.schedule", f"cannot rebuild the schedule: {exc.message}")
    problems = []
    numbers = [e.get("step") for e in steps]
    if numbers != list(range(1, len(schedule) + 1)):
        problems.append(f"steps are {numbers[:3]}..., expected 1..{len(schedule)}")
    id_of: dict[int, Any] = {}
    for entry in steps:
        step = entry.get("step")
        if not isinstance(step, int) or not 1 <= step <= len(schedule):
            continue
        batch_indices = schedule[step - 1]
        indices = entry.get("indices")
        docs = entry.get("documents")
        if indices is None and isinstance(docs, list) and all(isinstance(d, int) for d in docs):
            indices = docs
        if indices != batch_indices:
            problems.append(f"step {step}: documents are not the scheduled batch")
            continue
        if isinstance(docs, list) and docs is not indices:
            for index, doc in zip(indices, docs, strict=False):
                if id_of.setdefault(index, doc) != doc or (ids and doc not in ids):
                    problems.append(f"step {step}: document {doc!r} is not document {index}")
                    break
    return _problems(f"{name}.schedule", problems, recomputed=len(schedule))


def run_values(steps: list[Mapping[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """Claims recomputed from one rank's effective step entries."""
    problems = []
    for key in ("seconds", "targets", "weighted_targets", "bytes_communicated"):
        bad = [e.get("step") for e in steps if isinstance(e.get(key), bool)
               or not isinstance(e.get(key), int | float)]
        if bad:
            problems.append(f"steps {bad[:3]} lack a numeric {key!r}")
    if problems or not steps:
        return {}, problems or ["no step entries"]
    seconds = [float(e["seconds"]) for e in steps]
    total = math.fsum(seconds)
    values: dict[str, Any] = {
        "updates": len(steps),
        "update_seconds": total,
        "median_update_seconds": statistics.median(seconds),
        "bytes_communicated": sum(e["bytes_communicated"] for e in steps),
        "targets": sum(e["targets"] for e in steps),
        "weighted_targets": sum(e["weighted_targets"] for e in steps),
    }
    if all(isinstance(e.get("tokens"), int) for e in steps) and total > 0:
        values["tokens_per_second"] = sum(e["tokens"] for e in steps) / total
    return values, []
