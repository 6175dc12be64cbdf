"""The reference for benchmarks/train.py: a bare PyTorch training loop of the same shape.

Plain torch and transformers only (no nscas imports): load an HF model directory in FP32,
AdamW with the published hyperparameters, BF16 autocast on CUDA, gradient clipping, DDP with
its default settings when launched with more than one rank. No journals, digests or
checkpoints. It reads the same tokenised document file (JSONL with ``input_ids``, ``labels``,
``weight``) that the nscas run reads and optimises the same objective, ``Σ w_i·loss_i / S``.

Two shapes of update (``--mode``):
  per-document  one forward/backward per local document, gradients accumulated under
                ``no_sync`` and all-reduced with the last one (what nscas does);
  batched       the local documents stacked into one ``[b, length]`` forward (equal lengths
                only): the fastest plain loop.

Every rank writes ``bare-rank{r}.json`` into --out: per-update seconds (CUDA synchronised
before each clock read), the wall time between consecutive updates, and peak memory (CUDA:
max allocated since the model was loaded; CPU: the process's peak RSS).

Run through PyTorch's launcher, one process per rank (world 1 works without it too)::

    python -m torch.distributed.run --nproc-per-node 2 benchmarks/bare_loop.py \\
        --model-dir BASE --documents docs.jsonl --steps 14 --batch 8 --device cpu --out DIR
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import random
import resource
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from transformers import AutoModelForCausalLM

IGNORE = -100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--documents", type=Path, required=True, help="tokenised JSONL")
    parser.add_argument("--steps", type=int, required=True, help="updates, warm-up included")
    parser.add_argument("--batch", type=int, default=8, help="global batch (documents)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--mode", choices=("per-document", "batched"), default="per-document")
    parser.add_argument("--deterministic", choices=("on", "off"), default="off")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per rank")
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--warmup", type=int, default=8, help="updates of linear warmup")
    parser.add_argument("--schedule-seed", type=int, default=20260913)
    parser.add_argument("--out", type=Path, required=True, help="directory for the results")
    args = parser.parse_args()

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.set_num_threads(args.threads)
    if args.batch % world:
        raise SystemExit(f"batch {args.batch} is not divisible by world {world}")
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if args.deterministic == "on":
        # The same switches as nscas; CUBLAS_WORKSPACE_CONFIG comes from the environment.
        torch.use_deterministic_algorithms(True)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    torch.manual_seed(20260913 + rank)
    if world > 1:
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            timeout=timedelta(seconds=600),
            device_id=device if device.type == "cuda" else None,
        )
    try:
        result = train(args, rank=rank, world=world, device=device)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"bare-rank{rank}.json").write_text(json.dumps(result, indent=1) + "\n")


def train(args: argparse.Namespace, *, rank: int, world: int, device: torch.device) -> dict[str, Any]:
    docs = [json.loads(line) for line in args.documents.read_text().splitlines() if line]
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32).to(device)
    model.config.use_cache = False
    model.train()
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
    )
    net: torch.nn.Module = model
    if world > 1:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            net = DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None
            )
    autocast = (
        (lambda: torch.autocast("cuda", dtype=torch.bfloat16))
        if device.type == "cuda"
        else contextlib.nullcontext
    )
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    order = _schedule(len(docs), args.steps * args.batch, args.schedule_seed)
    seconds: list[float] = []
    ends: list[float] = []
    losses: list[float] = []
    tokens: list[int] = []
    for step in range(args.steps):
        batch = [docs[i] for i in order[step * args.batch : (step + 1) * args.batch]]
        local = batch[rank::world]
        weighted_targets = sum(d["weight"] * _targets(d) for d in batch)
        for group in optimizer.param_groups:
            group["lr"] = _learning_rate(step, lr=args.lr, warmup=args.warmup, steps=args.steps)
        _synchronise(device)
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        if args.mode == "batched":
            loss = _batched(net, local, device, autocast, world / weighted_targets)
            loss.backward()
            weighted = loss.detach().double() * weighted_targets / world
        else:
            weighted = torch.zeros((), dtype=torch.float64, device=device)
            for position, doc in enumerate(local):
                last = position == len(local) - 1
                sync = contextlib.nullcontext() if last or net is model else net.no_sync()
                with sync:
                    ids = torch.tensor([doc["input_ids"]], device=device)
                    labels = torch.tensor([doc["labels"]], device=device)
                    with autocast():
                        logits = net(input_ids=ids).logits
                    loss_sum = _loss_sum(logits, labels)
                    (loss_sum * (world * doc["weight"] / weighted_targets)).backward()
                weighted += doc["weight"] * loss_sum.detach().double()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        _synchronise(device)
        seconds.append(time.perf_counter() - started)
        if world > 1:
            dist.all_reduce(weighted)
        losses.append(weighted.item() / weighted_targets)
        tokens.append(sum(len(d["input_ids"]) for d in batch))
        ends.append(time.perf_counter())

    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    return {
        "rank": rank,
        "world": world,
        "mode": args.mode,
        "seconds": seconds,
        "periods": [b - a for a, b in itertools.pairwise(ends)],
        "losses": losses,
        "tokens": tokens,
        "peak_memory_bytes": peak,
        "threads": torch.get_num_threads(),
    }


def _batched(
    net: torch.nn.Module, local: list[dict[str, Any]], device: torch.device, autocast: Any,
    scale: float,
) -> torch.Tensor:
    """One forward over the stacked local documents; returns Σ w_i·loss_i · scale."""
    if len({len(d["input_ids"]) for d in local}) != 1:
        raise SystemExit("--mode batched needs documents of one length")
    ids = torch.tensor([d["input_ids"] for d in local], device=device)
    labels = torch.tensor([d["labels"] for d in local], device=device)
    weights = torch.tensor([float(d["weight"]) for d in local], device=device)
    with autocast():
        logits = net(input_ids=ids).logits
    return (_loss_sums(logits, labels) * weights).sum() * scale


def _loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """FP32 summed next-token cross-entropy of one document (``[1, length]``)."""
    shifted = logits[:, :-1, :].float()
    return F.cross_entropy(
        shifted.reshape(-1, shifted.shape[-1]),
        labels[:, 1:].reshape(-1),
        ignore_index=IGNORE,
        reduction="sum",
    )


def _loss_sums(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-document FP32 summed next-token cross-entropy, ``[b]``."""
    shifted = logits[:, :-1, :].float()
    per_token = F.cross_entropy(
        shifted.reshape(-1, shifted.shape[-1]),
        labels[:, 1:].reshape(-1),
        ignore_index=IGNORE,
        reduction="none",
    )
    return per_token.view(labels.shape[0], -1).sum(dim=1)


def _schedule(count: int, needed: int, seed: int) -> list[int]:
    """Document order: reshuffle ``range(count)`` with one seeded RNG until enough indices
    exist (the order nscas uses, so both loops see the same batches)."""
    rng = random.Random(seed)
    order: list[int] = []
    while len(order) < needed:
        epoch = list(range(count))
        rng.shuffle(epoch)
        order.extend(epoch)
    return order


def _learning_rate(step: int, *, lr: float, warmup: int, steps: int) -> float:
    """Linear warmup, then cosine from lr to 0.1·lr (the published schedule)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if steps - warmup <= 1:
        return lr
    progress = (step - warmup) / (steps - warmup - 1)
    return lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def _targets(doc: dict[str, Any]) -> int:
    return sum(1 for t in doc["labels"] if t != IGNORE)


def _synchronise(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


if __name__ == "__main__":
    main()
