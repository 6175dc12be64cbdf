"""The training loop of docs/experiment.md §3: one AdamW update per global batch of documents.

The objective of an update is ``Σ w_i·loss_i / S`` over the global batch, with ``loss_i`` the
summed token cross-entropy of document i and ``S = Σ w_i·targets_i``. Rank r of W takes
``batch[r::W]`` and backpropagates ``loss_i·W·w_i/S`` per local document; DDP's gradient
average (a sum divided by W) then gives exactly the single-process gradient. Gradients
accumulate locally under ``no_sync`` and are all-reduced once, with the last local document.

``micro_batch`` > 1 groups a rank's documents (in schedule order) into right-padded passes of
up to that many and backpropagates ``Σ_group loss_i·W·w_i/S`` per pass: the same objective
and the same all-reduce, with fewer and larger kernels.

``sync = "diloco"`` (docs/experiment.md §3.13) makes every rank a learner of its own: at
step s rank r still takes ``batch[r::W]`` of the seeded schedule's batch s, but backpropagates
``loss_i·w_i/S_r`` with ``S_r`` its own documents' weighted target count, clips its own
gradient and steps its own optimizer; nothing is communicated. After every ``inner_steps``
steps ``diloco.OuterStep`` averages the pseudo-gradients and every rank adopts θ_outer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from nscas.errors import RecipeError
from nscas.recipes.common.tokenise import IGNORE_INDEX, token_loss_sum, token_loss_sums
from nscas.recipes.train.checkpoints import CheckpointPaths
from nscas.recipes.train.config import TrainParams
from nscas.recipes.train.diloco import OuterRecord, OuterStep
from nscas.recipes.train.documents import TrainDocument
from nscas.recipes.train.exchange import (
    HostStaging,
    agree_on_parameters,
    gather_objects,
    gather_rng_states,
    parameter_digest,
)
from nscas.recipes.train.journal import Journal
from nscas.recipes.train.schedule import document_schedule, learning_rate, rank_share


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where this process sits in the run."""

    rank: int
    """Global rank."""
    world: int
    """Number of ranks."""
    device: torch.device
    """The device this rank computes on."""
    control: Any
    """A CPU (gloo) process group with a patient timeout, for digests, RNG and barriers."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRecord:
    """What one update did; every rank records the same global values."""

    step: int
    """1-based number of the update."""
    loss: float
    """The objective: Σ w_i·loss_i / S over the global batch."""
    targets: int
    """Labelled tokens in the global batch."""
    weighted_targets: int
    """S = Σ w_i·targets_i over the global batch."""
    lr: float
    grad_norm: float
    """Global gradient norm before clipping."""
    documents: tuple[str, ...]
    """IDs of the global batch's documents, in schedule order."""
    indices: tuple[int, ...]
    """Their positions in the document list (the schedule itself)."""
    tokens: int
    """Input tokens in the global batch."""
    seconds: float
    """Wall time of the update: forward, backward, gradient exchange, optimizer step."""
    bytes_communicated: int
    """Gradient bytes all-reduced in this update: every trained parameter's (0 for one rank)."""
    parameters: str | None = None
    """BLAKE3 hex of this rank's parameters after the update (``parameter_digests``), or None."""
    local_indices: tuple[int, ...] | None = None
    """diloco: the schedule positions this rank trained on (``indices[rank::world]``)."""
    local_weighted_targets: int | None = None
    """diloco: ``S_r``, the weighted target count of this rank's documents, which normalises
    its loss."""

    def entry(self, *, rank: int) -> dict[str, Any]:
        """The journal entry of this update (before chaining)."""
        return {
            "rank": rank,
            "step": self.step,
            "loss": self.loss,
            "targets": self.targets,
            "weighted_targets": self.weighted_targets,
            "lr": self.lr,
            "grad_norm": self.grad_norm,
            "documents": list(self.documents),
            "indices": list(self.indices),
            "tokens": self.tokens,
            "seconds": self.seconds,
            "bytes_communicated": self.bytes_communicated,
            **({"parameters": self.parameters} if self.parameters is not None else {}),
            **({"local_indices": list(self.local_indices),
                "local_weighted_targets": self.local_weighted_targets}
               if self.local_indices is not None else {}),
        }


