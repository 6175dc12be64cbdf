"""The document schedule and the learning-rate schedule of docs/experiment.md §3: pure functions."""

from __future__ import annotations

import math
import random

from nscas.errors import InvalidInput


def document_schedule(count: int, *, steps: int, batch: int, seed: int) -> list[list[int]]:
    """Batches of document indices: shuffle ``range(count)`` with one ``random.Random(seed)``,
    again and again, appending until ``steps × batch`` indices exist, then chunk.

    Published: seed 20260913, 1,024 documents, 128 × 8 gives each document exactly once.
    """
    if count < 1:
        raise InvalidInput("the document schedule needs at least one document")
    if steps < 1 or batch < 1:
        raise InvalidInput(f"steps ({steps}) and batch ({batch}) must be at least 1")
    g = random.Random(seed)
    order: list[int] = []
    while len(order) < steps * batch:
        epoch = list(range(count))
        g.shuffle(epoch)
        order.extend(epoch)
    return [order[i * batch : (i + 1) * batch] for i in range(steps)]


def rank_share(batch: list[int], *, rank: int, world: int) -> list[int]:
    """The documents rank ``rank`` of ``world`` takes from a global batch: ``batch[r::W]``."""
    return batch[rank::world]


def learning_rate(step: int, *, lr: float, warmup: int, steps: int) -> float:
    """Learning rate of update ``step`` (0-based): linear warmup ``lr·(s+1)/warmup`` for
    ``s < warmup``, then cosine from ``lr`` down to ``0.1·lr`` at the last update."""
    if step < warmup:
        return lr * (step + 1) / warmup
    decay_steps = steps - warmup
    if decay_steps <= 1:
        return lr
    progress = (step - warmup) / (decay_steps - 1)
    # Written as a factor of lr so the first decay step is exactly lr.
    return lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))
