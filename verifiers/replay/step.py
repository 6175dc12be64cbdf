"""The arithmetic of a training replay, in a process of its own.

``python -m nscas.verifiers.replay.step REQUEST.json RESULT.json`` makes, for each ``Request``
of the file (one train run's starting points, in order), the updates it names from a published
optimizer state, or from the run's base with a fresh AdamW, and writes a ``Result`` each: per update the objective, the gradient norm before clipping and the
BLAKE3 parameter digest, the distance from a checkpoint's weights at the last replayed step,
and the numeric settings it computed under. ``replay.training`` does everything else (the journal, the state's record, the documents'
tokens, the comparison) and starts this process through ``compute``, once per run: a
run's starting points share one process (its imports are most of a small replay's time), each
from the random generators a fresh process would have.

Why a process of its own: a ``deterministic`` run on CUDA computes with cuBLAS's fixed
workspace (docs/format.md §7.8), which ``CUBLAS_WORKSPACE_CONFIG`` sets only before CUDA
starts in a process, and the verify process may have started CUDA already (the answer
replay). A fresh process also starts from torch's default flags, so the verify process's are
never changed, and a non-deterministic run is replayed with nothing set, as it ran.

Nothing here imports nscas (docs/format.md §7.1): plain torch, transformers and safetensors.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import blake3

from .stepio import (
    CUBLAS_WORKSPACE,
    IGNORE,
    OPTIMIZER_KEYS,
    Document,
    Group,
    Measured,
    ReplayStepError,
    Request,
    Result,
    Settings,
    Update,
)

__all__ = ["Document", "Group", "Measured", "ReplayStepError", "Request", "Result", "Settings",
           "Update", "compute", "environment", "main", "replay", "replay_all"]


def environment(deterministic: bool, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The replay process's environment: ``base`` (the verify process's) with cuBLAS's fixed
    workspace for a deterministic run and without any workspace setting otherwise."""
    env = dict(os.environ if base is None else base)
    env.pop("CUBLAS_WORKSPACE_CONFIG", None)
    if deterministic:
        env["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE
    return env


def compute(requests: Sequence[Request], workdir: Path) -> list[Result]:
    """Run ``requests`` (of one run: one ``deterministic`` setting) in one replay process, in
    order (files in ``workdir``); a result each. Raises ``ReplayStepError`` when it cannot,
    naming what it could not use or how the process ended."""
    if len({r.deterministic for r in requests}) != 1:
        raise ValueError("one replay process computes under one deterministic setting")
    request_file, result_file = workdir / "request.json", workdir / "result.json"
    request_file.write_text(json.dumps([r.to_json() for r in requests]))
    result_file.unlink(missing_ok=True)
    module = __spec__.name if __spec__ is not None else "nscas.verifiers.replay.step"
    # -P: ``python -m`` would put the working directory first on sys.path, and an auditor's
    # directory holding a checkout of nscas (whose nscas/ has no verifiers) would shadow the
    # installed package.
    done = subprocess.run(
        [sys.executable, "-P", "-m", module, str(request_file),
         str(result_file)],
        env=environment(requests[0].deterministic), stdin=subprocess.DEVNULL,
        capture_output=True, text=True, check=False)
    if result_file.is_file():
        value = json.loads(result_file.read_text())
        if "error" in value:
            raise ReplayStepError(value["error"]["subject"], value["error"]["why"])
        return [Result.from_json(v) for v in value["results"]]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    raise ReplayStepError("the replay process", f"exited with code {done.returncode}"
                          + (f": {lines[-1].strip()}" if lines else ""))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        sys.stderr.write("usage: python -m nscas.verifiers.replay.step REQUEST.json RESULT.json\n")
        return 2
    started = time.monotonic()
    result_file = Path(args[1])
    try:
        values = json.loads(Path(args[0]).read_text())
        if not isinstance(values, list) or not values:
            raise ReplayStepError("the request file", "is not a list of requests")
        requests = [Request.from_json(v) for v in values]
        # One bound for the process: each request carries the time left when it was made.
        seconds = requests[0].seconds
        results = replay_all(requests, None if seconds is None else started + seconds)
    except ReplayStepError as exc:
        result_file.write_text(json.dumps({"error": {"subject": exc.subject, "why": exc.why}}))
        return 2
    result_file.write_text(json.dumps({"results": [asdict(r) for r in results]}))
    return 0


def replay_all(requests: Sequence[Request], deadline: float | None = None) -> list[Result]:
    """Each of ``requests`` in turn (until ``deadline``), each from torch's random generators
    as this process had them before the first: as if each had a process of its own. The
    settings are applied once, first, so each result says whether CUDA had started before
    them in this process."""
    import torch

    started = apply_settings(requests[0].deterministic)
    generator, seed = torch.get_rng_state(), torch.initial_seed()
    results = []
    for index, request in enumerate(requests):
        if index:
            torch.set_rng_state(generator)
            # torch.cuda.is_initialized has no annotations.
            if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
                torch.cuda.manual_seed_all(seed)  # a fresh process's CUDA generators
        results.append(replay(request, deadline, cuda_started_first=started))
    return results


def apply_settings(deterministic: bool) -> bool:
    """docs/format.md §7.8's settings of a deterministic run; nothing for another (a fresh
    process has torch's defaults). Returns whether CUDA had started before."""
    import torch

    # torch.cuda.is_initialized has no annotations.
    started = torch.cuda.is_available() and torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
    if deterministic:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE
        torch.use_deterministic_algorithms(True)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    return started


def replay(request: Request, deadline: float | None = None, *,
           cuda_started_first: bool | None = None) -> Result:
    """Make ``request``'s updates (until ``deadline``); the process's flags are left set.
    ``cuda_started_first``: what ``apply_settings`` found when this process applied them
    first (None: apply them now and report what it finds)."""
    found = apply_settings(request.deterministic)
    started = found if cuda_started_first is None else cuda_started_first
    import torch

    fresh = request.state_file is None
    if request.state_file is None:
        tensors: dict[str, Any] = {}
        if request.seed is not None:
            torch.manual_seed(request.seed)  # as the run's rank 0, before its model loaded
    else:
        tensors = _load_safetensors(request.state_file)
    device = request.device
    model = _load_model(request.model_dir, device)
    loaded = parameter_digest(model) if fresh else None
    if "rng/0/torch" in tensors:
        torch.set_rng_state(tensors["rng/0/torch"])
    if device == "cuda" and "rng/0/cuda" in tensors:
        torch.cuda.set_rng_state(tensors["rng/0/cuda"])
    model.config.use_cache = False
    if request.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    optimizer = _optimizer(model, request, tensors)
    settings = Settings(
        deterministic_algorithms=torch.are_deterministic_algorithms_enabled(),
        cublas_workspace_config=os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        cuda_started_first=started,
        matmul_tf32=bool(torch.backends.cuda.matmul.allow_tf32),
        cudnn_tf32=bool(torch.backends.cudnn.allow_tf32),
        cudnn_deterministic=bool(torch.backends.cudnn.deterministic),
        cudnn_benchmark=bool(torch.backends.cudnn.benchmark),
        attention=str(getattr(model.config, "_attn_implementation", None)),
        padding_idx=model.get_input_embeddings().padding_idx,
        threads=torch.get_num_threads())
    measured = []
    for update in request.updates:
        if deadline is not None and time.monotonic() > deadline:
            break
        loss, norm = _update(model, optimizer, request, update)
        measured.append(Measured(step=update.step, loss=loss, grad_norm=norm,
                                 parameters=parameter_digest(model)))
    distance: tuple[float | None, float | None] = (None, None)
    if measured and measured[-1].step in request.compare:
        distance = _distance(model, request.compare[measured[-1].step])
    return Result(settings=settings, updates=tuple(measured), relative_l2=distance[0],
                  max_abs=distance[1], loaded=loaded)


def _load_safetensors(path: str) -> dict[str, Any]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError) as exc:
        raise ReplayStepError(Path(path).name, f"is not a safetensors file ({exc})") from None


