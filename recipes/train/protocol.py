"""The files and lines the workers and the launcher exchange in a run's output directory.

Rank 0's progress lines on stdout are ``nscas.recipes.train.events``. Every rank writes
``journal-rank{r}.jsonl``, and at the end ``result-rank{r}.json``; a rank that fails writes
``error-rank{r}.json``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from nscas.errors import RecipeError
from nscas.objects.durable import sync

RESULT_FORMAT = "train-result/1"


def spec_path(output_dir: Path) -> Path:
    return Path(output_dir) / "spec.json"


def journal_path(output_dir: Path, rank: int) -> Path:
    return Path(output_dir) / f"journal-rank{rank}.jsonl"


def result_path(output_dir: Path, rank: int) -> Path:
    return Path(output_dir) / f"result-rank{rank}.json"


def error_path(output_dir: Path, rank: int) -> Path:
    return Path(output_dir) / f"error-rank{rank}.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class RankResult:
    """What one rank measured; sums run over the updates that led to the final parameters
    (after a resume, the earlier session's updates up to the resume point count too)."""

    rank: int
    world: int
    updates: int
    """Updates made (equal to ``steps`` when the run completes)."""
    update_seconds: float
    """Sum of the per-update wall times (diloco: and of the outer steps')."""
    median_update_seconds: float
    loop_seconds: float
    """Wall time of this session's loop, checkpoints and digest exchanges included."""
    peak_memory_bytes: int
    """CUDA: peak allocated bytes on this rank's GPU; CPU: the process's peak RSS."""
    bytes_communicated: int
    """Bytes all-reduced over all updates: DDP's gradients, or (diloco) the outer steps'
    pseudo-gradients (0 for one rank)."""
    targets: int
    """Labelled tokens over all updates."""
    weighted_targets: int
    tokens: int
    """Input tokens over all updates."""
    tokens_per_second: float
    """tokens / update_seconds."""
    first_loss: float
    """The loss of the first effective update (``journal.loss_claims``)."""
    last_loss: float
    """The loss of the last effective update."""
    mean_loss: float
    """``math.fsum`` of the effective updates' losses divided by their number."""
    parameter_blake3: str
    """BLAKE3 hex of the final raw parameter bytes, agreed by every rank."""
    sha256_stream: str | None
    """docs/format.md §4's SHA-256 parameter digest of the final model (rank 0 only)."""
    journal: str
    """Path of this rank's journal."""
    journal_head: str
    """Hash of the journal's last entry."""
    resumed_from: int | None
    """Step this session started from, if it resumed an interrupted run."""
    host: str
    """Hostname of the rank."""
    outer_steps: int = 0
    """diloco: outer steps made (0 for ddp)."""

    def write(self, path: Path) -> None:
        body = {"format": RESULT_FORMAT, **asdict(self)}
        _write_json_atomically(path, body)

    @classmethod
    def read(cls, path: Path) -> RankResult:
        try:
            body = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise RecipeError(f"cannot read training result {path}: {exc}") from exc
        if body.pop("format", None) != RESULT_FORMAT:
            raise RecipeError(f"{path} is not a {RESULT_FORMAT} file")
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in body.items() if k in names})


@dataclass(frozen=True, slots=True, kw_only=True)
class RankError:
    """Why one rank stopped, as it saw it."""

    rank: int
    kind: str
    """The exception's class name."""
    message: str
    input_error: bool
    """True if the rank refused its input (an ``InvalidInput``), not a failure while running."""
    secondary: bool
    """True if the rank failed because a peer went away (a collective broke or timed out)."""
    time: float
    traceback: str

    def write(self, path: Path) -> None:
        _write_json_atomically(path, asdict(self))

    @classmethod
    def read(cls, path: Path) -> RankError | None:
        try:
            body = json.loads(Path(path).read_text(encoding="utf-8"))
            return cls(**body)
        except (OSError, ValueError, TypeError):
            return None


def _write_json_atomically(path: Path, body: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(body, f, indent=1, sort_keys=True)
        f.write("\n")
        sync(f)
    os.rename(tmp, path)
