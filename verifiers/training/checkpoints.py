"""Checkpoints, parameter digests and training journals (docs/format.md §4, docs/experiment.md §3).

- A checkpoint's ``params/1`` is rebuilt from the ``*.safetensors`` files of its ``files``
  tree; its ID is the parameter digest.
- ``sha256_stream`` and the ranks' agreed BLAKE3 digest hash parameters in module
  registration order. Safetensors files store tensors sorted by name, so the order is
  derived from ``config.json`` for the architectures whose order is known (Llama).
- Journals: each rank's hash chain and head (``schedule.check_journal``); the ranks agree
  step by step; each step's documents are the seeded schedule's batch; the per-run claims
  (updates, update seconds, bytes communicated, ...) are recomputed from the step entries.
- DiLoCo runs (``sync = "diloco"``, docs/experiment.md §3.13): each rank's step entries name
  the documents it took (``local_indices``, its share ``indices[r::W]``) and its own weighted
  target count; ``outer`` events follow every ``inner_steps``-th step, the same on every
  rank, their digest the checkpoint's at checkpoint steps, their bytes the checkpoint's
  parameter bytes (``diloco_checks``).

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

from ..core.compare import Exact, Tolerance
from ..core.errors import InvalidArgument, LogFormatError, RecordParseError, SafetensorsError
from ..core.results import Check, Needs
from ..records.closure import Objects, Unusable
from ..records.reading import parse_json
from .params import ParamsDigest, params_digest, read_header, sha256_stream
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

    def counts(self) -> tuple[int, int, int]:
        """(tensors, scalars, bytes) over the weight files: bytes is Σ numel × element size
        of the stored dtypes."""
        tensors = scalars = size = 0
        for path in self.paths:
            for spec in read_header(path).tensors.values():
                tensors += 1
                scalars += math.prod(spec.shape)
                size += spec.nbytes
        return tensors, scalars, size


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
    values, failed, not_rechecked = parameter_findings(objects, checkpoint)
    if "parameter_digest" not in values:
        if "parameter_digest" in not_rechecked:
            needs, why = not_rechecked["parameter_digest"]
            return [Check.skipped(name, why, needs=needs)]
        return [Check.failed(name, failed.get("parameter_digest", "the digest cannot be "
                                              "rebuilt"))]
    claimed = objects.record_of(checkpoint, "checkpoint/1")["params"]
    rebuilt = values["parameter_digest"]
    return [Check.verdict(name, rebuilt == claimed, claimed=claimed, recomputed=rebuilt,
                          message="the params/1 rebuilt from the weight files differs")]


PARAMETER_CLAIMS = ("parameter_digest", "tensors", "parameters", "parameter_bytes",
                    "sha256_stream", "agreed_parameters")


def parameter_values(objects: Objects, checkpoint: str) -> tuple[dict[str, Any], dict[str, str]]:
    """Recomputed parameter claims of a checkpoint, and why the others are not (every reason,
    whether it fails or needs omitted weights; ``parameter_findings`` tells them apart)."""
    values, failed, not_rechecked = parameter_findings(objects, checkpoint)
    return values, {**failed, **{k: why for k, (_, why) in not_rechecked.items()}}


def parameter_findings(objects: Objects, checkpoint: str) -> tuple[
        dict[str, Any], dict[str, str], dict[str, tuple[Needs, str]]]:
    """Recomputed parameter claims of a checkpoint (memoised); the claims that cannot be
    recomputed, with why (failures); and those that need omitted weights, with
    ``(needs, why)`` (the only ones that may be skipped)."""
    key = ("parameters", checkpoint)
    if key not in objects.memo:
        objects.memo[key] = _parameter_values(objects, checkpoint)
    return objects.memo[key]


def _parameter_values(objects: Objects, checkpoint: str) -> tuple[
        dict[str, Any], dict[str, str], dict[str, tuple[Needs, str]]]:
    values: dict[str, Any] = {}
    failed: dict[str, str] = {}
    not_rechecked: dict[str, tuple[Needs, str]] = {}
    try:
        with Weights(objects, checkpoint) as weights:
            values["parameter_digest"] = weights.params().id
            values["tensors"], values["parameters"], values["parameter_bytes"] = (
                weights.counts())
            order = weights.order()
            if order is None:
                reason = ("registration order unknown for this architecture, so the ranks' "
                          "digests cannot be rebuilt")
                failed["sha256_stream"] = failed["agreed_parameters"] = reason
            else:
                values["sha256_stream"] = sha256_stream(weights.paths, order)
                values["agreed_parameters"] = weights.ordered_blake3(order)
    except Unusable as exc:
        reason = f"weights unavailable: {exc.why}"
        for claim in PARAMETER_CLAIMS:
            if exc.needs is not None:
                not_rechecked[claim] = (exc.needs, reason)
            else:
                failed[claim] = reason
    return values, failed, not_rechecked


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
            checks.append(Check.failed(f"{name}.journal.{oid[7:15]}", f"unusable: {exc.why}"))
            continue
        rank = record["rank"]
        listed.append(rank)
        worlds.add(record["world"])
        checks.extend(check_journal(data, head=record["head"], name=f"{name}.journal{rank}"))
        try:
            ranks[rank] = read_journal(data)
        except LogFormatError:
            continue
        checks.append(_journal_record_check(record, ranks[rank], f"{name}.journal{rank}.record"))
    world = next(iter(worlds)) if len(worlds) == 1 else None
    expected = (list(range(world)) if isinstance(world, int) and world == len(journal_ids)
                else None)
    ok = expected is not None and sorted(listed) == expected
    checks.append(Check.verdict(f"{name}.journals.ranks", ok, claimed=sorted(listed),
                                recomputed=expected if expected else sorted(worlds)[:3],
                                message="one journal per rank 0..world-1 with one world size "
                                        "is required"))
    return checks, ranks


def _journal_record_check(record: Mapping[str, Any], entries: list[Mapping[str, Any]],
                          name: str) -> Check:
    """The journal/1 record and its entries speak of one rank and one history: every entry
    names the record's rank, and ``resumed_from`` is the step of the last ``resume`` event
    (null when the run never resumed, or resumed from step 0)."""
    problems = []
    wrong = [n for n, e in enumerate(entries, start=1) if e.get("rank") != record["rank"]]
    if wrong:
        problems.append(f"{len(wrong)} entries name another rank than {record['rank']} "
                        f"(first: line {wrong[0]})")
    resumes = [e.get("from_step") for e in entries if e.get("event") == "resume"]
    expected = (resumes[-1] or None) if resumes else None
    if record.get("resumed_from") != expected or isinstance(record.get("resumed_from"), bool):
        problems.append(f"resumed_from is {record.get('resumed_from')!r}, the entries say "
                        f"{expected!r}")
    return Check.verdict(name, not problems, claimed=record.get("resumed_from"),
                         recomputed=expected, message="; ".join(problems))


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=FLOAT_NOISE, abs_tol=1e-12)
    return a == b


GLOBAL_STEP_KEYS = ("documents", "indices", "targets", "weighted_targets", "lr")
"""Step-entry members every rank shares in a DiLoCo run (the rest are the rank's own)."""


def is_diloco(params: Mapping[str, Any]) -> bool:
    """A DiLoCo run (``sync = "diloco"``); actions from before the param are ddp."""
    return params.get("sync", "ddp") == "diloco"


def agreement_check(ranks: Mapping[int, list[Mapping[str, Any]]], name: str,
                    params: Mapping[str, Any] | None = None) -> Check:
    """Every rank made the same steps on the same documents with the same numbers (in a
    DiLoCo run: the same global batch and lr; ``diloco_checks`` compares the outer steps)."""
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
        keys = (GLOBAL_STEP_KEYS if params is not None and is_diloco(params)
                else (*GLOBAL_STEP_KEYS, "loss", "grad_norm", "parameters"))
        for mine, theirs in zip(steps, base, strict=True):
            for key in keys:
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
        return Check.failed(f"{name}.schedule", f"cannot rebuild the schedule: {exc.message}")
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


INTEGER_FIELDS = ("targets", "weighted_targets", "tokens", "bytes_communicated")
"""Step-entry members that are counts: integers, compared exactly."""
LR_TOLERANCE = Tolerance(None, rel=1e-12, abs=0.0,
                         why="math.cos may differ by an ulp between C libraries")
SUM_TOLERANCE = "floating sums of per-step seconds taken in another order"
FP32_BYTES = 4
"""Bytes of one FP32 parameter's gradient (docs/experiment.md §3: FP32 parameters)."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def run_values(steps: list[Mapping[str, Any]], outer: Sequence[Mapping[str, Any]] = ()
               ) -> tuple[dict[str, Any], list[str]]:
    """Claims recomputed from one rank's effective step entries (and, for DiLoCo, its
    effective outer steps: their seconds count in ``update_seconds``, their ``bytes_sent`` in
    ``bytes_communicated``). Counts must be integers in every entry (a float count is a
    problem, never summed); seconds must be finite numbers."""
    problems = []
    for key in ("seconds", *INTEGER_FIELDS):
        check = _is_real if key == "seconds" else _is_int
        bad = [e.get("step") for e in steps if not check(e.get(key))
               or (key == "seconds" and not math.isfinite(e[key]))
               or (key != "seconds" and e[key] < 0)]
        if bad:
            what = "a finite number" if key == "seconds" else "a non-negative integer"
            problems.append(f"steps {bad[:3]} lack {what} {key!r}")
    bad_outer = [e.get("outer_step") for e in outer
                 if not (_is_real(e.get("seconds")) and math.isfinite(e["seconds"])
                         and _is_int(e.get("bytes_sent")) and e["bytes_sent"] >= 0)]
    if bad_outer:
        problems.append(f"outer steps {bad_outer[:3]} lack finite seconds or integer bytes_sent")
    if problems or not steps:
        return {}, problems or ["no step entries"]
    seconds = [float(e["seconds"]) for e in steps]
    total = math.fsum([*seconds, *(float(e["seconds"]) for e in outer)])
    tokens = sum(e["tokens"] for e in steps)
    values: dict[str, Any] = {
        "updates": len(steps),
        "update_seconds": Tolerance(total, why=SUM_TOLERANCE),
        "median_update_seconds": Tolerance(statistics.median(seconds), why=SUM_TOLERANCE),
        "bytes_communicated": (sum(e["bytes_communicated"] for e in steps)
                               + sum(e["bytes_sent"] for e in outer)),
        "targets": sum(e["targets"] for e in steps),
        "weighted_targets": sum(e["weighted_targets"] for e in steps),
        "tokens": tokens,
        "tokens_per_second": Tolerance(tokens / total if total > 0 else 0.0, why=SUM_TOLERANCE),
    }
    if outer:
        values["outer_steps"] = len(outer)
    return values, []


LOSS_CLAIMS = ("first_loss", "last_loss", "mean_loss")
"""A train run's claims of its training loss (docs/format.md §3.10)."""