def _load_model(model_dir: str, device: str) -> Any:
    """The checkpoint in FP32 on ``device``, with transformers' default attention (SDPA
    where the architecture has it), as the run loaded its model."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # transformers: unannotated
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    except Exception as exc:  # transformers raises many kinds for a directory it cannot load
        raise ReplayStepError("the checkpoint", f"does not load as a model "
                              f"({type(exc).__name__}: {exc})") from None
    # transformers' decorated PreTrainedModel.to is typed as taking the model, not a device.
    return model.to(device)  # type: ignore[arg-type]


def _optimizer(model: Any, request: Request, tensors: Mapping[str, Any]) -> Any:
    """AdamW as the run made it (docs/experiment.md §3.5; fused on CUDA), loaded with the
    published state: ``load_state_dict`` puts each ``step`` on its parameter's device in
    FP32 for the fused kernel, as the run held it."""
    import torch

    named = dict(model.named_parameters())
    if request.state_file is None:  # docs/experiment.md §3.5: decay on 2+ dimensions only
        trained = [n for n, p in named.items() if p.requires_grad]
        request = replace(request, groups=(
            Group(params=tuple(n for n in trained if named[n].ndim >= 2),
                  weight_decay=request.weight_decay, lr=request.lr),
            Group(params=tuple(n for n in trained if named[n].ndim < 2), weight_decay=0.0,
                  lr=request.lr)))
    missing = [n for g in request.groups for n in g.params if n not in named]
    if missing:
        raise ReplayStepError("the published state", f"names parameters the model lacks: "
                              f"{missing[:3]}")
    optimizer = torch.optim.AdamW(
        [{"params": [named[n] for n in g.params], "weight_decay": g.weight_decay}
         for g in request.groups],
        lr=request.lr, betas=request.betas, eps=request.eps,
        fused=True if request.device == "cuda" else None)
    saved = optimizer.state_dict()
    values: dict[int, dict[str, Any]] = {}
    index = 0
    for group in request.groups:
        for name in group.params:
            found = {k: tensors[f"{k}/{name}"] for k in OPTIMIZER_KEYS if f"{k}/{name}" in tensors}
            if found:
                if set(found) != set(OPTIMIZER_KEYS) or found["exp_avg"].shape != named[
                        name].shape or found["exp_avg_sq"].shape != named[name].shape:
                    raise ReplayStepError(name, "has an incomplete or misshapen AdamW state")
                values[index] = found
            index += 1
    for saved_group, group in zip(saved["param_groups"], request.groups, strict=True):
        saved_group["lr"] = group.lr
    optimizer.load_state_dict({"state": values, "param_groups": saved["param_groups"]})
    return optimizer


def _update(model: Any, optimizer: Any, request: Request, update: Update
            ) -> tuple[float, float]:
    """One update (docs/experiment.md §3.3): the objective and the gradient norm before
    clipping, as the journal records them."""
    import torch

    docs, device, world = request.documents, request.device, request.world
    batch = list(update.indices)
    weighted_targets = sum(docs[i].weight * docs[i].targets for i in batch)
    for group in optimizer.param_groups:
        group["lr"] = update.lr
    optimizer.zero_grad(set_to_none=True)
    trained = list(model.parameters())
    size = request.micro_batch
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
                sums = _loss_sums(model, [doc], device, request.autocast, padded=False)
                (sums[0] * (world * doc.weight / weighted_targets)).backward()
            else:
                sums = _loss_sums(model, [docs[i] for i in group], device, request.autocast,
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
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), request.clip)
    optimizer.step()
    return _sum(losses).item() / weighted_targets, grad_norm.item()


def _sum(parts: list[Any]) -> Any:
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total


def _loss_sums(model: Any, group: Sequence[Document], device: str, autocast: bool, *,
               padded: bool) -> Any:
    """Summed FP32 next-token cross-entropy of each document: one unpadded pass for one
    document, else one right-padded pass (padding masked and unlabelled). Autocast covers
    the model's forward only; the loss is FP32 outside it."""
    import torch
    import torch.nn.functional as F

    rows, longest = len(group), max(len(doc.input_ids) for doc in group)
    input_ids = torch.zeros((rows, longest), dtype=torch.long)
    labels = torch.full((rows, longest), IGNORE, dtype=torch.long)
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
                                ignore_index=IGNORE, reduction="sum")
        return total.reshape(1)
    per_token = F.cross_entropy(shifted.reshape(-1, shifted.shape[-1]), targets.reshape(-1),
                                ignore_index=IGNORE, reduction="none")
    return per_token.view(targets.shape).sum(dim=1)


