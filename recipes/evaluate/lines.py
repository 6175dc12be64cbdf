"""The lines of evaluate's retained blobs: ``generations``, ``checks``, ``retention`` and
``timings``.

Each blob is JSONL, one line per task (or probe) in the task set's order, with its members in
the order written here. These types are the only writers of those lines, and a baseline's
``checks`` and ``retention`` lines are read back through them. What a run measured rather than
computed (wall-clock seconds) is in ``timings`` alone, so that a rerun reproduces the other
three byte for byte (docs/format.md §6.6).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from nscas.errors import RecipeError
from nscas.recipes.common.checker import CheckResult

if TYPE_CHECKING:
    from nscas.recipes.common.generate import Generation


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    """One ``generations`` line: a task's greedy answer, retained whole (its timing is a
    ``Timing`` line)."""

    id: str
    """The task's ID."""
    generation: Generation

    def to_json(self) -> dict[str, Any]:
        g = self.generation
        return {"id": self.id, "prompt_ids": list(g.prompt_ids),
                "output_ids": list(g.output_ids), "text": g.text,
                "ended_with_eos": g.ended_with_eos, "hit_token_limit": g.hit_token_limit}


@dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    """One ``timings`` line: how long a task's answer took, as this run measured it."""

    id: str
    generation: Generation

    def to_json(self) -> dict[str, Any]:
        g = self.generation
        return {"id": self.id, "seconds": g.seconds, "tokens_per_second": g.tokens_per_second}


def timing_ids(data: bytes) -> list[str]:
    """What a rerun must reproduce of a ``timings`` blob: its task ids, in order."""
    return [json.loads(line)["id"] for line in data.decode("utf-8").splitlines()]


@dataclass(frozen=True, slots=True, kw_only=True)
class Checked:
    """One ``checks`` line: the strict checker's verdict on a task's answer."""

    id: str
    family: str
    variant: int
    result: CheckResult

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "family": self.family, "variant": self.variant,
                **self.result.to_dict()}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Checked:
        return cls(id=value["id"], family=value["family"], variant=value["variant"],
                   result=CheckResult(correct=value["correct"],
                                      valid_json_object=value["valid_json_object"],
                                      reason=value["reason"]))


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeLoss:
    """One ``retention`` line: a probe's mean loss per labelled token."""

    id: str
    loss: float

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "loss": self.loss}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> ProbeLoss:
        return cls(id=value["id"], loss=value["loss"])


Line = Answer | Checked | ProbeLoss | Timing
_Read = TypeVar("_Read", Checked, ProbeLoss)


def dump_lines(lines: Iterable[Line]) -> bytes:
    """A blob of these lines: compact JSON, UTF-8, one per line."""
    return "".join(json.dumps(x.to_json(), separators=(",", ":"), ensure_ascii=False) + "\n"
                   for x in lines).encode()


def read_lines(kind: type[_Read], data: bytes, what: str) -> list[_Read]:
    """The lines of a ``checks`` or ``retention`` blob; ``what`` names the blob in the error."""
    out = []
    for number, text in enumerate(data.decode("utf-8").splitlines(), start=1):
        try:
            out.append(kind.from_json(json.loads(text)))
        except (ValueError, KeyError, TypeError) as exc:
            raise RecipeError(f"{what} line {number} is not a {kind.__name__} line: {exc}") from None
    return out
