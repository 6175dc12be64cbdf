"""Recipe ``wordcount``: how often each word occurs in a text blob.

The worked example of docs/recipes.md: one input, two params, one output and two claims.
It reads nothing but its input and writes nothing but through the store, so the same text
and params always give the same output, and a second run is a cache hit.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass

from nscas.errors import RecipeError
from nscas.runs.recipe import Claim, InputSpec, Recipe, RecipeResult, RunContext

_WORD = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)*")


@dataclass(frozen=True, slots=True, kw_only=True)
class WordcountParams:
    lowercase: bool = True
    """Count "The" and "the" as one word."""
    top: int = 10
    """How many of the most frequent words the output lists (at least 1)."""

    def validate(self) -> str | None:
        """A problem with the params, said in one line, or None: the runner calls it."""
        return "top must be at least 1" if self.top < 1 else None


def run(ctx: RunContext) -> RecipeResult:
    data = ctx.store.get_bytes(ctx.inputs["text"])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecipeError(f"the text input is not UTF-8 (byte {exc.start})") from None
    if ctx.params.lowercase:
        text = text.lower()
    counts = Counter(_WORD.findall(text))
    # Ties broken by the word, so the output does not depend on the order of the text.
    top = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[: ctx.params.top]
    output = json.dumps({"words": sum(counts.values()), "distinct": len(counts),
                         "top": [[word, n] for word, n in top]}, sort_keys=True)
    blob = ctx.store.put_bytes(output.encode() + b"\n")
    return RecipeResult(outputs={"counts": blob}, claims={
        "words": Claim(value=sum(counts.values()), verifier="wordcount"),
        "distinct": Claim(value=len(counts), verifier="wordcount"),
    })


RECIPE = Recipe(
    name="wordcount",
    version="1",
    params=WordcountParams,
    inputs={"text": InputSpec(kind="blob", doc="a UTF-8 text file (nscas add FILE)")},
    outputs=("counts",),
    run=run,
    doc="How often each word occurs in a text.",
)
