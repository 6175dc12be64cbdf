"""What an auditor asks to replay (``nscas verify --replay N --replay-steps K``), the sample it
draws, and where the replay ran (docs/format.md §7.8).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayOptions:
    """What the auditor asked to replay."""

    count: int
    """Tasks drawn per evaluated arm."""
    seed: int
    """Seed of the draw (the auditor's, so the producer cannot choose the sample)."""
    tasks: tuple[str, ...] = ()
    """Task ids replayed in every arm besides the drawn ones."""
    device: str = "cpu"
    """``cpu`` or ``cuda``."""
    time_limit: float | None = None
    """Seconds for the whole replay; what is left when they run out is listed as not
    rechecked."""
    progress: Callable[[str, int, int], None] | None = field(default=None, compare=False)
    """``(arm, done, total)`` after each replayed task."""
    steps: int = 0
    """Training updates replayed after each published optimizer state (``replay.training``);
    0: none."""


def sample_tasks(ids: Sequence[str], options: ReplayOptions) -> list[str]:
    """The drawn tasks of one arm in task order, then the named ones it has."""
    rng = random.Random(options.seed)
    drawn = sorted(rng.sample(range(len(ids)), min(options.count, len(ids))))
    chosen = [ids[i] for i in drawn]
    return chosen + [t for t in options.tasks if t in ids and t not in chosen]


def environment(device: str, precision: str) -> dict[str, Any]:
    """Where the replay ran, as the verify report records it."""
    import torch

    env: dict[str, Any] = {"device": device, "precision": precision,
                           "torch": torch.__version__}
    if device == "cuda":
        env["device_name"] = torch.cuda.get_device_name()
    return env
