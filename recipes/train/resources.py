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
    """The most the run holds at once under the store, its own stored checkpoints included.

    With W the seed's bytes: a checkpoint in the work area is the model's files (W), a resume
    state except at the final step (AdamW's two moments, 2W; diloco: each rank's inner moments
    and the outer momentum) and, at a ``publish_state`` step, the published state (2W) until
    it is stored; the store keeps of it at most its raw bytes (W, + 2W published). The seed's
    shared copy (W, counted as if this run makes it) is released once the ranks have loaded it
    (after the first update), so it is counted at the start, at a resume and beside the first
    checkpoint only. Each checkpoint is stored before the next is written (rank 0 waits for
    ``committed.json``: ``WorkerSpec.stored_before_next``). Its documents, tokenised, stay
    throughout."""
    weights = inputs.get("base", 0)
    moments = 2 * weights * (params.world if params.diloco else 1) + (
        weights if params.diloco else 0)
    steps = sorted(params.checkpoint_set)
    published = {s: 2 * weights if s in params.publish_state else 0 for s in steps}
    resume = {s: moments if s != params.steps else 0 for s in steps}
    written = {s: weights + resume[s] + published[s] for s in steps}  # until it is stored
    stored = [0]  # the store's bytes of the checkpoints before each, then of them all
    for s in steps:
        stored.append(stored[-1] + weights + published[s])
    phases = [weights]  # the seed's copy, before the first update
    for i, s in enumerate(steps):
        resumed = weights + weights + resume[s] + stored[i + 1]  # a resume from s
        earlier = written[steps[i - 1]] if i else weights  # the latest complete one, or the seed
        writing = earlier + written[s] + stored[i]
        phases += [resumed, writing, written[s] + stored[i + 1]]  # ..., then s stored
    documents = 4 * (inputs.get("documents", 0) + inputs.get("replay", 0))  # token ids as JSON
    return max(phases) + documents