CheckpointWriter = Callable[[int, list[dict[str, Any]], list[Any] | None], CheckpointPaths]
"""``(step, every rank's RNG state, every rank's optimizer state or None) -> paths``: writes a
checkpoint (called on rank 0 only); the optimizer states are gathered for diloco only, where
every rank's inner optimizer is its own."""
CheckpointCallback = Callable[[int, Path, Path], None]
"""``on_checkpoint(step, hf_dir, state_file)`` after a checkpoint is complete (rank 0 only)."""


def configure_determinism(*, deterministic: bool) -> None:
    """Deterministic kernels and no TF32 (docs/experiment.md §3); CUDA also needs
    ``CUBLAS_WORKSPACE_CONFIG`` set before it starts, which the launcher does."""
    if not deterministic:
        return
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def make_optimizer(model: torch.nn.Module, params: TrainParams) -> torch.optim.Optimizer:
    """AdamW (or plain SGD, ``optimizer = "sgd"``) with weight decay on tensors of two or
    more dimensions only."""
    trained = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in trained if p.ndim >= 2], "weight_decay": params.weight_decay},
        {"params": [p for p in trained if p.ndim < 2], "weight_decay": 0.0},
    ]
    # On CUDA one fused kernel updates every tensor (the same AdamW, deterministic); the
    # per-tensor-list default costs several times its launches for 1.7B parameters.
    on_cuda = bool(trained) and trained[0].is_cuda
    if params.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=params.lr)
    return torch.optim.AdamW(
        groups, lr=params.lr, betas=params.betas, eps=params.eps, fused=True if on_cuda else None
    )


def gradient_bytes(model: torch.nn.Module) -> int:
    """Bytes of every trained parameter's gradient: what DDP all-reduces once per update.

    DDP's buckets hold exactly the gradients of the parameters that require them (no unused
    parameters are looked for), and every synchronised backward reduces every bucket.
    """
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def document_loss_sum(
    net: torch.nn.Module, doc: TrainDocument, *, device: torch.device
) -> torch.Tensor:
    """Summed FP32 token cross-entropy of one document (BF16 autocast on CUDA only)."""
    input_ids = torch.tensor([doc.input_ids], dtype=torch.long, device=device)
    labels = torch.tensor([doc.labels], dtype=torch.long, device=device)
    with _autocast(device):
        logits = net(input_ids=input_ids, use_cache=False).logits
    return token_loss_sum(logits, labels)


