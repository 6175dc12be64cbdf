"""Replay of training: K updates after the run's start or a published optimizer state, in the
verifier's own loop.

``nscas verify --replay N --replay-steps K`` makes updates ``1 .. K`` of a train run again from
its base (its ``base`` input's weights, a fresh AdamW, torch's generator seeded as the run
seeded rank 0: the whole state at step 0, which the run's own inputs and params determine), and
for every checkpoint that carries a published state (train param ``publish_state``;
docs/format.md §3.3) updates ``s+1 .. s+K`` from its weights (FP32) and its optimizer and
torch RNG state (safetensors and JSON: no pickle), as docs/experiment.md §3 specifies them: the journal's batch
of document indices (the seeded schedule, which plain verification already rebuilt), each
document tokenised with the base checkpoint's own chat template and ``tokenizer.json`` (labels
as ``replay._encode`` gives them for retention probes), the objective ``Σ w_i·loss_i / S``
backpropagated per document (or per padded pass of ``micro_batch`` documents), the learning
rate of the schedule, the gradient norm clipped, AdamW with the run's betas, eps and weight
decay groups, BF16 autocast only where the run used CUDA and the replay does too, and a
``deterministic`` run's numeric settings (docs/format.md §7.8). After each update the BLAKE3
digest of the parameters (registration order, raw bytes) is compared with the journal's
``parameters``, and the loss and gradient norm with the journal's.

This module reads and checks what the replay needs and judges what it computed; the
arithmetic runs in a process of its own (``replay.step``), one for all of a run's starting
points, which applies the run's numeric settings before CUDA starts there and reports them
back.

Two ranks are replayed in one process: each rank's share accumulates its own gradient, which
DDP scales by 1/W and sums; for W = 2 both operations are exact in floating point, so the
result is bit for bit the two-rank one. More ranks sum in an order the replay does not know.

Nothing here imports nscas (docs/format.md §7.1): plain torch, transformers and safetensors.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ..core.errors import RecordParseError
from ..core.results import Check
from ..core.runs import Run
from ..evaluation.scoring import load_tokenizer
from ..records.closure import Objects, Unusable, weights_omitted
from ..tasks.chat import TemplateError, end_of_turn, template_source, turns_renderer
from ..training.entries import effective_steps
from ..training.journals import learning_rate
from ..training.state import STATE_TENSORS, run_checkpoints, state_record_problems
from .models import checkpoint_dir, encode_turns
from .options import ReplayOptions
from .step import compute
from .stepio import Document, Group, ReplayStepError, Request, Result, Settings, Update

EXACT_WORLDS = (1, 2)
"""Worlds whose gradient all-reduce the replay reproduces exactly (scaling by 1/2 and one
addition are exact)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Replayed:
    """What replaying from one published state found."""

    start: int
    steps: tuple[int, ...]
    """The updates replayed (1-based), in order."""
    differing: tuple[str, ...]
    """Per replayed update that disagrees with the journal: what differs."""
    compared: int
    """Digests compared with the journal's (or an agreed one)."""
    relative_l2: float | None = None
    max_abs: float | None = None
    """Distance of the replayed parameters from the weights of the checkpoint at the last
    replayed step, when there is one."""
    left: int = 0
    """Updates the time bound left unreplayed."""
    settings: Settings | None = None
    """The numeric settings the replay process computed under (None if it did not run)."""


def replay_trainings(objects: Objects, runs: Sequence[Run], options: ReplayOptions
                     ) -> list[Check]:
    """One ``<run>.replay.training`` check per succeeded train run (none if K is 0)."""
    if options.steps <= 0:
        return []
    checks = []
    deadline = None if options.time_limit is None else time.monotonic() + options.time_limit
    for run in runs:
        if run.recipe != "train":
            continue
        name = f"{run.name}.replay.training"
        try:
            checks.append(_replay_run(objects, run, options, deadline, name))
        except Unusable as exc:
            if exc.needs is not None:
                checks.append(Check.skipped(name, f"cannot replay: {exc.why}", needs=exc.needs))
            else:
                checks.append(Check.failed(name, f"cannot replay: {exc}"))
    return checks


