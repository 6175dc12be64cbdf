"""What an evaluate step needs (nscas.runs.resources): its torch threads (one core where it
leaves them to torch), on CUDA one GPU, and the disk of its model's files (materialised, and
removed once loaded). Not imported by the recipe (no part of its code identity)."""

from __future__ import annotations

from nscas.recipes.evaluate.recipe import EvaluateParams
from nscas.runs.resources import InputSizes, Needs


def needs(params: EvaluateParams, inputs: InputSizes) -> Needs:
    return Needs(cores=max(1, params.threads), gpus=1 if params.device == "cuda" else 0,
                 disk_gb=inputs.get("model", 0) / 1e9)