def parameter_digest(model: Any) -> str:
    """BLAKE3 hex of the raw little-endian bytes of every parameter in registration order
    (tied ones once): the digest the ranks agree on (docs/experiment.md §3.7)."""
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    for raw in _parameter_bytes(model):
        hasher.update(raw)
    return hasher.hexdigest()


def _parameter_bytes(model: Any) -> Iterator[memoryview]:
    import torch

    for _name, param in model.named_parameters():
        flat = param.detach().to("cpu").contiguous().reshape(-1)
        raw = flat.view(torch.uint8)
        if sys.byteorder == "big" and flat.element_size() > 1:
            raw = raw.reshape(-1, flat.element_size()).flip(1).reshape(-1)
        yield memoryview(raw.numpy())


def _distance(model: Any, files: Sequence[str]) -> tuple[float, float]:
    """Relative L2 distance and largest absolute difference of the model's parameters from
    the weights in ``files``."""
    import torch

    stored: dict[str, Any] = {}
    for path in files:
        stored.update(_load_safetensors(path))
    diff = ref = 0.0
    worst = 0.0
    for name, param in model.named_parameters():
        if name not in stored or tuple(stored[name].shape) != tuple(param.shape):
            raise ReplayStepError("the checkpoint of the last replayed step",
                                  f"lacks parameter {name} as replayed")
        mine = param.detach().to("cpu", torch.float64)
        theirs = stored[name].to(torch.float64)
        delta = mine - theirs
        diff += float((delta * delta).sum())
        ref += float((theirs * theirs).sum())
        worst = max(worst, float(delta.abs().max())) if delta.numel() else worst
    return math.sqrt(diff) / max(math.sqrt(ref), 1e-30), worst


if __name__ == "__main__":
    sys.exit(main())
