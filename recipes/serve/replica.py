"""What one replica serves: a checkpoint loaded from the store, checked, and its task prompts.

A replica never serves weights it has not checked: the checkpoint's files are materialised,
the parameter digest is recomputed from the materialised safetensors bytes (the files the
model is loaded from, not the stored objects) and must equal the checkpoint's ``params``
before the model is even loaded.

A replica process may hold several model instances (``--instances``, as Triton's
``instance_group``): each is a copy of the checked model's tensors with its own CUDA stream
and its own decoder, generating on its own thread, so that on one GPU the kernels of one
instance's decoding step run beside the other's (two processes only take turns on a GPU).
"""

from __future__ import annotations

import copy
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nscas.errors import IntegrityError, InvalidInput, RecipeError
from nscas.objects.digests import Digest
from nscas.store.protocol import ObjectReader

if TYPE_CHECKING:
    from .decoding import RowControl

MAX_TOKENS_LIMIT = 4096
"""The most tokens one chat completion may ask for (positions are checked separately)."""
MAX_INSTANCES = 8
"""The most model instances one replica process holds."""


class ReplicaLoadError(RecipeError):
    """A replica cannot serve ``what`` (a checkpoint or task set) for the reason given."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"cannot serve {what}: {reason}")
        self.what = what
        self.reason = reason


@dataclass(frozen=True, slots=True, kw_only=True)
class Replica:
    """A loaded, checked model instance ready to generate; used by one generation thread
    only."""

    model: Any
    """The Hugging Face causal LM, in eval mode, on ``device``."""
    tokenizer: Any
    """The checkpoint's own tokenizer (it carries the chat template)."""
    model_digest: str
    """The checked parameter digest (a ``params/1`` ID): every answer echoes it."""
    checkpoint: str
    """The ID of the checkpoint/1 record served."""
    prompts: Mapping[str, tuple[int, ...]]
    """Task id -> prompt token ids, for the committed tasks this replica answers."""
    eos_ids: frozenset[int]
    """Generation stops at these ids: the tokenizer's end-of-turn token."""
    device: str
    """``cpu`` or ``cuda``."""
    precision: str = "bf16"
    """On CUDA: ``bf16`` autocast, or ``fp32`` (no autocast, no TF32) so that a batch's shape
    cannot flip a near-tied token; on CPU both are FP32."""
    max_positions: int | None
    """The model's position limit (``max_position_embeddings``), if it has one."""
    static: Any = None
    """A ``StaticDecoder`` replaying each decoding step as a CUDA graph, or None (eager)."""
    stream: Any = None
    """On CUDA, this instance's own ``torch.cuda.Stream``: all its work runs there."""

    @property
    def decoding(self) -> str:
        """``cuda-graphs`` or ``eager``: how this replica runs its decoding steps."""
        return "eager" if self.static is None else "cuda-graphs"

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 controls: Sequence[RowControl | None]) -> list[Any]:
        """Generations of ``prompts`` as one batch (blocking; call it off the loop).

        A row without a control is decoded greedily, exactly as ``evaluate`` decodes (``/infer``
        rows). A row with one is steered by it as each token is chosen (sampling, streaming,
        stop strings), and its ``result`` is set before this returns. A batch holding a row
        that samples is decoded eagerly: a captured CUDA graph only takes the argmax.
        """
        if self.stream is not None:
            import torch

            with torch.cuda.stream(self.stream):
                return self._generate(prompts, max_new_tokens, controls)
        return self._generate(prompts, max_new_tokens, controls)

    def _generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                  controls: Sequence[RowControl | None]) -> list[Any]:
        from nscas.recipes.common.generate import generate_greedy

        from .decoding import NonFiniteLogits, choose_tokens

        steered = [(row, c) for row, c in enumerate(controls) if c is not None]
        by_row = dict(steered)
        failed: dict[int, NonFiniteLogits] = {}
        hooks: dict[str, Any] = {}
        if steered:
            hooks["on_token"] = lambda row, token: row not in failed and (
                row not in by_row or by_row[row].on_token(token))
        # Eager decoding chooses every token here, so that a row whose logits are not finite
        # fails alone: it ends at once and its request gets the error; its neighbours'
        # tokens are what they would be without it. A captured CUDA graph takes the argmax
        # itself, unchecked (greedy batches of FP32 CUDA replicas).
        if self.static is None or any(c.sampler is not None for _, c in steered):
            def fail(row: int, failure: NonFiniteLogits) -> None:
                failed.setdefault(row, failure)
                if row in by_row:
                    by_row[row].fail(failure)

            hooks["choose"] = lambda logits, rows: choose_tokens(
                logits, [by_row.get(r) for r in rows],
                on_failure=lambda index, failure: fail(rows[index], failure))
            hooks.setdefault("on_token", lambda row, token: row not in failed)
        generations = generate_greedy(
            self.model, self.tokenizer, prompts, max_new_tokens=max_new_tokens,
            batch_size=max(1, len(prompts)), eos_ids=set(self.eos_ids), device=self.device,
            precision=self.precision,  # type: ignore[arg-type]
            static=None if "choose" in hooks else self.static, **hooks)
        for _, control in steered:
            control.finish(max_new_tokens)
        return [failed.get(row, generation) for row, generation in enumerate(generations)]

    def encode_messages(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """Token ids of a chat rendered with the template and its generation prompt.

        The same two steps as ``encode_prompt`` (which covers one user turn only), so a chat
        holding one user message encodes exactly as the task prompt it repeats.
        """
        text = self.tokenizer.apply_chat_template(
            [dict(m) for m in messages], tokenize=False, add_generation_prompt=True)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode_text(self, text: str) -> list[int]:
        """Token ids of a plain prompt (a text completion): no chat template, the tokenizer's
        own special tokens added as it adds them by default."""
        return list(self.tokenizer(text)["input_ids"])

    def positions_needed(self, prompt_length: int, max_new_tokens: int) -> str | None:
        """Why a prompt cannot be generated from without truncation, or None if it can."""
        needed = prompt_length + max_new_tokens - 1
        if self.max_positions is not None and needed > self.max_positions:
            return (f"the prompt has {prompt_length} tokens; with {max_new_tokens} new tokens it "
                    f"needs {needed} positions but the model has {self.max_positions}")
        return None


def pin_to_cpus(spec: str) -> frozenset[int]:
    """Confine this process to the CPUs of ``spec`` (``2,3`` or ``4-7,12``); the set pinned.

    Call it before any other thread starts: threads inherit the caller's affinity, so the
    generation thread, the event loop and torch's own threads all stay on these CPUs. A CPU
    this process may not use, or a malformed list, is refused before anything changes.
    """
    if not hasattr(os, "sched_setaffinity"):
        raise InvalidInput("--cpus needs an operating system with CPU affinity (Linux)")
    spans = []
    for part in spec.split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip(), re.ASCII)
        if match is None:
            raise InvalidInput(f"--cpus must list CPUs like 2,3 or 4-7, got {spec!r}")
        low, high = int(match[1]), int(match[2] or match[1])
        if high < low:
            raise InvalidInput(f"--cpus range {part.strip()!r} runs backwards")
        spans.append((low, high))
    allowed = os.sched_getaffinity(0)
    # Bounded by the highest CPU allowed, so that a range like 0-999999999 costs nothing.
    top = max(allowed)
    cpus = {c for low, high in spans for c in range(low, min(high, top) + 1)}
    outside = sorted(cpus - allowed) + sorted({high for _, high in spans if high > top})
    if outside:
        raise InvalidInput(f"--cpus names CPUs this process may not use: "
                           f"{', '.join(map(str, outside))} (allowed: {len(allowed)} CPUs)")
    os.sched_setaffinity(0, cpus)
    return frozenset(cpus)