def same_hardware(run: Run, device: str) -> bool:
    """Whether the replay computes as the run did: the same device kind (and so precision)
    and a world whose all-reduce it reproduces exactly."""
    return run.params.get("device") == device and run.params.get("world", 1) in EXACT_WORLDS


def reproducible(run: Run, device: str) -> bool:
    """Whether the run's digests are expected bit for bit from this replay: the same
    hardware, and on CUDA a ``deterministic`` run (without it, kernels such as the embedding
    backward sum in an order that changes from one run to the next)."""
    return same_hardware(run, device) and (device != "cuda"
                                           or bool(run.params.get("deterministic", True)))


def _replay_run(objects: Objects, run: Run, options: ReplayOptions, deadline: float | None,
                name: str) -> Check:
    if run.params.get("sync", "ddp") != "ddp":
        return Check.skipped(name, "DiLoCo runs (sync = diloco) are not replayed: every rank's "
                             "inner optimizer is its own and none is published, and this loop "
                             "replays synchronous AdamW updates only", needs="model")
    if run.params.get("optimizer", "adamw") != "adamw":
        return Check.skipped(name, f"optimizer {run.params.get('optimizer')!r} is not replayed "
                             "(this loop replays AdamW)", needs="model")
    checkpoints = run_checkpoints(objects, run)
    journal = _rank0_steps(objects, run)
    # A run whose ranks agreed on the loaded base at step 0 started from it with a fresh
    # optimizer: its first updates replay from the base, no published state needed.
    published = [(0, run.inputs["base"])] if 0 in journal[1] else []
    published += [(step, oid) for step, oid in sorted(checkpoints.items())
                  if "state" in objects.record_of(oid, "checkpoint/1")]
    if not published:
        return Check.skipped(name, "the journal has no agreement at step 0 and no checkpoint "
                             "of this run carries a published optimizer state (train param "
                             "publish_state), so no update can be replayed", needs="model")
    if any(weights_omitted(objects, oid) for _, oid in published):
        return Check.skipped(name, "the bundle omits the weights and optimizer state a replay "
                             "of training needs", needs="weights")
    if run.params.get("compile"):
        return Check.skipped(name, "compiled passes (compile = true) are not replayed",
                             needs="model")
    total = run.params.get("steps")
    starts = [(start, oid, min(options.steps, total - start) if isinstance(total, int) else 0)
              for start, oid in published]
    results = _replay_from(objects, run, [s for s in starts if s[2] > 0], journal, checkpoints,
                           options.device, deadline)
    precision = "bf16" if options.device == "cuda" and run.params.get("device") == "cuda" \
        else "fp32"
    where = f"{options.device} {precision}"
    replayed = [s for r in results for s in r.steps]
    settings = next((r.settings for r in results if r.settings is not None), None)
    recomputed = {"replayed": replayed, "from": [r.start for r in results],
                  "device": options.device, "precision": precision,
                  "relative_l2": [r.relative_l2 for r in results],
                  "max_abs": [r.max_abs for r in results],
                  "settings": None if settings is None else asdict(settings)}
    if not replayed:
        left = sum(r.left for r in results)
        why = (f"the time bound left {left} update(s) unreplayed" if left
               else "no update follows the published states")
        return Check.skipped(name, why, needs="model", recomputed=recomputed)
    distance = "; ".join(
        f"at step {r.steps[-1]} relative L2 {r.relative_l2:.3g}, max |Δ| {r.max_abs:.3g} "
        "from the checkpoint's weights" for r in results
        if r.steps and r.relative_l2 is not None and r.max_abs is not None)
    origins = ", ".join("the base" if r.start == 0 else f"the state of step {r.start}"
                        for r in results)
    summary = (f"updates {_span(replayed)} replayed from {origins} on {where}; "
               f"{sum(r.compared for r in results)} digest(s) compared")
    if distance:
        summary += f"; {distance}"
    differing = [d for r in results for d in r.differing]
    left = sum(r.left for r in results)
    if differing and not same_hardware(run, options.device):
        return Check.skipped(name, f"{summary}; trained on {run.params.get('device')} with "
                             f"{run.params.get('world')} rank(s), so not bit for bit: "
                             + "; ".join(differing[:3]), needs="model", recomputed=recomputed)
    if differing and not reproducible(run, options.device):
        return Check.skipped(name, f"{summary}; trained on cuda with deterministic off, so "
                             "its digests are not reproducible: " + "; ".join(differing[:3]),
                             needs="model", recomputed=recomputed)
    if differing:
        return Check.failed(name, f"{summary}; " + "; ".join(differing[:5]),
                            recomputed=recomputed)
    if left:
        return Check.skipped(name, f"{summary}; the time bound left {left} update(s) "
                             "unreplayed", needs="model", recomputed=recomputed)
    return Check.passed(name, recomputed=recomputed, message=f"{summary}: every one identical")


