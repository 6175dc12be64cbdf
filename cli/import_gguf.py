"""``nscas import-gguf``: store a GGUF file, then convert it with recipe ``convert-gguf``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nscas.cli import render
from nscas.cli.common import JsonFlag, command_app, open_cli_store

app = command_app()

RECIPE = "convert-gguf"


@app.command("import-gguf")
def import_gguf_command(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(
        metavar="FILE", show_default=False,
        help="A GGUF file (llama.cpp's format) of an architecture transformers reads.")],
    ref: Annotated[str | None, typer.Option(
        "--ref", metavar="NAME", show_default=False,
        help="Point this ref at the converted checkpoint.")] = None,
    rerun: Annotated[bool, typer.Option(
        "--rerun", help="Convert again even if done before, and compare with the first result.")]
        = False,
    as_json: JsonFlag = False,
) -> None:
    """Store a GGUF file as an object and convert it to an FP32 checkpoint.

    The file's bytes are stored as they are; recipe convert-gguf (input: that object) then
    dequantises it with transformers to a Hugging Face directory (safetensors, tokenizer
    files) stored as a checkpoint whose gguf member links the file. Its receipt says the
    weights derive from the file; a converted file is not converted again unless --rerun,
    which reports whether the weights came out identical. A file that is not GGUF, or of an
    architecture or without a tokenizer that transformers cannot convert, is refused before
    anything is stored.

    Example: nscas import-gguf SmolLM2-135M-Instruct.Q4_1.gguf --ref models/smollm2-135m
    """
    from nscas.cli.progress import progress_for
    from nscas.cli.run import render_step, step_json
    from nscas.recipes.convert.gguf import summarise
    from nscas.runs.config import StepConfig
    from nscas.runs.plans import load_recipe
    from nscas.runs.runner import StepFailed, run_step
    from nscas.store.writer import check_ref_name

    if ref is not None:
        check_ref_name(ref)
    summary = summarise(file)  # before the store is opened: bad input touches nothing
    recipe = load_recipe(RECIPE)
    with open_cli_store(ctx) as store:
        gguf = store.put_file(file)
        step = StepConfig(name=RECIPE, recipe=RECIPE, inputs={"gguf": str(gguf)}, params={},
                          outputs={"checkpoint": ref} if ref is not None else {})
        result = run_step(store, recipe, step, {"gguf": gguf}, where=f"nscas import-gguf {file}",
                          rerun=rerun, progress=progress_for(RECIPE))
    if as_json:
        render.json_out({"gguf": str(gguf), "architecture": summary.architecture,
                         "quantisations": list(summary.quantisations), "ref": ref,
                         **step_json(result, pipeline=False)})
    else:
        render.fields([("gguf", str(gguf)), ("architecture", summary.architecture),
                       ("quantisations", ", ".join(summary.quantisations))])
        render_step(result, pipeline=False)
        if ref is not None and result.status == "succeeded":
            render.text(f"{ref} -> {result.outputs['checkpoint']}")
    if result.status != "succeeded":
        raise StepFailed(step=RECIPE, recipe=RECIPE, receipt=result.receipt,
                         error=result.error or "unknown error")