def load_replica(store: ObjectReader, checkpoint: Digest, tasks: Digest | None, *, device: str,
                 workdir: Path, threads: int, precision: str = "bf16",
                 cuda_graphs: bool = True, instances: int = 1) -> tuple[Replica, ...]:
    """Materialise ``checkpoint`` into ``workdir``, check its parameter digest, load it, and
    encode the prompts of ``tasks`` (a ``tasks/1`` of grounded tasks) if given; its
    ``instances`` model instances, the first holding the loaded model, each other a copy of
    its tensors (so checked once) on the same device.

    On CUDA every instance gets a stream of its own. With ``cuda_graphs`` and FP32, decoding
    steps are captured once per batch shape (on the instance's stream) and replayed
    (``StaticDecoder``); a model that cannot decode that way is refused rather than served
    otherwise than asked. BF16 replicas decode eagerly (``StaticDecoder`` does not capture
    under autocast). ``threads`` torch threads serve each instance's generation thread.
    """
    import torch

    from nscas.models.checkpoints import file_params_digest
    from nscas.recipes.init.presets import load_hf_dir

    if threads < 1:
        raise ReplicaLoadError(str(checkpoint), f"threads must be at least 1, got {threads}")
    if not 1 <= instances <= MAX_INSTANCES:
        raise ReplicaLoadError(str(checkpoint), f"instances must be from 1 to {MAX_INSTANCES}, "
                                                f"got {instances}")
    # Process-wide, but each generation thread runs its own team of this many threads.
    torch.set_num_threads(threads)
    record = _record_of_kind(store, checkpoint, "checkpoint/1")
    model_dir = workdir / "model"
    store.materialise(Digest.parse(record["files"]), model_dir)
    weights = sorted(model_dir.glob("*.safetensors"))
    if not weights:
        raise ReplicaLoadError(str(checkpoint), "its files hold no *.safetensors weights")
    recomputed = str(file_params_digest(weights))
    if recomputed != record["params"]:
        raise IntegrityError(f"parameters of checkpoint {checkpoint}", record["params"],
                             recomputed)
    model, tokenizer = load_hf_dir(model_dir, device=device)
    shutil.rmtree(model_dir)  # loaded: a replica holds no copy of its files while it serves
    model.eval()
    from nscas.recipes.common.generate import stop_ids
    from nscas.recipes.common.tokenise import TemplateError

    try:
        eos_ids = frozenset(stop_ids(tokenizer))
    except TemplateError as exc:
        raise ReplicaLoadError(str(checkpoint), exc.message) from None
    graphs = device == "cuda" and cuda_graphs and precision == "fp32"
    if graphs:
        from nscas.recipes.common.static_decode import unsupported

        reason = unsupported(model)
        if reason is not None:
            raise ReplicaLoadError(str(checkpoint), f"CUDA graphs need another model: {reason}"
                                   " (serve it with --no-cuda-graphs)")
    if device == "cuda" and precision == "fp32":
        # Process-wide, once: generation saves, clears and restores this flag around each
        # batch, and with several generation threads one could restore it under another.
        torch.backends.cuda.matmul.allow_tf32 = False
    with torch.no_grad():
        models = [model] + [copy.deepcopy(model) for _ in range(instances - 1)]
    if device == "cuda":
        torch.cuda.synchronize()  # loaded and copied on the default stream: done before use
    prompts = _task_prompts(store, tasks, tokenizer) if tasks is not None else {}
    loaded = []
    for m in models:
        stream = torch.cuda.Stream() if device == "cuda" else None
        static = None
        if graphs:
            from nscas.recipes.common.static_decode import StaticDecoder

            static = StaticDecoder(m, graphs=True, stream=stream)
        loaded.append(Replica(
            model=m, tokenizer=tokenizer, model_digest=record["params"],
            checkpoint=str(checkpoint), prompts=prompts, eos_ids=eos_ids, device=device,
            precision=precision, max_positions=getattr(m.config, "max_position_embeddings", None),
            static=static, stream=stream))
    return tuple(loaded)


def _task_prompts(store: ObjectReader, tasks: Digest, tokenizer: Any) -> dict[str, tuple[int, ...]]:
    from nscas.recipes.common.tasks import read_records
    from nscas.recipes.common.tokenise import encode_prompt

    record = _record_of_kind(store, tasks, "tasks/1")
    records = read_records(store.get_bytes(Digest.parse(record["records"])))
    if [r["id"] for r in records] != record["ids"]:
        raise ReplicaLoadError(str(tasks), "its records blob does not hold its ids in order")
    return {r["id"]: tuple(encode_prompt(tokenizer, r["prompt"])) for r in records}


def _record_of_kind(store: ObjectReader, oid: Digest, kind: str) -> dict[str, Any]:
    got = store.info(oid).kind
    if got != kind:
        raise ReplicaLoadError(str(oid), f"it is a {got or 'blob'}, not a {kind}")
    return store.get_record(oid)