def _span(steps: Sequence[int]) -> str:
    return ", ".join(str(s) for s in steps) if len(steps) < 4 else f"{steps[0]}..{steps[-1]}"


def _rank0_steps(objects: Objects, run: Run) -> tuple[dict[int, Mapping[str, Any]],
                                                       dict[int, str]]:
    """Rank 0's effective step entries by step, and its agreed digests by step."""
    journals = run.receipt["journals"]
    ids = list(journals.values()) if isinstance(journals, dict) else list(journals)
    for oid in ids:
        record = objects.record_of(oid, "journal/1")
        if record["rank"] != 0:
            continue
        try:
            entries = objects.lines(record["entries"], "journal")
        except RecordParseError as exc:
            raise Unusable(record["entries"], exc.message) from None
        steps = {e["step"]: e for e in effective_steps(entries) if isinstance(e.get("step"), int)}
        agreed = {e["step"]: e["parameters"] for e in entries
                  if e.get("event") == "agreed" and isinstance(e.get("step"), int)}
        return steps, agreed
    raise Unusable(run.id, "no journal of rank 0")


class _Documents:
    """The run's training documents (the ``documents`` set's records, then ``replay``'s),
    tokenised on demand with the base checkpoint's template."""

    def __init__(self, objects: Objects, run: Run) -> None:
        self.ids: list[str] = []
        self.lines: list[Mapping[str, Any]] = []
        self.weights: list[int] = []
        for key, weight in (("documents", run.params.get("grounded_weight", 8)),
                            ("replay", run.params.get("replay_weight", 1))):
            record = objects.record_of(run.inputs[key], "tasks/1")
            try:
                lines = objects.lines(record["records"], key)
            except RecordParseError as exc:
                raise Unusable(record["records"], exc.message) from None
            self.lines += lines
            self.ids += [str(line.get("id")) for line in lines]
            self.weights += [weight] * len(lines)
        base = run.inputs["base"]
        tokenizer, _eos = load_tokenizer(objects, base)
        if tokenizer is None:
            raise Unusable(base, "has no usable tokenizer.json")
        files = objects.record_of(objects.record_of(base, "checkpoint/1")["files"], "tree/1")
        try:
            self._render = turns_renderer(*template_source(objects, files["entries"]))
            self._turn = end_of_turn(objects, files["entries"], tokenizer)["id"]
        except TemplateError as exc:
            raise Unusable(base, str(exc)) from None
        self._tokenizer = tokenizer
        self._cache: dict[int, Document] = {}

    def __getitem__(self, index: int) -> Document:
        if index not in self._cache:
            try:
                ids, labels = encode_turns(self.lines[index], self._render, self._tokenizer,
                                      self._turn)
            except (TemplateError, ValueError) as exc:
                raise Unusable(self.ids[index], f"cannot be tokenised: {exc}") from None
            self._cache[index] = Document(input_ids=tuple(ids), labels=tuple(labels),
                                          weight=self.weights[index])
        return self._cache[index]




