"""A recipe for runner tests only: it claims the input IDs it was handed, or fails on request."""

from __future__ import annotations

import json
from dataclasses import dataclass

from nscas.errors import InvalidInput
from nscas.runs.recipe import Claim, InputSpec, Recipe, RecipeResult, RunContext


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeParams:
    fail: str = ""
    """"" succeeds; "error" refuses the input (RecipeError path); "crash" raises ValueError."""
    label: str = ""
    """Changes the action without changing anything else."""
    count: int = 0
    """Unused: an integer param, for the tests of values a record cannot hold."""
    scale: float = 1.0
    """Unused: a float param, likewise."""


def run(ctx: RunContext) -> RecipeResult:
    if ctx.params.fail == "crash":
        raise ValueError("probe crashed on purpose")
    if ctx.params.fail == "error":
        raise InvalidInput("probe refused its input")
    seen = {k: str(v) for k, v in sorted(ctx.inputs.items())}
    blob = ctx.store.put_bytes(json.dumps(seen).encode())
    return RecipeResult(outputs={"seen": blob},
                        claims={"inputs": Claim(value=seen, verifier="integrity")})


RECIPE = Recipe(
    name="probe",
    version="1",
    params=ProbeParams,
    inputs={"source": InputSpec(kind=None, required=False, doc="any object")},
    outputs=("seen",),
    run=run,
    extra_inputs=True,
)