def loss_values(steps: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Exact], str | None]:
    """``first_loss``, ``last_loss`` and ``mean_loss`` recomputed from one rank's effective
    step entries, each compared exactly: the first and last step's ``loss``, and the mean
    ``math.fsum(losses) / len(losses)`` (the exact sum rounded once, then one division).
    Every step's loss must be a finite number ``>= 0`` (the objective of docs/experiment.md
    §3.3); otherwise nothing is recomputed and the reason is returned."""
    losses = [_loss(e.get("loss")) for e in steps]
    bad = [e.get("step") for e, loss in zip(steps, losses, strict=True) if loss is None]
    if bad:
        return {}, f"steps {bad[:3]} lack a finite loss >= 0"
    finite = [loss for loss in losses if loss is not None]
    mean = mean_loss(finite)
    if mean is None:
        return {}, "no step entries" if not finite else "the losses' sum overflows a float"
    return {"first_loss": Exact(finite[0]), "last_loss": Exact(finite[-1]),
            "mean_loss": Exact(mean)}, None


def mean_loss(losses: Sequence[Any]) -> float | None:
    """``math.fsum(losses) / len(losses)``; None when there are none, one is not a finite
    number ``>= 0``, or the sum overflows."""
    values = [v for v in map(_loss, losses) if v is not None]
    if not values or len(values) != len(losses):
        return None
    try:
        return math.fsum(values) / len(values)
    except OverflowError:
        return None


