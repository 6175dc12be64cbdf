"""A recipe for runner tests only: it claims the input IDs it was handed, or fails on request."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from nscas.errors import InvalidInput
from nscas.runs.recipe import Claim, InputSpec, Recipe, RecipeResult, RunContext
from nscas.runs.resources import InputSizes, Needs


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
    hold: str = ""
    """A directory: where an execution writes ``<label>.json`` (its pid, process group, CPU
    affinity and device variables; appended, one object a line), then, if
    ``<label>.release`` is a FIFO there, waits until its writer closes it (a FIFO removed
    before it is opened releases it too)."""
    cores: int = 1
    """The CPU cores the step declares it needs (``needs`` below)."""
    gpus: int = 0
    """The GPUs it declares."""
    gpu_memory_gb: float = 0.0
    """Its GPU memory estimate."""
    disk_gb: float = 0.0
    """Its disk estimate; with an input, plus that input's bytes (as a recipe estimates it)."""


def run(ctx: RunContext) -> RecipeResult:
    if ctx.params.fail == "crash":
        raise ValueError("probe crashed on purpose")
    if ctx.params.fail == "error":
        raise InvalidInput("probe refused its input")
    if ctx.params.hold:
        _hold(Path(ctx.params.hold), ctx.params.label or "probe")
    seen = {k: str(v) for k, v in sorted(ctx.inputs.items())}
    blob = ctx.store.put_bytes(json.dumps(seen).encode())
    return RecipeResult(outputs={"seen": blob},
                        claims={"inputs": Claim(value=seen, verifier="integrity")})


def _hold(where: Path, label: str) -> None:
    facts = {"pid": os.getpid(), "pgid": os.getpgid(0),
             "cores": sorted(os.sched_getaffinity(0)),
             "threads": os.environ.get("OMP_NUM_THREADS"),
             "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), "parent": os.getppid(),
             # torch's own count, where this process has torch (a warm job's server loaded it)
             "torch_threads": (sys.modules["torch"].get_num_threads()
                               if "torch" in sys.modules else None)}
    with (where / f"{label}.json").open("a") as f:
        f.write(json.dumps(facts) + "\n")
    release = where / f"{label}.release"
    if release.exists():
        try:
            with release.open("rb") as f:  # opens once the test holds the writing end
                f.read()
        except FileNotFoundError:
            pass  # removed since: released


def needs(params: ProbeParams, inputs: InputSizes) -> Needs:
    return Needs(cores=params.cores, gpus=params.gpus, gpu_memory_gb=params.gpu_memory_gb,
                 disk_gb=params.disk_gb + inputs.get("source", 0) / 1e9)


RECIPE = Recipe(
    name="probe",
    version="1",
    params=ProbeParams,
    inputs={"source": InputSpec(kind=None, required=False, doc="any object")},
    outputs=("seen",),
    run=run,
    extra_inputs=True,
)
