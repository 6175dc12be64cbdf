"""What a train step needs (nscas.runs.resources): one CPU core per rank on this node, and on
CUDA one GPU per rank. Not imported by the recipe: where a step runs is no part of what it
computes, so this is no part of the recipe's code identity."""

from __future__ import annotations

from nscas.recipes.train.config import TrainParams
from nscas.runs.resources import Needs


def needs(params: TrainParams) -> Needs:
    ranks = max(1, params.world // max(1, params.nnodes))
    cuda = params.device.startswith("cuda")
    return Needs(cores=ranks, gpus=ranks if cuda else 0, world=ranks)