def _loss(value: Any) -> float | None:
    """``value`` as a float when it is a JSON number giving a finite float ``>= 0``."""
    if not _is_real(value):
        return None
    try:
        loss = float(value)
    except OverflowError:
        return None
    return loss if math.isfinite(loss) and loss >= 0 else None


def learning_rate(step: int, *, lr: float, warmup: int, steps: int) -> float:
    """docs/experiment.md §3's learning rate of update ``step`` (0-based): ``lr·(s+1)/warmup`` while
    ``s < warmup``, then cosine from ``lr`` (first decay update) to ``0.1·lr`` (last one)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    decay = steps - warmup
    if decay <= 1:
        return lr
    progress = (step - warmup) / (decay - 1)
    return lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def lr_check(steps: list[Mapping[str, Any]], params: Mapping[str, Any], name: str) -> Check:
    """Every step entry's ``lr`` is the schedule's value for its step (step ``s`` is update
    ``s - 1``), within ``LR_TOLERANCE``."""
    check = f"{name}.journals.lr"
    lr, warmup, total = params.get("lr"), params.get("warmup"), params.get("steps")
    if not (_is_real(lr) and math.isfinite(lr) and _is_int(warmup) and warmup >= 0
            and _is_int(total) and total >= 1):
        return Check.failed(check, f"the params give no usable schedule (lr {lr!r}, warmup "
                                   f"{warmup!r}, steps {total!r})")
    problems = []
    for entry in steps:
        step, got = entry.get("step"), entry.get("lr")
        if not _is_int(step) or not 1 <= step <= total:
            problems.append(f"step {step!r} is not an update of a {total}-step schedule")
            continue
        want = learning_rate(step - 1, lr=float(lr), warmup=warmup, steps=total)
        if not _is_real(got) or not math.isfinite(got) or abs(got - want) > (
                LR_TOLERANCE.rel * abs(want) + LR_TOLERANCE.abs):
            problems.append(f"step {step}: lr {got!r}, the schedule gives {want!r}")
    result = _problems(check, problems, recomputed=len(steps))
    return _with_rule(result, LR_TOLERANCE.describe())


def _with_rule(check: Check, rule: str) -> Check:
    message = f"{check.message} [{rule}]" if check.message else rule
    return Check(name=check.name, status=check.status, claimed=check.claimed,
                 recomputed=check.recomputed, message=message, needs=check.needs)


def weighted_targets_check(steps: list[Mapping[str, Any]], params: Mapping[str, Any],
                           replay_ids: set[str], grounded_ids: set[str], name: str) -> Check:
    """``weighted_targets = Σ targets_i · w_i`` (docs/experiment.md §3) with grounded weight and replay
    weight from the params: exactly ``w · targets`` when a batch holds documents of one
    weight, and between ``min(w) · targets`` and ``max(w) · targets`` otherwise (the
    per-document target counts need the chat template)."""
    check = f"{name}.journals.weighted_targets"
    grounded, replay = params.get("grounded_weight"), params.get("replay_weight")
    if not (_is_int(grounded) and _is_int(replay) and grounded >= 0 and replay >= 0):
        return Check.failed(check, f"the params give no integer loss weights (grounded "
                                   f"{grounded!r}, replay {replay!r})")
    problems = []
    for entry in steps:
        docs, targets, weighted = (entry.get("documents"), entry.get("targets"),
                                   entry.get("weighted_targets"))
        if not (isinstance(docs, list) and _is_int(targets) and _is_int(weighted)):
            problems.append(f"step {entry.get('step')!r}: documents, targets or weighted "
                            "targets malformed")
            continue
        weights = set()
        for doc in docs:
            if isinstance(doc, str) and doc in replay_ids:
                weights.add(replay)
            elif isinstance(doc, str) and doc in grounded_ids:
                weights.add(grounded)
            else:
                problems.append(f"step {entry.get('step')}: document {str(doc)[:16]!r} is not "
                                "a training document")
                weights = set()
                break
        if not weights:
            continue
        low, high = min(weights) * targets, max(weights) * targets
        if not low <= weighted <= high:
            expected = f"{low}" if low == high else f"between {low} and {high}"
            problems.append(f"step {entry.get('step')}: weighted targets {weighted}, expected "
                            f"{expected} for {targets} targets")
    return _problems(check, problems, recomputed=len(steps))


def bytes_check(steps: list[Mapping[str, Any]], *, world: Any, parameters: int | None,
                not_rechecked: tuple[Needs, str] | None, why_not: str | None,
                name: str, diloco: bool = False) -> Check:
    """Each update all-reduces every trained parameter's FP32 gradient once when the world
    has more than one rank: ``bytes_communicated = 4 · parameters`` per step, ``0`` alone.
    A DiLoCo inner step communicates nothing: 0 (its outer steps carry the bytes)."""
    check = f"{name}.journals.bytes_communicated"
    values = [e.get("bytes_communicated") for e in steps]
    if not _is_int(world) or world < 1:
        return Check.failed(check, f"the params give no world size ({world!r})")
    if diloco:
        wrong = [e.get("step") for e, v in zip(steps, values, strict=True)
                 if not _is_int(v) or v != 0]
        return Check.verdict(check, not wrong, claimed=values[0] if values else None,
                             recomputed=0, message=f"steps {wrong[:3]} communicate bytes, but "
                             "a diloco inner step communicates none")
    if world == 1:
        expected: int | None = 0
    elif parameters is not None:
        expected = FP32_BYTES * parameters
    elif not_rechecked is not None:
        return Check.skipped(check, "the bytes per update follow from the parameter count: "
                             + not_rechecked[1], needs=not_rechecked[0])
    else:
        return Check.failed(check, f"the parameter count is unknown: {why_not}")
    wrong = [e.get("step") for e, v in zip(steps, values, strict=True)
             if not _is_int(v) or v != expected]
    why = "one rank: none" if world == 1 else "4 bytes per FP32 parameter gradient per update"
    return Check.verdict(check, not wrong, claimed=values[0] if values else None,
                         recomputed=expected,
                         message=f"steps {wrong[:3]} do not communicate {expected} bytes "
                                 f"({why})")


# --- per-update parameter digests and published optimizer state --------------------------

HEX_DIGEST = frozenset("0123456789abcdef")
STATE_FORMAT = "nscas-train-state/1"
STATE_TENSORS = "optimizer.safetensors"
STATE_RECORD = "state.json"


def _is_digest(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= HEX_DIGEST


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
    return every if _is_int(every) and every >= 0 else 0


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
    for step, checkpoint in checkpoints.items():
        values, _failed, _needs = parameter_findings(objects, checkpoint)
        if "agreed_parameters" in values:
            rebuilt[step] = values["agreed_parameters"]
    problems: list[str] = []
    between: dict[str, str] = {}
    for rank, entries in sorted(ranks.items()):
        agreed = {e.get("step"): e.get("parameters") for e in entries
                  if e.get("event") == "agreed"}
        for entry in effective_steps(entries):
            step, digest = entry.get("step"), entry.get("parameters")
            if not _is_int(step):
                continue  # the schedule check reports it
            wanted = every > 0 and step % every == 0
            if not wanted:
                if "parameters" in entry:
                    problems.append(f"rank {rank} step {step} carries a digest, but "
                                    f"parameter_digests is {every}")
                continue
            if not _is_digest(digest):
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
    checks = [_problems(f"{name}.journals.parameters", problems,
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


# --- DiLoCo outer steps ------------------------------------------------------------------

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
            kept = [e for e in kept if _is_int(e.get("step")) and _is_int(start)
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
    if not (_is_int(world) and world >= 1 and _is_int(steps) and steps >= 1 and _is_int(h)
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
            if not _is_int(weighted) or weighted < 1:
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
    checks = [_problems(f"{name}.journals.diloco.schedule", schedule_problems,
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
                if not (_is_real(v) and math.isfinite(v) and v >= 0):
                    shape_problems.append(f"{where}: {key} {v!r} is not a finite number >= 0")
            if not _is_digest(e.get("parameters")):
                shape_problems.append(f"{where}: parameters is not a BLAKE3 hex digest")
    checks.append(_problems(f"{name}.journals.outer", shape_problems,
                            recomputed=len(expected)))

    agree_problems: list[str] = []
    base_rank = min(per_rank) if per_rank else None
    for rank, outer in sorted(per_rank.items()):
        agreed = {e.get("step"): e.get("parameters") for e in ranks[rank]
                  if e.get("event") == "agreed"}
        for e in outer:
            step, digest = e.get("step"), e.get("parameters")
            if step in agreed and agreed[step] != digest:
                agree_problems.append(f"rank {rank} step {step}: the outer digest is not the "
                                      "one agreed at that step")
            if rebuilt and step in rebuilt and rebuilt[step] != digest:
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
        elif not all(_close(a.get("pseudo_gradient_norm"), b.get("pseudo_gradient_norm"))
                     for a, b in zip(outer, per_rank[base_rank], strict=True)):
            agree_problems.append(f"rank {rank}: pseudo-gradient norms differ from rank "
                                  f"{base_rank}'s")
    checks.append(_problems(f"{name}.journals.outer.agree", agree_problems,
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
    wrong = [(r, s) for r, s, b in sent if not _is_int(b) or b != want]
    checks.append(Check.verdict(
        bytes_name, not wrong, claimed=sent[0][2] if sent else None, recomputed=want,
        message=f"(rank, outer step) {wrong[:3]} do not send {want} bytes "
                f"({'one rank: none' if world == 1 else 'numel x element size of every parameter'})"))
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
    if value["step"] != step or not _is_int(value["step"]):
        problems.append(f"{where}: step {value['step']!r}")
    if value["world"] != params.get("world") or not _is_int(value["world"]):
        problems.append(f"{where}: world {value['world']!r}, the params say "
                        f"{params.get('world')!r}")
    shapes = {n: t["shape"] for n, t in
              objects.record_of(checkpoint["params"], "params/1")["tensors"].items()}
    matrices = {n for n, s in shapes.items() if len(s) >= 2}
    groups = value["groups"]
    decay = params.get("weight_decay", 0.01)
    lr, warmup, total = params.get("lr"), params.get("warmup"), params.get("steps")
    want_lr = (learning_rate(step - 1, lr=float(lr), warmup=warmup, steps=total)
               if _is_real(lr) and _is_int(warmup) and _is_int(total) else None)
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
        if not _is_real(group["weight_decay"]) or group["weight_decay"] != wd:
            problems.append(f"{where}: group {index} weight decay {group['weight_decay']!r}, "
                            f"not {wd!r}")
        got = group["lr"]
        if want_lr is None or not _is_real(got) or abs(got - want_lr) > (
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
    return _problems(name, problems, claimed=publish, recomputed=published)
