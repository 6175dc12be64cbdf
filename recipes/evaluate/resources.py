"""What an evaluate step needs (nscas.runs.resources): its torch threads (one core where it
leaves them to torch), and on CUDA one GPU. Not imported by the recipe (no part of its code
identity)."""

from __future__ import annotations

from nscas.recipes.evaluate.recipe import EvaluateParams
from nscas.runs.resources import Needs


def needs(params: EvaluateParams) -> Needs:
    return Needs(cores=max(1, params.threads), gpus=1 if params.device == "cuda" else 0)
