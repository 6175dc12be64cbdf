"""A run file made into a checked plan before anything runs: the file with its ``--set``
overrides and sweeps (``load_plan_file``), the variant it is (``variant_of``), the steps chosen
(``select_steps``), and each step's recipe, params, inputs and refs, with the results of the
steps it reads but does not run (``plan_file``; ``plan_one_step`` for a scheduled job). Nothing
here writes to the store; nscas.runs.runner runs what a plan holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nscas.errors import ConfigError
from nscas.objects.digests import Digest
from nscas.runs.config import (
    Override,
    RunFile,
    apply_overrides,
    downstream,
    load_run_file,
    param_takes_array,
    parse_override,
    step_reference,
)
from nscas.runs.planning import Planned, Source, plan, plan_step
from nscas.runs.previous import PreviousRuns
from nscas.runs.recipe import Recipe
from nscas.runs.registry import registered_recipe, unknown_recipe
from nscas.runs.sweeps import expand, split_sweeps
from nscas.runs.variants import Variant, plan_variant
from nscas.store.writer import Store
from nscas.suggestions import did_you_mean


def load_recipe(name: str) -> Recipe:
    """Import one registered recipe (lazily: only the one that runs)."""
    recipe = registered_recipe(name)
    if recipe is None:
        raise ConfigError("recipe", unknown_recipe(name))
    return recipe


@dataclass(frozen=True, slots=True, kw_only=True)
class RunPlan:
    """A run checked before anything runs: its steps to run (``steps``, in run order) and the
    results of the steps they read but the run does not run (``sources``)."""

    spec: RunFile
    where: str
    runs: PreviousRuns
    steps: tuple[Planned, ...]
    sources: Mapping[str, Source]

    @property
    def names(self) -> list[str]:
        return [item.step.name for item in self.steps]


def source_of(store: Store, receipt: Digest) -> Source:
    """A step's results as later steps read them, from its receipt."""
    outputs = store.get_record(receipt)["outputs"]
    return Source(receipt=receipt, outputs={k: Digest.parse(v) for k, v in outputs.items()})


def check_file(store: Store, path: Path, *, sets: tuple[str, ...] = (),
               only: tuple[str, ...] = (), start: str | None = None,
               name: str | None = None) -> list[str]:
    """Check a run file as ``run_file`` does before it runs anything (writing nothing); the
    names of the steps it would run, in run order."""
    return plan_file(store, path, sets=sets, only=only, start=start, name=name).names


def plan_file(store: Store, path: Path, *, sets: tuple[str, ...] = (),
              only: tuple[str, ...] = (), start: str | None = None, name: str | None = None,
              upstream: Mapping[str, Digest] | None = None) -> RunPlan:
    """The checked plan of a run (the whole file checked; nothing written)."""
    spec = load_plan_file(path, sets)
    chosen = select_steps(spec, only, start)
    variant = variant_of(path, sets, name)
    planned = plan(store, spec, str(path), load_recipe, variant.name if variant else None)
    return _with_sources(store, spec, path, variant,
                         [item for item in planned if item.step.name in chosen], upstream or {})


def plan_one_step(store: Store, path: Path, step: str, *, sets: tuple[str, ...] = (),
                  name: str | None = None,
                  upstream: Mapping[str, Digest] | None = None) -> RunPlan:
    """The plan of one step of a file that ``plan_file`` checked whole already (a scheduled
    job's): only that step's recipe is loaded and only its inputs and refs are resolved."""
    spec = load_plan_file(path, sets)
    variant = variant_of(path, sets, name)
    item = plan_step(store, spec, step, str(path), load_recipe,
                     variant.name if variant else None)
    return _with_sources(store, spec, path, variant, [item], upstream or {})


def _with_sources(store: Store, spec: RunFile, path: Path, variant: Variant | None,
                  steps: list[Planned],
                  upstream: Mapping[str, Digest]) -> RunPlan:
    """The plan of these steps, with the results of the steps they read but do not run."""
    where = str(path)
    runs = PreviousRuns(store, spec, variant)
    chosen = {item.step.name for item in steps}
    sources: dict[str, Source] = {}
    for earlier in _read_from_earlier(spec, chosen):
        found = upstream.get(earlier) or runs.latest(earlier)
        if found is None:
            within = f" of variant {runs.variant!r}" if runs.variant is not None else ""
            raise ConfigError(where, f"step {earlier!r} is not run here and has no earlier "
                                     f"succeeded run in pipeline {spec.name!r}{within} to take "
                                     "its outputs from (run it too)")
        sources[earlier] = source_of(store, found)
    for item in steps:
        for value in item.step.inputs.values():
            ref = step_reference(value)
            if (ref is not None and ref[0] in sources and ref[1] != "receipt"
                    and ref[1] not in sources[ref[0]].outputs):
                raise ConfigError(where, f"{item.label}the earlier run of step {ref[0]!r} "
                                         f"({sources[ref[0]].receipt}) has no output {ref[1]!r}")
    return RunPlan(spec=spec, where=where, runs=runs, steps=tuple(steps), sources=sources)


def load_plan_file(path: Path, sets: tuple[str, ...] = ()) -> RunFile:
    """The run file with its ``--set`` overrides applied (each checked to name a step), and
    its sweeps (``[sweep]``, and arrays set on params that take none) expanded into arms."""
    spec, plain, sweeps = _split_sets(path, sets)
    return expand(apply_overrides(spec, plain) if plain else spec, sweeps)


def variant_of(path: Path, sets: tuple[str, ...], name: str | None) -> Variant | None:
    """The variant a run with these ``--set`` texts and ``--name`` is: the sets that sweep
    give arms of their own instead."""
    spec, plain, _ = _split_sets(path, sets)
    return plan_variant(spec, tuple(item.text for item in plain), name)


def _split_sets(path: Path, sets: tuple[str, ...]) -> tuple[RunFile, tuple[Override, ...],
                                                            dict[tuple[str, ...], Any]]:
    spec = load_run_file(path)
    by_name = {s.name: s for s in spec.steps}

    def takes_array(step: str, key: tuple[str, ...]) -> bool:
        return param_takes_array(load_recipe(by_name[step].recipe).params, key)

    plain, sweeps = split_sweeps(spec, tuple(parse_override(text) for text in sets),
                                 takes_array)
    return spec, plain, sweeps


def select_steps(spec: RunFile, only: tuple[str, ...], start: str | None) -> set[str]:
    """The names of the steps to run: every step, or ``only`` those, or ``start`` and what
    depends on it; an unknown name is an error naming it."""
    names = [s.name for s in spec.steps]
    if only and start is not None:
        raise ConfigError("--only", "give --only or --from, not both")
    for name in (*only, *([start] if start is not None else [])):
        if name not in names:
            what = "--only" if name in only else "--from"
            raise ConfigError(what, f"no step {name!r} in {spec.path}{did_you_mean(name, names)} "
                                    f"(steps: {', '.join(names)})")
    if only:
        return set(only)
    if start is not None:
        return {start, *downstream(spec.steps, start)}
    return set(names)


def _read_from_earlier(spec: RunFile, chosen: set[str]) -> list[str]:
    """Steps not run whose outputs or receipts a chosen step reads, in file order."""
    needed = {d for s in spec.steps if s.name in chosen for d in s.upstream - chosen}
    return [s.name for s in spec.steps if s.name in needed]
