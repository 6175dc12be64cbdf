"""Recipe ``convert-gguf``: a GGUF file, dequantised, as an FP32 checkpoint/1 that links it.

Its input is the GGUF file's own object, so the receipt, ``nscas lineage`` and a ``--rerun``
verdict show that the weights derive from exactly those bytes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

from nscas.errors import InvalidInput, RecipeError
from nscas.models.checkpoints import put_checkpoint
from nscas.runs.recipe import Claim, InputSpec, Recipe, RecipeResult, RunContext

SOURCE = "gguf"
"""The checkpoint's ``source`` member; its ``gguf`` member links the file it came from."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConvertParams:
    dtype: Literal["float32"] = "float32"
    """The dtype every tensor is dequantised to (float32 only: no precision is lost twice)."""


def run(ctx: RunContext) -> RecipeResult:
    import torch

    from nscas.recipes.common.tokenise import end_of_turn
    from nscas.recipes.convert.gguf import convert, summarise
    from nscas.recipes.init.presets import load_hf_dir, parameter_count

    gguf_id = ctx.inputs["gguf"]
    path = ctx.workdir / "src" / "model.gguf"
    ctx.store.materialise(gguf_id, path)
    try:
        summary = summarise(path)
    except InvalidInput as exc:
        raise RecipeError(f"input gguf {gguf_id}: {exc.message}") from None
    ctx.progress.start(None, f"dequantising {summary.architecture} "
                             f"({', '.join(summary.quantisations)}) to {ctx.params.dtype}")
    out = convert(path, ctx.workdir / "model")
    model, tokenizer = load_hf_dir(out)  # what every later recipe will load
    tensors, scalars = parameter_count(model)
    if scalars != summary.parameters:
        raise RecipeError(f"the converted model holds {scalars} parameters, the GGUF file "
                          f"{summary.parameters}: the conversion lost or invented weights")
    if any(p.dtype != torch.float32 for p in model.parameters()):
        raise RecipeError("the converted model is not all float32")
    turn = end_of_turn(tokenizer)  # a template without one clear turn end is refused here
    checkpoint = put_checkpoint(ctx.store, out, step=0, parent=None,
                                          extra={"source": SOURCE, "gguf": str(gguf_id)})
    params_id = ctx.store.get_record(checkpoint)["params"]
    sha256 = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            sha256.update(block)
    return RecipeResult(outputs={"checkpoint": checkpoint}, claims={
        "parameter_digest": Claim(value=params_id, verifier="parameters"),
        "parameters": Claim(value=scalars, verifier="parameters"),
        "tensors": Claim(value=tensors, verifier="parameters"),
        "gguf_sha256": Claim(value=sha256.hexdigest(), verifier="gguf"),
        "gguf_parameters": Claim(value=summary.parameters, verifier="gguf"),
        "gguf_tensors": Claim(value=summary.tensors, verifier="gguf"),
        "end_of_turn": Claim(value=turn.to_json(), verifier="template"),
    })


RECIPE = Recipe(
    name="convert-gguf",
    version="1",
    params=ConvertParams,
    inputs={"gguf": InputSpec(kind="blob", doc="a GGUF file (nscas add, or nscas import-gguf)")},
    outputs=("checkpoint",),
    run=run,
    doc="Dequantise a GGUF file to an FP32 Hugging Face checkpoint that links the file.",
)