@dataclass(frozen=True, slots=True)
class _Start:
    """One starting point's replay, prepared: its request and what judging its result needs."""

    start: int
    updates: tuple[Update, ...]
    request: Request
    counted: tuple[str, ...]
    """The batches' token counts that differ from the journal's."""
    gap: tuple[str, ...]
    """A step the journal has no batch for, where the updates stop short."""


def _replay_from(objects: Objects, run: Run, starts: Sequence[tuple[int, str, int]],
                 journal: tuple[dict[int, Mapping[str, Any]], dict[int, str]],
                 checkpoints: Mapping[int, str], device: str,
                 deadline: float | None) -> list[Replayed]:
    """Replay ``count`` updates from each ``(start, checkpoint, count)``: every start with
    updates to make in one replay process, in order."""
    if not starts:
        return []
    steps, agreed = journal
    docs = _Documents(objects, run)
    found: dict[int, Replayed] = {}
    with contextlib.ExitStack() as files:
        work = Path(files.enter_context(tempfile.TemporaryDirectory(prefix="nscas-replay-")))
        prepared = []
        for start, checkpoint, count in starts:
            ready = _prepare(objects, run, start, checkpoint, count, steps, checkpoints, docs,
                             device, deadline, work / f"from-{start}", files)
            if isinstance(ready, Replayed):
                found[start] = ready
            else:
                prepared.append(ready)
        if prepared:
            try:
                computed = compute([p.request for p in prepared], work)
            except ReplayStepError as exc:
                raise Unusable(exc.subject, exc.why) from None
            for ready, result in zip(prepared, computed, strict=True):
                found[ready.start] = _judge(ready, result, steps, agreed)
    return [found[start] for start, _, _ in starts]


def _prepare(objects: Objects, run: Run, start: int, checkpoint: str, count: int,
             steps: Mapping[int, Mapping[str, Any]], checkpoints: Mapping[int, str],
             docs: _Documents, device: str, deadline: float | None, work: Path,
             files: contextlib.ExitStack) -> _Start | Replayed:
    """The request replaying ``count`` updates from ``start`` (its files kept in ``files``),
    or, when the journal has no batch to replay, what was found."""
    record = objects.record_of(checkpoint, "checkpoint/1")
    state: Mapping[str, Any] | None = None
    if start:
        state, problems = state_record_problems(objects, run, start, record)
        if state is None:
            raise Unusable(record["state"], "; ".join(problems))
    params = run.params
    updates, gap = [], []
    for index in range(start, start + count):
        entry = steps.get(index + 1)
        if entry is None or not isinstance(entry.get("indices"), list):
            gap.append(f"step {index + 1}: the journal has no batch to replay")
            break
        batch = entry["indices"]
        if not batch or not all(isinstance(i, int) and not isinstance(i, bool)
                                and 0 <= i < len(docs.ids) for i in batch):
            raise Unusable("journal", f"step {index + 1}'s batch names a document index the "
                           "inputs lack")
        updates.append(Update(step=index + 1, indices=tuple(batch), lr=learning_rate(
            index, lr=params.get("lr", 3e-5), warmup=params.get("warmup", 8),
            steps=params["steps"])))
    if not updates:
        return Replayed(start=start, steps=(), differing=tuple(gap), compared=0)
    counted = count_problems(updates, steps, docs)
    betas = params.get("betas", [0.9, 0.95])
    work.mkdir()
    state_file = None
    if state is not None:
        entries = objects.record_of(record["state"], "tree/1")["entries"]
        state_file = str(files.enter_context(objects.as_file(entries[STATE_TENSORS]["id"],
                                                             STATE_TENSORS)))
    request = Request(
        model_dir=str(checkpoint_dir(objects, checkpoint, work / "model", files)),
        state_file=state_file,
        groups=tuple(Group(params=tuple(g["params"]), weight_decay=g["weight_decay"],
                           lr=g["lr"]) for g in (state or {}).get("groups", ())),
        weight_decay=params.get("weight_decay", 0.01),
        seed=None if state is not None else params.get("schedule_seed", 20260913),
        device=device, autocast=device == "cuda" and params.get("device") == "cuda",
        deterministic=bool(params.get("deterministic", True)),
        gradient_checkpointing=bool(params.get("gradient_checkpointing", False)),
        world=params.get("world", 1), micro_batch=params.get("micro_batch", 1),
        clip=params.get("clip", 1.0), lr=params.get("lr", 3e-5),
        betas=(betas[0], betas[1]), eps=params.get("eps", 1e-8), updates=tuple(updates),
        documents={i: docs[i] for u in updates for i in u.indices},
        compare={u.step: _weight_files(objects, checkpoints[u.step], files)
                 for u in updates if u.step in checkpoints},
        seconds=None if deadline is None else max(0.0, deadline - time.monotonic()))
    return _Start(start=start, updates=tuple(updates), request=request,
                  counted=tuple(counted), gap=tuple(gap))


