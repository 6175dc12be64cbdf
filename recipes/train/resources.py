"""What a train step needs (nscas.runs.resources): one CPU core per rank on this node, and on
CUDA one GPU per rank; and the disk its run takes at the most. Not imported by the recipe:
where a step runs is no part of what it computes, so this is no part of the recipe's code
identity."""

from __future__ import annotations

from nscas.recipes.train.config import TrainParams
from nscas.runs.resources import InputSizes, Needs


def needs(params: TrainParams, inputs: InputSizes) -> Needs:
    ranks = max(1, params.world // max(1, params.nnodes))
    cuda = params.device.startswith("cuda")
    return Needs(cores=ranks, gpus=ranks if cuda else 0, world=ranks,
                 disk_gb=disk_bytes(params, inputs) / 1e9)


def disk_bytes(params: TrainParams, inputs: InputSizes) -> int:
    """The most the run holds at once under the store: the seed's shared copy (counted as if
    this run makes it), its documents tokenised, and two checkpoints of its work area: the
    latest complete one (a resume's; the earlier ones have left once stored) and the one
    being written. A checkpoint is the model's files (W: the seed's), the resume state (AdamW's
    two moments, 2W; diloco: each rank's inner moments and the outer momentum) and, at a
    ``publish_state`` step, the published state (2W more) until it is stored."""
    weights = inputs.get("base", 0)
    moments = 2 * weights * (params.world if params.diloco else 1) + (
        weights if params.diloco else 0)
    steps = sorted(params.checkpoint_set)
    size = {s: weights + moments + (2 * weights if s in params.publish_state else 0)
            for s in steps}
    held = max(size[s] + (size[steps[i - 1]] if i else 0) for i, s in enumerate(steps))
    documents = 4 * (inputs.get("documents", 0) + inputs.get("replay", 0))  # token ids as JSON
    return weights + held + documents
