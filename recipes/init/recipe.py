"""Recipe ``init``: a Llama-architecture model from a named preset with seeded initialisation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from nscas.models.checkpoints import put_checkpoint
from nscas.runs.recipe import Claim, InputSpec, Recipe, RecipeResult, RunContext

PresetName = Literal["llama-tiny", "llama-small", "smollm2-1.7b"]
"""The names of ``presets.PRESETS``, here so that params parse without importing torch."""


@dataclass(frozen=True, slots=True, kw_only=True)
class InitParams:
    preset: PresetName = "llama-tiny"
    """Model preset: llama-tiny, llama-small or smollm2-1.7b."""
    seed: int = 0
    """Initialisation seed (the same preset, seed and tokenizer give bit-identical weights)."""


def run(ctx: RunContext) -> RecipeResult:
    import torch
    from transformers import AutoTokenizer

    from nscas.recipes.common.digests import sha256_stream
    from nscas.recipes.init.presets import build_model, get_preset, parameter_count, save_hf_dir

    p: InitParams = ctx.params
    get_preset(p.preset)  # an unknown preset fails before any work
    tok_dir = ctx.workdir / "tokenizer"
    ctx.store.materialise(ctx.inputs["tokenizer"], tok_dir)
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    ctx.progress.start(None, f"building {p.preset}")
    with torch.no_grad():
        model = build_model(p.preset, vocab_size=len(tokenizer), seed=p.seed)
    out = save_hf_dir(model, tok_dir, ctx.workdir / "model")
    tensors, scalars = parameter_count(model)
    stream = sha256_stream(model)
    checkpoint = put_checkpoint(ctx.store, out, step=0, parent=None,
                                          extra={"preset": p.preset, "seed": p.seed})
    params_id = ctx.store.get_record(checkpoint)["params"]
    return RecipeResult(outputs={"checkpoint": checkpoint}, claims={
        "parameter_digest": Claim(value=params_id, verifier="parameters"),
        "sha256_stream": Claim(value=stream, verifier="parameters"),
        "parameters": Claim(value=scalars, verifier="parameters"),
        "tensors": Claim(value=tensors, verifier="parameters"),
    })


RECIPE = Recipe(
    name="init",
    version="1",
    params=InitParams,
    inputs={"tokenizer": InputSpec(kind="tree/1", doc="the tokenizer recipe's output")},
    outputs=("checkpoint",),
    run=run,
    doc="Build a seeded Llama-architecture model from a preset and store it as a checkpoint.",
)
