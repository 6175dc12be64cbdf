"""What rank 0 tells the launcher while it trains: typed events, one line each on stdout.

A line is ``PROGRESS_PREFIX`` and a JSON object whose ``event`` names the kind (``step`` or
``checkpoint``) and whose other members are the event's fields. ``event_line`` and
``parse_event_line`` are the only writer and reader of these lines.
"""

from __future__ import annotations

import json
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from nscas.errors import RecipeError

PROGRESS_PREFIX = "nscas-train "


@dataclass(frozen=True, slots=True, kw_only=True)
class StepProgress:
    """One finished update, as rank 0 reported it."""

    step: int
    """1-based number of the update."""
    steps: int
    """Updates the run makes in all."""
    loss: float
    """The update's objective."""
    tokens_per_second: float
    """Input tokens of the global batch per second of the update."""
    eta_seconds: float
    """The mean update time so far times the updates left."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointReady:
    """A checkpoint that is complete on disk (rank 0 wrote it, or an earlier session did)."""

    step: int
    hf_dir: Path
    """The Hugging Face directory of the model at ``step``."""
    state_file: Path
    """Optimizer and RNG state, for resuming."""
    resumed: bool
    """True if an interrupted earlier session of the run wrote it."""


WorkerEvent = StepProgress | CheckpointReady
_NAMES: dict[type, str] = {StepProgress: "step", CheckpointReady: "checkpoint"}
_KINDS = {name: kind for kind, name in _NAMES.items()}


def event_line(event: WorkerEvent) -> str:
    """The progress line of ``event`` (no newline)."""
    body: dict[str, Any] = {"event": _NAMES[type(event)]}
    for f in fields(event):
        value = getattr(event, f.name)
        body[f.name] = str(value) if isinstance(value, Path) else value
    return PROGRESS_PREFIX + json.dumps(body, sort_keys=True, separators=(",", ":"))


def parse_event_line(line: str) -> WorkerEvent | None:
    """The event on a progress line; None for any other output (not prefixed, or not JSON).

    A prefixed JSON object that is no known event, or whose fields do not fit it, is a
    ``RecipeError``: the worker and the launcher disagree about the protocol.
    """
    if not line.startswith(PROGRESS_PREFIX):
        return None
    try:
        body = json.loads(line[len(PROGRESS_PREFIX):])
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    kind = _KINDS.get(body.pop("event", None))
    if kind is None:
        raise RecipeError(f"rank 0 sent an unknown training event: {line!r}")
    hints = typing.get_type_hints(kind)
    names = {f.name for f in fields(kind)}
    if set(body) != names:
        raise RecipeError(f"rank 0 sent a {_NAMES[kind]} event with members "
                          f"{', '.join(sorted(body))}, not {', '.join(sorted(names))}: {line!r}")
    values = {}
    for name, value in body.items():
        if not _fits(hints[name], value):
            raise RecipeError(f"rank 0 sent a {_NAMES[kind]} event whose {name} is "
                              f"{value!r}: {line!r}")
        values[name] = (Path(value) if hints[name] is Path
                        else float(value) if hints[name] is float else value)
    return kind(**values)


def _fits(tp: Any, value: Any) -> bool:
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if tp is Path:
        return isinstance(value, str)
    raise TypeError(f"no wire form for a field of type {tp!r}")
