"""Replay of training: K updates after a published optimizer state, in the verifier's own loop.

``nscas verify --replay N --replay-steps K`` takes every checkpoint of a train run that
carries a published state (train param ``publish_state``; docs/format.md §3.3), loads its
weights (FP32) and its optimizer and torch RNG state (safetensors and JSON: no pickle), and
makes updates ``s+1 .. s+K`` as docs/experiment.md §3 specifies them: the journal's batch of
document indices (the seeded schedule, which plain verification already rebuilt), each
document tokenised with the base checkpoint's own chat template and ``tokenizer.json`` (labels
as ``replay._encode`` gives them for retention probes), the objective ``Σ w_i·loss_i / S``
backpropagated per document (or per padded pass of ``micro_batch`` documents), the learning
rate of the schedule, the gradient norm clipped, AdamW with the run's betas, eps and weight
decay groups, BF16 autocast only where the run used CUDA and the replay does too. After each
update the BLAKE3 digest of the parameters (registration order, raw bytes) is compared with
the journal's ``parameters``, and the loss and gradient norm with the journal's.

Two ranks are replayed in one process: each rank's share accumulates its own gradient, which
DDP scales by 1/W and sums; for W = 2 both operations are exact in floating point, so the
result is bit for bit the two-rank one. More ranks sum in an order the replay does not know.

Nothing here imports nscas (docs/format.md §7.1): plain torch, transformers and safetensors.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import blake3

from .chat import TemplateError, end_of_turn, template_source, turns_renderer
from .closure import Objects, Unusable, weights_omitted
from .errors import RecordParseError
from .evaluation import load_tokenizer
from .replay import ReplayOptions, _encode, _model
from .report import Check
from .runs import Run
from .taskchecks import read_lines
from .training import (
    STATE_TENSORS,
    effective_steps,
    learning_rate,
    run_checkpoints,
    state_record_problems,
)

EXACT_WORLDS = (1, 2)
"""Worlds whose gradient all-reduce the replay reproduces exactly (scaling by 1/2 and one
addition are exact)."""
OPTIMIZER_KEYS = ("step", "exp_avg", "exp_avg_sq")


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
    published = [(step, oid) for step, oid in sorted(checkpoints.items())
                 if "state" in objects.record_of(oid, "checkpoint/1")]
    if not published:
        return Check.skipped(name, "no checkpoint of this run carries a published optimizer "
                             "state (train param publish_state), so no update can be replayed",
                             needs="model")
    if any(weights_omitted(objects, oid) for _, oid in published):
        return Check.skipped(name, "the bundle omits the weights and optimizer state a replay "
                             "of training needs", needs="weights")
    if run.params.get("compile"):
        return Check.skipped(name, "compiled passes (compile = true) are not replayed",
                             needs="model")
    journal = _rank0_steps(objects, run)
    total = run.params.get("steps")
    results = []
    for start, oid in published:
        count = min(options.steps, total - start) if isinstance(total, int) else 0
        if count <= 0:
            continue
        results.append(_replay_from(objects, run, start, oid, count, journal, checkpoints,
                                    options.device, deadline))
    precision = "bf16" if options.device == "cuda" and run.params.get("device") == "cuda" \
        else "fp32"
    where = f"{options.device} {precision}"
    replayed = [s for r in results for s in r.steps]
    recomputed = {"replayed": replayed, "from": [r.start for r in results],
                  "device": options.device, "precision": precision,
                  "relative_l2": [r.relative_l2 for r in results],
                  "max_abs": [r.max_abs for r in results]}
    if not replayed:
        left = sum(r.left for r in results)
        why = (f"the time bound left {left} update(s) unreplayed" if left
               else "no update follows the published states")
        return Check.skipped(name, why, needs="model", recomputed=recomputed)
    distance = "; ".join(
        f"at step {r.steps[-1]} relative L2 {r.relative_l2:.3g}, max |Δ| {r.max_abs:.3g} "
        "from the checkpoint's weights" for r in results
        if r.steps and r.relative_l2 is not None and r.max_abs is not None)
    summary = (f"updates {_span(replayed)} replayed from the state of step(s) "
               f"{', '.join(str(r.start) for r in results)} on {where}; "
               f"{sum(r.compared for r in results)} digest(s) compared")
    if distance:
        summary += f"; {distance}"
    differing = [d for r in results for d in r.differing]
    left = sum(r.left for r in results)
    if differing and not same_hardware(run, options.device):
        return Check.skipped(name, f"{summary}; trained on {run.params.get('device')} with "
                             f"{run.params.get('world')} rank(s), so not bit for bit: "
                             + "; ".join(differing[:3]), needs="model", recomputed=recomputed)
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
            entries = read_lines(objects.bytes(record["entries"]), "journal")
        except RecordParseError as exc:
            raise Unusable(record["entries"], exc.message) from None
        steps = {e["step"]: e for e in effective_steps(entries) if isinstance(e.get("step"), int)}
        agreed = {e["step"]: e["parameters"] for e in entries
                  if e.get("event") == "agreed" and isinstance(e.get("step"), int)}
        return steps, agreed
    raise Unusable(run.id, "no journal of rank 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class _Document:
    input_ids: list[int]
    labels: list[int]
    weight: int

    @property
    def targets(self) -> int:
        return sum(1 for t in self.labels if t != -100)


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
                lines = read_lines(objects.bytes(record["records"]), key)
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
        self._cache: dict[int, _Document] = {}

    def __getitem__(self, index: int) -> _Document:
        if index not in self._cache:
            try:
                ids, labels = _encode(self.lines[index], self._render, self._tokenizer,
                                      self._turn)
            except (TemplateError, ValueError) as exc:
                raise Unusable(self.ids[index], f"cannot be tokenised: {exc}") from None
            self._cache[index] = _Document(input_ids=ids, labels=labels,
                                           weight=self.weights[index])
        return self._cache[index]


@contextlib.contextmanager
def _determinism(on: bool) -> Iterator[None]:
    """The run's deterministic algorithms for the replay, and the process's flags after it."""
    import torch

    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(on)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


def _replay_from(objects: Objects, run: Run, start: int, checkpoint: str, count: int,
                 journal: tuple[dict[int, Mapping[str, Any]], dict[int, str]],
                 checkpoints: Mapping[int, str], device: str,
                 deadline: float | None) -> Replayed:
    import torch

    record = objects.record_of(checkpoint, "checkpoint/1")
    state, problems = state_record_problems(objects, run, start, record)
    if state is None:
        raise Unusable(record["state"], "; ".join(problems))
    entries = objects.record_of(record["state"], "tree/1")["entries"]
    tensors = _load_safetensors(objects, entries[STATE_TENSORS]["id"])
    steps, agreed = journal
    docs = _Documents(objects, run)
    params = run.params
    world = params.get("world", 1)
    autocast = device == "cuda" and params.get("device") == "cuda"
    differing: list[str] = []
    replayed: list[int] = []
    compared = 0
    with _model(objects, checkpoint, device) as model, \
            _determinism(bool(params.get("deterministic", True))), \
            torch.random.fork_rng(devices=[torch.device(device)] if device == "cuda" else []):
        if "rng/0/torch" in tensors:
            torch.set_rng_state(tensors["rng/0/torch"])
        if device == "cuda" and "rng/0/cuda" in tensors:
            torch.cuda.set_rng_state(tensors["rng/0/cuda"])
        model.config.use_cache = False
        if params.get("gradient_checkpointing"):
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        optimizer = _optimizer(model, state, tensors, params, device)
        for index in range(start, start + count):
            if deadline is not None and time.monotonic() > deadline:
                break
            step = index + 1
            entry = steps.get(step)
            if entry is None or not isinstance(entry.get("indices"), list):
                differing.append(f"step {step}: the journal has no batch to replay")
                break
            loss, norm, lr = _update(model, optimizer, docs, entry["indices"], params,
                                     index=index, world=world, autocast=autocast,
                                     device=device)
            replayed.append(step)
            what = []
            for key, mine in (("loss", loss), ("grad_norm", norm), ("lr", lr)):
                if entry.get(key) != mine:
                    what.append(f"{key} {mine!r}, the journal's {entry.get(key)!r}")
            expected = entry.get("parameters", agreed.get(step))
            if expected is not None:
                compared += 1
                digest = parameter_digest(model)
                if digest != expected:
                    what.append(f"parameter digest {digest[:16]}…, the journal's "
                                f"{str(expected)[:16]}…")
            if what:
                differing.append(f"step {step}: " + ", ".join(what))
        distance = (_distance(objects, model, checkpoints[replayed[-1]])
                    if replayed and replayed[-1] in checkpoints else (None, None))
    return Replayed(start=start, steps=tuple(replayed), differing=tuple(differing),
                    compared=compared, relative_l2=distance[0], max_abs=distance[1],
                    left=count - len(replayed))


def _load_safetensors(objects: Objects, oid: str) -> dict[str, Any]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    with objects.as_file(oid, "optimizer.safetensors") as path:
        try:
            return load_file(str(path))
        except (SafetensorError, OSError, ValueError) as exc:
            raise Unusable(oid, f"is not a safetensors file ({exc})") from None


def _optimizer(model: Any, state: Mapping[str, Any], tensors: Mapping[str, Any],
               params: Mapping[str, Any], device: str) -> Any:
    """AdamW as the run made it (docs/experiment.md §3.5), loaded with the published state."""
    import torch

    named = dict(model.named_parameters())
    groups = state["groups"]
    missing = [n for g in groups for n in g["params"] if n not in named]
    if missing:
        raise Unusable(str(state.get("step")), f"names parameters the model lacks: {missing[:3]}")
    betas = params.get("betas", [0.9, 0.95])
    optimizer = torch.optim.AdamW(
        [{"params": [named[n] for n in g["params"]], "weight_decay": g["weight_decay"]}
         for g in groups],
        lr=params.get("lr", 3e-5), betas=(betas[0], betas[1]), eps=params.get("eps", 1e-8),
        fused=True if device == "cuda" else None)
    saved = optimizer.state_dict()
    values: dict[int, dict[str, Any]] = {}
    index = 0
    for group in groups:
        for name in group["params"]:
            found = {k: tensors[f"{k}/{name}"] for k in OPTIMIZER_KEYS if f"{k}/{name}" in tensors}
            if found:
                if set(found) != set(OPTIMIZER_KEYS) or found["exp_avg"].shape != named[
                        name].shape or found["exp_avg_sq"].shape != named[name].shape:
                    raise Unusable(name, "its published AdamW state is incomplete or misshapen")
                values[index] = found
            index += 1
    for saved_group, group in zip(saved["param_groups"], groups, strict=True):
        saved_group["lr"] = group["lr"]
    optimizer.load_state_dict({"state": values, "param_groups": saved["param_groups"]})
    return optimizer


def _update(model: Any, optimizer: Any, docs: _Documents, batch: list[int],
            params: Mapping[str, Any], *, index: int, world: int, autocast: bool,
            device: str) -> tuple[float, float, float]:
    """One update (docs/experiment.md §3.3): returns the objective, the gradient norm before
    clipping and the learning rate, as the journal records them."""
    import torch

    if not all(isinstance(i, int) and 0 <= i < len(docs.ids) for i in batch):
        raise Unusable("journal", "a batch names a document index the inputs lack")
    weighted_targets = sum(docs[i].weight * docs[i].targets for i in batch)
    lr = learning_rate(index, lr=params.get("lr", 3e-5), warmup=params.get("warmup", 8),
                       steps=params["steps"])
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    trained = list(model.parameters())
    size = params.get("micro_batch", 1)
    shares, losses = [], []
    for rank in range(world):
        local = batch[rank::world]
        if world > 1:
            for p in trained:
                p.grad = None
        weighted = torch.zeros((), dtype=torch.float64, device=device)
        for start in range(0, len(local), size):
            group = local[start:start + size]
            if len(group) == 1:
                doc = docs[group[0]]
                sums = _loss_sums(model, [doc], device, autocast, padded=False)
                (sums[0] * (world * doc.weight / weighted_targets)).backward()
            else:
                sums = _loss_sums(model, [docs[i] for i in group], device, autocast,
                                  padded=True)
                scale = [world * docs[i].weight / weighted_targets for i in group]
                (sums * torch.tensor(scale, device=device)).sum().backward()
            for i, loss_sum in zip(group, sums.detach().double(), strict=True):
                weighted += docs[i].weight * loss_sum
        losses.append(weighted)
        if world > 1:  # DDP scales each rank's gradient by 1/W, then sums them
            shares.append([None if p.grad is None else p.grad.mul(1.0 / world)
                           for p in trained])
    if world > 1:
        for position, p in enumerate(trained):
            parts = [share[position] for share in shares if share[position] is not None]
            p.grad = None if not parts else _sum(parts)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), params.get("clip", 1.0))
    optimizer.step()
    total = _sum(losses)
    return total.item() / weighted_targets, grad_norm.item(), lr


def _sum(parts: list[Any]) -> Any:
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total


def _loss_sums(model: Any, group: Sequence[_Document], device: str, autocast: bool, *,
               padded: bool) -> Any:
    """Summed FP32 next-token cross-entropy of each document: one unpadded pass for one
    document, else one right-padded pass (padding masked and unlabelled)."""
    import torch
    import torch.nn.functional as F

    rows, longest = len(group), max(len(doc.input_ids) for doc in group)
    input_ids = torch.zeros((rows, longest), dtype=torch.long)
    labels = torch.full((rows, longest), -100, dtype=torch.long)
    mask = torch.zeros((rows, longest), dtype=torch.long)
    for row, doc in enumerate(group):
        n = len(doc.input_ids)
        input_ids[row, :n] = torch.tensor(doc.input_ids)
        labels[row, :n] = torch.tensor(doc.labels)
        mask[row, :n] = 1
    masked = padded and bool((mask == 0).any())
    context = (torch.autocast("cuda", dtype=torch.bfloat16) if autocast
               else contextlib.nullcontext())
    with context:
        logits = model(input_ids=input_ids.to(device),
                       attention_mask=mask.to(device) if masked else None,
                       use_cache=False).logits
    shifted = logits[:, :-1, :].float()
    targets = labels[:, 1:].to(shifted.device)
    if not padded:
        total = F.cross_entropy(shifted.reshape(-1, shifted.shape[-1]), targets.reshape(-1),
                                ignore_index=-100, reduction="sum")
        return total.reshape(1)
    per_token = F.cross_entropy(shifted.reshape(-1, shifted.shape[-1]), targets.reshape(-1),
                                ignore_index=-100, reduction="none")
    return per_token.view(targets.shape).sum(dim=1)


def parameter_digest(model: Any) -> str:
    """BLAKE3 hex of the raw little-endian bytes of every parameter in registration order
    (tied ones once): the digest the ranks agree on (docs/experiment.md §3.7)."""
    import sys

    import torch

    hasher = blake3.blake3()
    for _name, param in model.named_parameters():
        flat = param.detach().to("cpu").contiguous().reshape(-1)
        raw = flat.view(torch.uint8)
        if sys.byteorder == "big" and flat.element_size() > 1:
            raw = raw.reshape(-1, flat.element_size()).flip(1).reshape(-1)
        hasher.update(memoryview(raw.numpy()))
    return hasher.hexdigest()


def _distance(objects: Objects, model: Any, checkpoint: str) -> tuple[float, float]:
    """Relative L2 distance and largest absolute difference of the model's parameters from
    the weight files of ``checkpoint``."""
    import torch

    files = objects.record_of(objects.record_of(checkpoint, "checkpoint/1")["files"], "tree/1")
    stored: dict[str, Any] = {}
    for rel, entry in sorted(files["entries"].items()):
        if rel.endswith(".safetensors"):
            stored.update(_load_safetensors(objects, entry["id"]))
    diff = ref = 0.0
    worst = 0.0
    for name, param in model.named_parameters():
        if name not in stored or tuple(stored[name].shape) != tuple(param.shape):
            raise Unusable(checkpoint, f"its weights lack parameter {name} as replayed")
        mine = param.detach().to("cpu", torch.float64)
        theirs = stored[name].to(torch.float64)
        delta = mine - theirs
        diff += float((delta * delta).sum())
        ref += float((theirs * theirs).sum())
        worst = max(worst, float(delta.abs().max())) if delta.numel() else worst
    return math.sqrt(diff) / max(math.sqrt(ref), 1e-30), worst