def documents_loss_sums(
    net: torch.nn.Module, group: Sequence[TrainDocument], *, device: torch.device,
    shape: tuple[int, int] | None = None,
) -> torch.Tensor:
    """``document_loss_sum`` of each document of ``group`` from one forward pass, ``[len(group)]``.

    Shorter documents are padded on the right: padding is masked out of attention and
    labelled ``IGNORE_INDEX``, so a document's tokens see only its own earlier tokens at their
    own positions. Without padding no mask is passed (the plain causal kernels run).
    ``shape`` (rows, length) pads every pass to one shape, for a compiled model: rows past the
    group's hold one masked-in pad token each, labelled ``IGNORE_INDEX``, so they add nothing.
    """
    rows, longest = shape or (len(group), max(len(doc.input_ids) for doc in group))
    input_ids = torch.zeros((rows, longest), dtype=torch.long)
    labels = torch.full((rows, longest), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((rows, longest), dtype=torch.long)
    mask[len(group):, 0] = 1  # an empty row attends to its first token: no softmax of nothing
    for row, doc in enumerate(group):
        n = len(doc.input_ids)
        input_ids[row, :n] = torch.tensor(doc.input_ids)
        labels[row, :n] = torch.tensor(doc.labels)
        mask[row, :n] = 1
    padded = shape is not None or bool((mask == 0).any())
    with _autocast(device):
        logits = net(
            input_ids=input_ids.to(device),
            attention_mask=mask.to(device) if padded else None,
            use_cache=False,
        ).logits
    return token_loss_sums(logits, labels.to(device))[: len(group)]


def _autocast(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def run_loop(
    model: torch.nn.Module,
    docs: Sequence[TrainDocument],
    params: TrainParams,
    *,
    place: Placement,
    optimizer: torch.optim.Optimizer,
    start_step: int,
    journal: Journal,
    write_checkpoint: CheckpointWriter,
    on_step: Callable[[StepRecord], None],
    on_checkpoint: CheckpointCallback,
    outer: OuterStep | None = None,
) -> None:
    """Make updates ``start_step + 1 .. params.steps``, each reported to ``on_step``.

    Ranks agree on a parameter digest first and at every checkpoint (the final step is always
    one); every update is journaled and fsync'ed before the next begins. With ``outer``
    (``sync = "diloco"``) every ``inner_steps``-th update is followed by an outer step, whose
    digest the ranks agree on before it is journaled.
    """
    schedule = document_schedule(
        len(docs), steps=params.steps, batch=params.batch, seed=params.schedule_seed
    )
    where = f"after resuming at step {start_step}" if start_step else "after loading"
    _agree(model, place=place, journal=journal, step=start_step, where=where)

    # A document's target count scans its labels; count once, not twice per update.
    targets = [doc.targets for doc in docs]
    diloco = outer is not None
    communicated = gradient_bytes(model) if place.world > 1 and not diloco else 0
    net = wrap_ddp(model, params, place=place) if place.world > 1 and not diloco else model
    shape = None
    if params.compile:
        # torch.compile of a Module returns an OptimizedModule (a Module); its stubs say Callable.
        net = cast(torch.nn.Module, torch.compile(net, dynamic=False))
        shape = (params.micro_batch, compiled_length(docs))
    model.train()
    # One pinned host buffer for every per-update digest of a GPU model (none on the CPU).
    staging = HostStaging.for_model(model) if params.parameter_digests else None

    for index in range(start_step, params.steps):
        record = _update(
            net, model, docs, schedule[index], params, place=place, optimizer=optimizer,
            index=index, communicated=communicated, targets=targets, shape=shape,
            local_objective=diloco,
        )
        every = params.parameter_digests
        if every and record.step % every == 0:
            # After the update and outside its timing: the numerics are untouched.
            record = dataclasses.replace(record,
                                         parameters=parameter_digest(model, staging).hex())
        journal.append(record.entry(rank=place.rank))
        on_step(record)
        if outer is not None and record.step % params.inner_steps == 0:
            _outer_step(outer, model, place=place, journal=journal, step=record.step,
                        inner_steps=params.inner_steps)
        if record.step in params.checkpoint_set:
            _agree(model, place=place, journal=journal, step=record.step,
                   where=f"at step {record.step}")
            rng = gather_rng_states(place.device, group=place.control)
            inner = (gather_objects(_to_cpu(optimizer.state_dict()), group=place.control)
                     if diloco else None)
            if place.rank == 0:
                paths = write_checkpoint(record.step, rng, inner)
                on_checkpoint(record.step, paths.hf_dir, paths.state_file)
            # The others wait on the patient group while rank 0 writes.
            dist.barrier(group=place.control)


def _outer_step(outer: OuterStep, model: torch.nn.Module, *, place: Placement,
                journal: Journal, step: int, inner_steps: int) -> None:
    norm, seconds = outer.step()
    number = step // inner_steps
    if not math.isfinite(norm):
        raise RecipeError(f"training diverged at outer step {number}: pseudo-gradient norm {norm}")
    # Outside the timing: every rank's digest, exchanged before anything is journaled.
    digest = agree_on_parameters(model, group=place.control, where=f"after outer step {number}")
    journal.append(OuterRecord(step=step, outer_step=number, pseudo_gradient_norm=norm,
                               bytes_sent=outer.bytes_sent, seconds=seconds,
                               parameters=digest).entry(rank=place.rank))


def _to_cpu(value: Any) -> Any:
    """An optimizer state dict with every tensor on the CPU (to gather and pickle it)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_cpu(v) for v in value]
    return value


def compiled_length(docs: Sequence[TrainDocument]) -> int:
    """The one pass length of a compiled run: the longest document, rounded up to 64."""
    longest = max(len(doc.input_ids) for doc in docs)
    return -(-longest // 64) * 64


def wrap_ddp(
    model: torch.nn.Module, params: TrainParams, *, place: Placement
) -> DistributedDataParallel:
    """The model under DDP as this loop uses it, on the default process group."""
    # Parameters were just proven equal by digest, so DDP's initial broadcast (the whole
    # model, over TCP between hosts) is skipped; buffers here are derived, never trained,
    # so they are not broadcast before every forward either. ``broadcast_buffers`` says so
    # on every torch the project allows (its successor exists from 2.13 on only).
    # No comm hook: DDP's own C++ all-reduce (average) runs without a Python call per
    # bucket, and gradients live in the buckets (no copy back after each reduce).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return DistributedDataParallel(
            model,
            device_ids=[place.device.index] if place.device.type == "cuda" else None,
            init_sync=False,
            broadcast_buffers=False,
            gradient_as_bucket_view=True,
            bucket_cap_mb=params.bucket_mb,
        )


def _agree(
    model: torch.nn.Module, *, place: Placement, journal: Journal, step: int, where: str
) -> None:
    digest = agree_on_parameters(model, group=place.control, where=where)
    journal.append({"event": "agreed", "rank": place.rank, "step": step, "parameters": digest})


def _update(
    net: torch.nn.Module,
    model: torch.nn.Module,
    docs: Sequence[TrainDocument],
    batch: list[int],
    params: TrainParams,
    *,
    place: Placement,
    optimizer: torch.optim.Optimizer,
    index: int,
    communicated: int,
    targets: Sequence[int],
    shape: tuple[int, int] | None = None,
    local_objective: bool = False,
) -> StepRecord:
    world, device = place.world, place.device
    local = rank_share(batch, rank=place.rank, world=world)
    weighted_targets = sum(docs[i].weight * targets[i] for i in batch)
    # ddp: loss_i·W·w_i/S, which DDP's average turns into the global objective's gradient;
    # diloco: loss_i·w_i/S_r, the rank's own objective (W = 1 and S = S_r below).
    local_weighted = sum(docs[i].weight * targets[i] for i in local)
    scale_world, normaliser = (1, local_weighted) if local_objective else (world, weighted_targets)
    lr = learning_rate(index, lr=params.lr, warmup=params.warmup, steps=params.steps)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr

    _synchronise(device)
    started = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    weighted_loss = torch.zeros((), dtype=torch.float64, device=device)
    size = params.micro_batch
    passes = [local[k : k + size] for k in range(0, len(local), size)]
    for position, group in enumerate(passes):
        last = position == len(passes) - 1
        sync = (contextlib.nullcontext() if last or world == 1 or local_objective
                else net.no_sync())  # type: ignore[operator]  # DDP's, maybe through compile's wrapper
        with sync:
            if len(group) == 1 and shape is None:  # docs/experiment.md §3's method, bit for bit
                doc = docs[group[0]]
                sums = document_loss_sum(net, doc, device=device).reshape(1)
                (sums[0] * (scale_world * doc.weight / normaliser)).backward()
            else:
                sums = documents_loss_sums(net, [docs[i] for i in group], device=device,
                                           shape=shape)
                scale = [scale_world * docs[i].weight / normaliser for i in group]
                (sums * torch.tensor(scale, device=device)).sum().backward()
        for i, loss_sum in zip(group, sums.detach().double(), strict=True):
            weighted_loss += docs[i].weight * loss_sum
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), params.clip)
    optimizer.step()
    _synchronise(device)
    seconds = time.perf_counter() - started

    if world > 1 and not local_objective:
        dist.all_reduce(weighted_loss)
    loss = weighted_loss.item() / normaliser
    norm = grad_norm.item()
    step = index + 1
    if not (math.isfinite(loss) and math.isfinite(norm)):
        raise RecipeError(f"training diverged at step {step}: loss {loss}, gradient norm {norm}")
    return StepRecord(
        step=step,
        loss=loss,
        targets=sum(targets[i] for i in batch),
        weighted_targets=weighted_targets,
        lr=lr,
        grad_norm=norm,
        documents=tuple(docs[i].id for i in batch),
        indices=tuple(batch),
        tokens=sum(len(docs[i].input_ids) for i in batch),
        seconds=seconds,
        bytes_communicated=communicated,
        local_indices=tuple(local) if local_objective else None,
        local_weighted_targets=local_weighted if local_objective else None,
    )


def _synchronise(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
