"""Recipe ``probes``: retention probes that need no corpus (docs/experiment.md §2.2).

The seed model answers a fixed, published set of varied prompts (``probes.json``, shipped
with the recipe) greedily, before any training; each prompt with its answer becomes one
retention conversation in the format ``prepare`` takes. A probe whose answer decodes to
blank text cannot be a conversation and is dropped (named in the claims).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

from nscas.errors import RecipeError
from nscas.objects.digests import Digest
from nscas.runs.recipe import Claim, InputSpec, Recipe, RecipeResult, RunContext

VERSION = "1"
PROMPTS_FILE = "probes.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbesParams:
    max_new_tokens: int = 128
    """Greedy decoding bound per answer."""
    batch_size: int = 16
    """Prompts generated together (outputs equal one-at-a-time generation on CPU)."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where to run."""
    precision: Literal["bf16", "fp32"] = "fp32"
    """On CUDA: "bf16" autocast, or "fp32" without TF32 (CPU is always FP32)."""

    def validate(self) -> str | None:
        if self.max_new_tokens < 1 or self.batch_size < 1:
            return "max_new_tokens and batch_size must be positive"
        return None


def prompt_set_bytes() -> bytes:
    """The published prompt set, exactly as shipped."""
    return resources.files(__package__).joinpath(PROMPTS_FILE).read_bytes()


def prompt_set() -> list[tuple[str, str]]:
    """(id, prompt) of every probe, in order."""
    return [(p["id"], p["prompt"]) for p in json.loads(prompt_set_bytes())["prompts"]]


def run(ctx: RunContext) -> RecipeResult:
    import torch

    from nscas.recipes.common.conversations import conversations_jsonl, validate_conversations
    from nscas.recipes.common.generate import generate_greedy, stop_ids
    from nscas.recipes.common.tokenise import encode_prompt
    from nscas.recipes.init.presets import load_hf_dir

    p: ProbesParams = ctx.params
    store = ctx.store
    if p.device == "cuda" and not torch.cuda.is_available():
        raise RecipeError("device 'cuda' was asked for but torch sees no CUDA device")
    model_dir = ctx.workdir / "model"
    store.materialise(Digest.parse(store.get_record(ctx.inputs["model"])["files"]), model_dir)
    model, tokenizer = load_hf_dir(model_dir, device=p.device)
    model.eval()
    probes = prompt_set()
    limit = model.config.max_position_embeddings
    prompts = []
    for pid, text in probes:
        ids = encode_prompt(tokenizer, text)
        if len(ids) + p.max_new_tokens > limit:
            raise RecipeError(f"probe {pid}: {len(ids)} prompt tokens plus {p.max_new_tokens} "
                              f"new tokens exceed the model's {limit} positions")
        prompts.append(ids)
    eos = stop_ids(tokenizer)  # the template's end of turn, and eos, as evaluate stops
    ctx.progress.start(len(prompts), "answering the probes")
    gens = generate_greedy(model, tokenizer, prompts, max_new_tokens=p.max_new_tokens,
                           batch_size=p.batch_size, eos_ids=eos, device=p.device,
                           precision=p.precision)
    ctx.progress.finish()
    lines, conversations, dropped = [], [], []
    for (pid, text), g in zip(probes, gens, strict=True):
        lines.append({"id": pid, "prompt_ids": list(g.prompt_ids),
                      "output_ids": list(g.output_ids), "text": g.text, "seconds": g.seconds,
                      "tokens_per_second": g.tokens_per_second, "ended_with_eos": g.ended_with_eos, "hit_token_limit": g.hit_token_limit})
        if not g.text.strip():
            dropped.append(pid)
            continue
        conversations.append({"id": pid, "messages": [{"role": "user", "content": text},
                                                      {"role": "assistant", "content": g.text}]})
    if not conversations:
        raise RecipeError("the model answered every probe with blank text; no retention set")
    data = conversations_jsonl(conversations)
    validate_conversations(data)
    outputs = {
        "retention": store.put_bytes(data),
        "generations": store.put_bytes("".join(
            json.dumps(x, separators=(",", ":"), ensure_ascii=False) + "\n"
            for x in lines).encode("utf-8")),
        "prompts": store.put_bytes(prompt_set_bytes()),
    }
    claims: dict[str, Any] = {
        "probes": len(conversations), "dropped": dropped,
        "ended_with_eos": sum(g.ended_with_eos for g in gens),
        "hit_token_limit": sum(g.hit_token_limit for g in gens),
    }
    return RecipeResult(outputs=outputs,
                        claims={k: Claim(value=v, verifier="probes") for k, v in claims.items()})


RECIPE = Recipe(
    name="probes",
    version=VERSION,
    params=ProbesParams,
    inputs={"model": InputSpec(kind="checkpoint/1", doc="the seed model, before training")},
    outputs=("retention", "generations", "prompts"),
    run=run,
    doc="Retention probes: the seed model's own greedy answers to a fixed set of prompts.",
)