def _judge(ready: _Start, result: Result, steps: Mapping[int, Mapping[str, Any]],
           agreed: Mapping[int, str]) -> Replayed:
    """What the replay from one start found, against the journal."""
    lrs = {u.step: u.lr for u in ready.updates}
    differing, compared = [], 0
    if result.loaded is not None and 0 in agreed:
        compared += 1
        if result.loaded != agreed[0]:
            differing.append(f"step 0: the base loads to parameter digest {result.loaded[:16]}…, "
                             f"the journal's agreement {str(agreed[0])[:16]}…")
    for measured in result.updates:
        entry = steps[measured.step]
        what = []
        for key, mine in (("loss", measured.loss), ("grad_norm", measured.grad_norm),
                          ("lr", lrs[measured.step])):
            if entry.get(key) != mine:
                what.append(f"{key} {mine!r}, the journal's {entry.get(key)!r}")
        expected = entry.get("parameters", agreed.get(measured.step))
        if expected is not None:
            compared += 1
            if measured.parameters != expected:
                what.append(f"parameter digest {measured.parameters[:16]}…, the journal's "
                            f"{str(expected)[:16]}…")
        if what:
            differing.append(f"step {measured.step}: " + ", ".join(what))
    return Replayed(start=ready.start, steps=tuple(m.step for m in result.updates),
                    differing=(*ready.counted, *differing, *ready.gap),
                    compared=compared, relative_l2=result.relative_l2, max_abs=result.max_abs,
                    left=len(ready.updates) - len(result.updates), settings=result.settings)


def count_problems(updates: Sequence[Update], steps: Mapping[int, Mapping[str, Any]],
                   docs: Mapping[int, Document] | _Documents) -> list[str]:
    """Each replayed batch's input tokens, targets and weighted targets as this verifier
    tokenises its documents, against the journal's: a difference names a tokenisation that is
    not the run's (or a journal that misstates it), which would explain any difference after."""
    problems = []
    for update in updates:
        batch = [docs[i] for i in update.indices]
        mine = {"tokens": sum(len(d.input_ids) for d in batch),
                "targets": sum(d.targets for d in batch),
                "weighted_targets": sum(d.weight * d.targets for d in batch)}
        entry = steps[update.step]
        off = [f"{key} {value}, the journal's {entry.get(key)!r}" for key, value in mine.items()
               if entry.get(key) != value]
        if off:
            problems.append(f"step {update.step}: its documents as tokenised here have "
                            + ", ".join(off))
    return problems


def _weight_files(objects: Objects, checkpoint: str, files: contextlib.ExitStack
                  ) -> tuple[str, ...]:
    """The verified ``*.safetensors`` files of ``checkpoint`` (kept open in ``files``)."""
    tree = objects.record_of(objects.record_of(checkpoint, "checkpoint/1")["files"], "tree/1")
    return tuple(str(files.enter_context(objects.as_file(entry["id"], PurePosixPath(rel).name)))
                 for rel, entry in sorted(tree["entries"].items())
                 if rel.endswith(".safetensors"))
