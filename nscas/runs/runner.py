"""recipe.toml -> action -> cache or execute -> receipt (docs/format.md §6)."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nscas.errors import ConfigError, NscasError, RecipeError, RecordError, RefConflict
from nscas.objects import canonical
from nscas.objects.digests import Digest, sha256_hex
from nscas.redacting import redact
from nscas.runs.changes import CacheMiss, difference, since
from nscas.runs.codetree import code_tree, recipe_files
from nscas.runs.config import (
    Override,
    RunFile,
    StepConfig,
    apply_overrides,
    downstream,
    load_run_file,
    param_takes_array,
    params_to_json,
    parse_override,
    parse_params,
    step_reference,
)
from nscas.runs.environment import environment
from nscas.runs.recipe import NullProgress, Progress, Recipe, RecipeResult, RunContext
from nscas.runs.registry import available_recipes, registered_recipe, unknown_recipe
from nscas.runs.sweeps import expand, split_sweeps
from nscas.runs.variants import Variant, plan_variant, step_refs, variant_prefix
from nscas.runs.verdicts import Verdict, compare_outputs
from nscas.store.claims import claim_action
from nscas.store.locating import is_tag
from nscas.store.protocol import tree_record
from nscas.store.reading import ObjectInfo
from nscas.store.writer import Store, check_ref_name
from nscas.suggestions import did_you_mean

if TYPE_CHECKING:
    from nscas.signing.signatures import ReceiptSigner

@dataclass(frozen=True, slots=True, kw_only=True)
class StepResult:
    """One step of a run: its receipt and action, whether the cache answered, its outputs and
    claimed values; ``verdicts`` compare a rerun's outputs with the earlier run's."""

    step: str
    recipe: str
    receipt: Digest
    action: Digest
    cached: bool
    status: str
    outputs: Mapping[str, Digest]
    claims: Mapping[str, Any]
    verdicts: Mapping[str, Verdict] = field(default_factory=dict)
    miss: CacheMiss | None = None
    """How the action differs from the step's previous run: why a step that was not asked to
    rerun ran, or, for a rerun compared with a run of another action, what changed."""
    error: str | None = None


ProgressFactory = Callable[[str], Progress]


class StepFailed(RecipeError):
    """A step ran and failed; its receipt (status ``failed``, with the error) is stored."""

    exit_code = 1

    def __init__(self, *, step: str, recipe: str, receipt: Digest, error: str) -> None:
        who = f"recipe {recipe!r}" if step == recipe else f"step {step!r} ({recipe})"
        super().__init__(f"{who} failed: {error} (receipt {receipt})")
        self.step = step
        self.recipe = recipe
        self.receipt = receipt
        self.error = error


class OutputRefConflict(RefConflict):
    """An output ref moved while the step ran; the step's outputs and receipt are kept."""

    exit_code = 1

    def __init__(self, conflict: RefConflict, *, step: str, receipt: Digest) -> None:
        super().__init__(conflict.name, conflict.expected, conflict.actual)
        self.message = (f"output ref {conflict.name!r} of step {step!r} moved while the step ran: "
                        f"{self.message} (the outputs are stored; receipt {receipt})")
        self.args = (self.message,)
        self.step = step
        self.receipt = receipt


@dataclass(frozen=True, slots=True, kw_only=True)
class RunNames:
    """What a receipt records of where its run came from (docs/format.md §3.9): the pipeline's
    name, the step's and the variant's (§6.10); None where not recorded. Not part of the
    action."""

    pipeline: str | None = None
    step: str | None = None
    variant: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class _Source:
    """A step's results as later steps read them: from this run, or an earlier one."""

    receipt: Digest
    outputs: Mapping[str, Digest]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Planned:
    """A step checked before anything runs: its recipe, parsed params, direct inputs, the refs
    it moves (output name or ``receipt``, ref) and their values at start, and the pipeline and
    step names its receipt records."""

    step: StepConfig
    recipe: Recipe
    params: Any
    inputs: Mapping[str, Digest]
    refs: tuple[tuple[str, str], ...]
    expected_refs: Mapping[str, Digest | None]
    label: str
    names: RunNames


def load_recipe(name: str) -> Recipe:
    """Import one registered recipe (lazily: only the one that runs)."""
    recipe = registered_recipe(name)
    if recipe is None:
        raise ConfigError("recipe", unknown_recipe(name))
    return recipe


def run_file(store: Store, path: Path, *, rerun: bool = False,
             progress: ProgressFactory | None = None,
             on_step: Callable[[StepResult], None] | None = None,
             sets: tuple[str, ...] = (), only: tuple[str, ...] = (),
             start: str | None = None, signer: ReceiptSigner | None = None,
             name: str | None = None,
             upstream: Mapping[str, Digest] | None = None) -> list[StepResult]:
    """Run a recipe or pipeline file; step results in run order.

    ``sets`` are ``STEP.PARAM=VALUE`` overrides, written into the params as if the file said
    them; with them (or a ``name``) the run is a variant (nscas.runs.variants), with refs and
    previous runs of its own. ``only`` runs just those steps and ``start`` that step and
    every step downstream of it, the other steps' outputs taken from their previous runs (by
    pipeline, variant and step name).
    Everything that can be checked without running (the file, the overrides, recipes, params,
    inputs given by ID or ref, output ref names, the previous runs a partial run reads) is
    checked first, so bad input writes nothing. Refs are resolved once, at start; output refs
    move by compare-and-swap against their values then. A failed step raises ``StepFailed``
    after ``on_step`` has seen its result. With a ``signer``, each receipt a step writes
    (succeeded or failed; a cached one is not signed again) is signed as the step ends.
    ``upstream`` names receipts to take the outputs of steps not run here from, before their
    previous runs (how a scheduler hands one job what other jobs of its run gave).
    """
    _, chosen, runs, plan, sources = _prepare(store, path, sets, only, start, name,
                                              upstream or {})
    where = str(path)
    results: dict[str, StepResult] = {}
    for item in plan:
        if item.step.name not in chosen:
            continue
        inputs = {**item.inputs, **_step_inputs(store, item, sources, where)}
        result = run_step(store, item.recipe, item.step, inputs, where=where, rerun=rerun,
                          params=item.params,
                          progress=progress(item.step.name) if progress else NullProgress(),
                          expected_refs=item.expected_refs, refs=item.refs, names=item.names,
                          previous_run=runs.latest(item.step.name) if rerun else None,
                          last_run=partial(runs.latest, item.step.name, original=True))
        if signer is not None and not result.cached:
            signer.sign(store, result.receipt)
        results[item.step.name] = result
        sources[item.step.name] = _Source(receipt=result.receipt, outputs=result.outputs)
        if on_step is not None:
            on_step(result)
        if result.status != "succeeded":
            raise StepFailed(step=result.step, recipe=result.recipe, receipt=result.receipt,
                             error=result.error or "unknown error")
    return list(results.values())


def check_file(store: Store, path: Path, *, sets: tuple[str, ...] = (),
               only: tuple[str, ...] = (), start: str | None = None,
               name: str | None = None) -> list[str]:
    """Check a run file as ``run_file`` does before it runs anything (writing nothing); the
    names of the steps it would run, in run order."""
    _, chosen, _, plan, _ = _prepare(store, path, sets, only, start, name, {})
    return [item.step.name for item in plan if item.step.name in chosen]


def _prepare(store: Store, path: Path, sets: tuple[str, ...], only: tuple[str, ...],
             start: str | None, name: str | None, upstream: Mapping[str, Digest],
             ) -> tuple[RunFile, set[str], _StepRuns, list[_Planned], dict[str, _Source]]:
    """The checked plan of a run, and the results of the steps it reads but does not run."""
    spec = load_plan_file(path, sets)
    where = str(path)
    chosen = select_steps(spec, only, start)
    variant = variant_of(path, sets, name)
    runs = _StepRuns(store, spec, variant)
    plan = _plan(store, spec, where, runs)
    sources: dict[str, _Source] = {}
    for earlier in _read_from_earlier(spec, chosen):
        found = upstream.get(earlier) or runs.latest(earlier)
        if found is None:
            within = f" of variant {variant.name!r}" if variant is not None else ""
            raise ConfigError(where, f"step {earlier!r} is not run here and has no earlier "
                                     f"succeeded run in pipeline {spec.name!r}{within} to take "
                                     "its outputs from (run it too)")
        record = store.get_record(found)
        sources[earlier] = _Source(receipt=found, outputs={
            k: Digest.parse(v) for k, v in record["outputs"].items()})
    for item in plan:
        if item.step.name not in chosen:
            continue
        for value in item.step.inputs.values():
            ref = step_reference(value)
            if (ref is not None and ref[0] in sources and ref[1] != "receipt"
                    and ref[1] not in sources[ref[0]].outputs):
                raise ConfigError(where, f"{item.label}the earlier run of step {ref[0]!r} "
                                         f"({sources[ref[0]].receipt}) has no output {ref[1]!r}")
    return spec, chosen, runs, plan, sources


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
    needed = {ref[0] for s in spec.steps if s.name in chosen for v in s.inputs.values()
              if (ref := step_reference(v)) is not None and ref[0] not in chosen}
    return [s.name for s in spec.steps if s.name in needed]


class _StepRuns:
    """The succeeded receipts that record a pipeline and step name (docs/format.md §3.9),
    read once, on first use. A step's previous run is the receipt its
    ``<refs>[/variants/<variant>]/<step>/receipt`` ref names, where the pipeline declares refs
    and that receipt records this pipeline and step, else the newest (by ``finished``, then ID)
    that records them and the run's variant (none, for the run without one). A step that the
    variant does not change falls back to the previous run without the variant (the same
    action, unless the code changed since)."""

    def __init__(self, store: Store, spec: RunFile, variant: Variant | None = None) -> None:
        self._store = store
        self._spec = spec
        self._variant = variant
        self._latest: dict[tuple[str | None, str, str | None], tuple[str, Digest]] | None = None

    @property
    def variant(self) -> str | None:
        """The name of the run's variant; None for the run without one."""
        return self._variant.name if self._variant is not None else None

    def names(self, step: StepConfig) -> RunNames:
        pipeline, record_step = self._spec.receipt_names()
        return RunNames(pipeline=pipeline, step=step.name if record_step else None,
                        variant=self.variant)

    def latest(self, step: str, *, original: bool = False) -> Digest | None:
        """The step's previous run in this run's variant; ``original``: or, where it has none
        there, the previous run without the variant (what a first run of a variant is shown
        against)."""
        variant = self._variant
        found = self._latest_in(step, self.variant)
        if found is None and variant is not None and (original or step not in variant.changed):
            found = self._latest_in(step, None)
        return found

    def _latest_in(self, step: str, variant: str | None) -> Digest | None:
        pipeline, record_step = self._spec.receipt_names()
        if not record_step:
            return None
        if self._spec.refs is not None:
            held = self._store.ref_get(f"{variant_prefix(self._spec.refs, variant)}/{step}/receipt")
            if held is not None and self._store.info(held).kind == "receipt/1":
                rec = self._store.get_record(held)
                if (rec.get("status") == "succeeded" and rec.get("pipeline") == pipeline
                        and rec.get("step") == step):
                    return held
        if self._latest is None:
            self._latest = {}
            for info in self._store.log(kind="receipt/1", limit=1 << 62):
                rec = self._store.get_record(info.id)
                if rec.get("status") != "succeeded" or not isinstance(rec.get("step"), str):
                    continue
                key = (rec.get("pipeline"), rec["step"], rec.get("variant"))
                mark = (rec["finished"], info.id)
                if key not in self._latest or mark > self._latest[key]:
                    self._latest[key] = mark
        found = self._latest.get((pipeline, step, variant))
        return found[1] if found else None


def _output_refs(spec: RunFile, step: StepConfig, recipe: Recipe, label: str,
                 variant: str | None) -> tuple[tuple[str, str], ...]:
    """The refs a step moves: the ones it declares, then those of the pipeline's ``refs``
    prefix: ``<refs>/<step>/<output>`` for each output, ``<refs>/<step>/receipt``. A variant
    moves ``<ref>/variants/<name>`` for each declared ref and
    ``<refs>/variants/<name>/<step>/...`` instead (§6.10), never the refs of the run without it."""
    refs = [(output, variant_prefix(ref, variant)) for output, ref in step.outputs.items()]
    for output, ref in refs:
        try:
            check_ref_name(ref)
        except NscasError as exc:
            raise ConfigError(str(spec.path), f"{label}outputs.{output}: {exc.message}") from None
    if spec.refs is not None:
        for output, ref in step_refs(spec.refs, variant, step.name, recipe.outputs):
            try:
                check_ref_name(ref)
            except NscasError as exc:
                raise ConfigError(str(spec.path), f"{label}refs: {exc.message}") from None
            if (output, ref) not in refs:
                refs.append((output, ref))
    return tuple(refs)


def _plan(store: Store, spec: RunFile, where: str, runs: _StepRuns) -> list[_Planned]:
    steps = spec.steps
    labels = {s.name: f"step {s.name!r}: " if spec.pipeline else "" for s in steps}
    if spec.refs is not None:
        try:
            check_ref_name(spec.refs)
        except NscasError as exc:
            raise ConfigError(where, f"refs: {exc.message}") from None
        if is_tag(spec.refs):
            raise ConfigError(where, f"refs: {spec.refs!r} is under tags/, and tags never move; "
                                     "a pipeline's refs move with every run")
    recipes = {s.name: _load_recipe_for(s, where, labels[s.name]) for s in steps}
    for s in steps:  # outputs named in the file, checked before the prefix refs are built
        for name in s.outputs:
            if name not in recipes[s.name].outputs:
                raise ConfigError(where, f"{labels[s.name]}outputs.{name}: recipe "
                                         f"{recipes[s.name].name!r} has no output {name!r} "
                                         f"(outputs: {', '.join(recipes[s.name].outputs)})")
    refs = {s.name: _output_refs(spec, s, recipes[s.name], labels[s.name], runs.variant)
            for s in steps}
    owners: dict[str, tuple[str, str, str]] = {}
    for s in steps:
        for output, ref in refs[s.name]:
            here = f"{labels[s.name]}outputs.{output}"
            if ref in owners and owners[ref][:2] != (s.name, output):
                raise ConfigError(where, f"{here}: ref {ref!r} is already the target of "
                                         f"{owners[ref][2]}; one ref, one output")
            owners.setdefault(ref, (s.name, output, here))
    params = {s.name: _check_step(s, recipes[s.name], recipes, where, labels[s.name])
              for s in steps}
    plan = []
    for s in steps:
        inputs = _direct_inputs(store, s, recipes[s.name], where, labels[s.name])
        names = runs.names(s)
        item = _Planned(step=s, recipe=recipes[s.name], params=params[s.name],
                        label=labels[s.name], inputs=inputs, refs=refs[s.name], names=names,
                        expected_refs={ref: store.ref_get(ref) for _, ref in refs[s.name]})
        if len(inputs) == len(s.inputs) and _set_tags(item.expected_refs):
            # Every input known now: the action's ID, and so its cached receipt, without a write.
            action = _action_id(item.recipe, _code_id(item.recipe), inputs, item.params)
            _check_tags(store, item.refs, item.expected_refs, find_receipt(store, action), where,
                        item.label)
        plan.append(item)
    return plan


def _set_tags(expected: Mapping[str, Digest | None]) -> bool:
    """Whether a ref a step moves is a tag that is already set (values at start)."""
    return any(is_tag(ref) and value is not None for ref, value in expected.items())


def _check_tags(store: Store, refs: tuple[tuple[str, str], ...],
                expected: Mapping[str, Digest | None], previous: Digest | None, where: str,
                label: str) -> None:
    """Before a step runs: refuse it if an output ref is a tag already set to something other
    than what the step's cached receipt gave (``previous``). Tags never move; a run that could
    only end by trying to move one would write its outputs and receipt for nothing."""
    if not _set_tags(expected):
        return
    before = store.get_record(previous)["outputs"] if previous is not None else {}
    for output, ref in refs:
        current = expected.get(ref)
        if is_tag(ref) and current is not None and before.get(output) != str(current):
            raise ConfigError(where, f"{label}outputs.{output}: tag {ref!r} is already set to "
                                     f"{current}, and no earlier run of this step gave that "
                                     "output; tags never move (name another ref)")


def _code_id(recipe: Recipe) -> Digest:
    """The ID ``code_tree`` gives the recipe's code, computed without storing anything."""
    files = {name: path.read_bytes() for name, path in recipe_files(recipe).items()}
    hashed = _Hashed({Digest.of(data): data for data in files.values()})
    tree = tree_record(hashed, {name: Digest.of(data) for name, data in files.items()})
    return Digest.of(canonical.encode(tree))


class _Hashed:
    """Bytes not (yet) stored, answering what ``tree_record`` asks of a store about them."""

    def __init__(self, blobs: Mapping[Digest, bytes]) -> None:
        self._blobs = blobs

    def info(self, oid: Digest) -> ObjectInfo:
        data = self._blobs[oid]
        return ObjectInfo(id=oid, size=len(data), sha256=sha256_hex(data), kind=None,
                          storage="inline", codec="raw", stored_size=len(data), created=0.0)

    def sha256(self, oid: Digest) -> str:
        return sha256_hex(self._blobs[oid])


def _action(recipe: Recipe, code: Digest, inputs: Mapping[str, Digest], params: Any) -> dict[str, Any]:
    """The action/1 record of a step: the one place it is built."""
    return {"nscas": "action/1", "recipe": f"{recipe.name}@{recipe.version}", "code": str(code),
            "inputs": {k: str(v) for k, v in sorted(inputs.items())},
            "params": params_to_json(params)}


def _action_id(recipe: Recipe, code: Digest, inputs: Mapping[str, Digest], params: Any) -> Digest:
    return Digest.of(canonical.encode(_action(recipe, code, inputs, params)))


def _load_recipe_for(step: StepConfig, where: str, label: str) -> Recipe:
    try:
        return load_recipe(step.recipe)
    except ConfigError as exc:
        raise ConfigError(where, f"{label}{exc.message}") from None


def _check_step(step: StepConfig, recipe: Recipe, recipes: Mapping[str, Recipe], where: str,
                label: str) -> Any:
    """Check a step against its recipe and the file's other steps; its parsed params."""
    known = set(recipe.inputs)
    for name in step.inputs:
        if name not in known and not recipe.extra_inputs:
            raise ConfigError(where, f"{label}inputs.{name}: recipe {recipe.name!r} has no input "
                                     f"{name!r} (inputs: {', '.join(sorted(known)) or 'none'})")
    for name, spec in recipe.inputs.items():
        if spec.required and name not in step.inputs:
            raise ConfigError(where, f"{label}inputs.{name} is missing: recipe {recipe.name!r} "
                                     f"requires it ({spec.doc or spec.kind})")
    for name, value in step.inputs.items():
        ref = step_reference(value)
        if ref is not None and ref[0] not in recipes:  # a recipe file has no other steps
            raise ConfigError(where, f"{label}inputs.{name} names step {ref[0]!r}, but the file "
                                     "has no such step")
        if ref is not None and ref[1] != "receipt" and ref[1] not in recipes[ref[0]].outputs:
            outputs = ", ".join((*recipes[ref[0]].outputs, "receipt"))
            raise ConfigError(where, f"{label}inputs.{name}: step {ref[0]!r} has no output "
                                     f"{ref[1]!r} (outputs: {outputs})")
    for name, ref_name in step.outputs.items():
        if name not in recipe.outputs:
            raise ConfigError(where, f"{label}outputs.{name}: recipe {recipe.name!r} has no output "
                                     f"{name!r} (outputs: {', '.join(recipe.outputs)})")
        try:
            check_ref_name(ref_name)
        except NscasError as exc:
            raise ConfigError(where, f"{label}outputs.{name}: {exc.message}") from None
    return _parse_step_params(recipe, step, where, label)


def _parse_step_params(recipe: Recipe, step: StepConfig, where: str, label: str) -> Any:
    """The step's params table as the recipe's params dataclass: the only place it is parsed."""
    try:
        params = parse_params(recipe.params, step.params, where, "params")
        _check_json_values(params_to_json(params), where, "params")
        return params
    except ConfigError as exc:
        if not label:
            raise
        raise ConfigError(where, label + exc.message.removeprefix(f"{where}: ")) from None


def _check_json_values(value: Any, where: str, path: str) -> None:
    """Refuse, naming the key, a param the action record cannot hold as it is: an integer
    beyond +-(2^53 - 1) (records are RFC 8785 JSON, whose numbers are doubles) or a NaN or
    infinity. Checked while planning, so that nothing (not even the code tree) is written."""
    stack = [(value, path)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, dict):
            stack.extend((v, f"{at}.{k}") for k, v in item.items())
        elif isinstance(item, list | tuple):
            stack.extend((v, f"{at}[{i}]") for i, v in enumerate(item))
        else:
            try:
                canonical.encode({"value": item})
            except RecordError:
                if isinstance(item, float):
                    why = "a record holds finite numbers only"
                elif isinstance(item, int):
                    why = "a record holds integers of at most 2^53 - 1 in size exactly"
                else:
                    why = "not a JSON value"
                raise ConfigError(where, f"{at} is {item!r}: {why}") from None
    try:
        canonical.encode({"params": value})
    except RecordError as exc:
        raise ConfigError(where, f"{path}: {exc.message}") from None


def _direct_inputs(store: Store, step: StepConfig, recipe: Recipe, where: str,
                   label: str) -> dict[str, Digest]:
    """Inputs given by ID, prefix or ref name, resolved once, at start, with their kinds checked."""
    out: dict[str, Digest] = {}
    for name, value in step.inputs.items():
        if step_reference(value) is not None:
            continue
        try:
            out[name] = store.resolve(value)
        except NscasError as exc:
            raise ConfigError(where, f"{label}inputs.{name}: {exc.message}") from None
        _check_kind(store, recipe, name, out[name], where, label)
    return out


def _step_inputs(store: Store, item: _Planned, done: Mapping[str, _Source],
                 where: str) -> dict[str, Digest]:
    """Inputs named ``step.<name>.<output>``: known only once that step has run."""
    out: dict[str, Digest] = {}
    for name, value in item.step.inputs.items():
        ref = step_reference(value)
        if ref is None:
            continue
        src, output = ref
        out[name] = done[src].receipt if output == "receipt" else done[src].outputs[output]
        _check_kind(store, item.recipe, name, out[name], where, item.label)
    return out


def _check_kind(store: Store, recipe: Recipe, name: str, oid: Digest, where: str,
                label: str) -> None:
    spec = recipe.inputs.get(name)
    want = spec.kind if spec is not None else recipe.extra_kind
    if want is not None:
        got = store.info(oid).kind or "blob"
        if got != want:
            raise ConfigError(where, f"{label}inputs.{name} must be a {want}, but {oid} is a {got}")


def run_step(store: Store, recipe: Recipe, step: StepConfig, inputs: Mapping[str, Digest], *,
             where: str, rerun: bool = False, params: Any = None,
             progress: Progress | None = None,
             expected_refs: Mapping[str, Digest | None] | None = None,
             refs: tuple[tuple[str, str], ...] | None = None,
             names: RunNames | None = None,
             previous_run: Digest | None = None,
             last_run: Callable[[], Digest | None] | None = None) -> StepResult:
    """Run one checked step: reuse the receipt of its action, or execute it (``rerun``: always).

    ``params`` is the step's parsed params (as ``run_file`` checked them); when not given,
    ``step.params`` is parsed here. ``refs`` are the (output or ``receipt``, ref) pairs to move
    (default: the step's declared outputs); ``names`` what the receipt records of the run's
    pipeline, step and variant. A rerun compares its outputs with ``previous_run`` (the
    step's previous run by those names), else with the cached receipt of its action. A step
    that misses the cache says how its action differs from the run ``last_run`` gives (asked
    only then: finding it may read every receipt), else from the one ``explain_miss`` finds.
    """
    if params is None:
        params = _parse_step_params(recipe, step, where, "")
    if refs is None:
        refs = tuple(step.outputs.items())
    if expected_refs is None:
        expected_refs = {ref: store.ref_get(ref) for _, ref in refs}
    if _set_tags(expected_refs):  # before any write: the action's ID, computed
        action = _action_id(recipe, _code_id(recipe), inputs, params)
        _check_tags(store, refs, expected_refs, find_receipt(store, action), where, "")
    code = code_tree(store, recipe)
    action = store.put_record(_action(recipe, code, inputs, params))
    with claim_action(store, action):  # two runs of one action at once: the later one waits
        return _run_claimed(store, recipe, step, inputs, action, where=where, rerun=rerun,
                            params=params, progress=progress, expected_refs=expected_refs,
                            refs=refs, names=names, previous_run=previous_run,
                            last_run=last_run)


def _run_claimed(store: Store, recipe: Recipe, step: StepConfig, inputs: Mapping[str, Digest],
                 action: Digest, *, where: str, rerun: bool, params: Any,
                 progress: Progress | None, expected_refs: Mapping[str, Digest | None],
                 refs: tuple[tuple[str, str], ...], names: RunNames | None,
                 previous_run: Digest | None,
                 last_run: Callable[[], Digest | None] | None) -> StepResult:
    """``run_step`` once this process holds the claim on ``action``: the cache is asked only
    now, so a run that waited for another run of the action reuses its receipt."""
    previous = find_receipt(store, action)
    if previous is not None and not rerun:
        rec = store.get_record(previous)
        outputs = {k: Digest.parse(v) for k, v in rec["outputs"].items()}
        _set_refs(store, step, refs, outputs, expected_refs, previous)
        return StepResult(step=step.name, recipe=recipe.name, receipt=previous, action=action,
                          cached=True, status="succeeded", outputs=outputs,
                          claims=_claim_values(rec["claims"]))
    compared = previous_run if rerun and previous_run is not None else previous
    if previous is None and not rerun:
        last = last_run() if last_run is not None else None
        miss: CacheMiss | None = (since(store, last, store.get_record(action)) if last is not None
                                  else explain_miss(store, action, refs, expected_refs))
    elif (compared is not None
          and store.get_record(compared)["action"] != str(action)):  # an upstream run changed
        miss = since(store, compared, store.get_record(action))
    else:
        miss = None
    receipt, result, error = _execute(store, recipe, step.name, params, inputs, action,
                                      progress or NullProgress(), rerun, names or RunNames())
    if result is None:
        return StepResult(step=step.name, recipe=recipe.name, receipt=receipt, action=action,
                          cached=False, status="failed", outputs={}, claims={}, miss=miss,
                          error=error)
    verdicts: dict[str, Verdict] = {}
    if rerun and compared is not None:
        before = {k: Digest.parse(v) for k, v in store.get_record(compared)["outputs"].items()}
        verdicts = compare_outputs(store, before, dict(result.outputs),
                                   measurements=recipe.measurements)
    _set_refs(store, step, refs, dict(result.outputs), expected_refs, receipt)
    return StepResult(step=step.name, recipe=recipe.name, receipt=receipt, action=action,
                      cached=False, status="succeeded", outputs=dict(result.outputs),
                      claims={k: c.value for k, c in result.claims.items()}, verdicts=verdicts,
                      miss=miss)


def _execute(store: Store, recipe: Recipe, step: str, params: Any, inputs: Mapping[str, Digest],
             action: Digest, progress: Progress, rerun: bool,
             names: RunNames) -> tuple[Digest, RecipeResult | None, str | None]:
    started = _now()
    area = store.work_area(action)
    ctx = RunContext(store=store, inputs=dict(inputs), params=params, workdir=area.scratch,
                     progress=progress, store_path=store.root, rerun=rerun, action=action,
                     work_area=area.persistent)
    result: RecipeResult | None = None
    error: str | None = None
    succeeded = False
    try:
        try:
            result = recipe.run(ctx)
            unknown = sorted(set(result.outputs) - set(recipe.outputs))
            if unknown:
                raise RecipeError(f"recipe {recipe.name!r} produced undeclared output(s): "
                                  f"{', '.join(unknown)}")
        except NscasError as exc:
            error = exc.message
        except BaseException as exc:  # recorded as a failed receipt, then raised
            message = _crash_message(exc)
            receipt = _receipt(store, action, started, None, message, names)
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            raise StepFailed(step=step, recipe=recipe.name, receipt=receipt, error=message) from exc
        finally:
            progress.finish()
        if error is not None:
            return _receipt(store, action, started, None, error, names), None, error
        receipt = _receipt(store, action, started, result, None, names)
        succeeded = True
        return receipt, result, None
    finally:
        # A failed or interrupted run keeps its work area for the next run of the action to
        # resume from; a process killed before this line leaves it to gc (docs/format.md §5.8).
        store.release_work_area(area, keep=not succeeded)


def _receipt(store: Store, action: Digest, started: str, result: RecipeResult | None,
             error: str | None, names: RunNames) -> Digest:
    record: dict[str, Any] = {
        "nscas": "receipt/1", "action": str(action), "environment": str(store.put_record(environment())),
        "outputs": {k: str(v) for k, v in (result.outputs if result else {}).items()},
        "journals": [str(j) for j in (result.journals if result else ())],
        "claims": {k: {"value": c.value, "verifier": c.verifier} for k, c in (result.claims if result else {}).items()},
        "started": started, "finished": _now(), "status": "succeeded" if result else "failed",
    }
    if error is not None:
        record["error"] = error
    if names.pipeline is not None:  # where the run came from; not part of the action
        record["pipeline"] = names.pipeline
    if names.step is not None:
        record["step"] = names.step
    if names.variant is not None:
        record["variant"] = names.variant
    return store.put_record(record)


def _set_refs(store: Store, step: StepConfig, refs: tuple[tuple[str, str], ...],
              outputs: Mapping[str, Digest], expected: Mapping[str, Digest | None],
              receipt: Digest) -> None:
    targets = {**outputs, "receipt": receipt}
    for output, ref in refs:
        if output in targets:
            try:
                store.ref_set(ref, targets[output], expect=expected[ref], message=f"run {receipt}")
            except RefConflict as exc:
                raise OutputRefConflict(exc, step=step.name, receipt=receipt) from None


def find_receipt(store: Store, action: Digest) -> Digest | None:
    """The earliest succeeded receipt of ``action``, if any (the cache)."""
    found = [(rec["started"], oid) for oid, rec in _receipts(store, action)]
    return min(found)[1] if found else None


def explain_miss(store: Store, action: Digest, refs: tuple[tuple[str, str], ...],
                 expected: Mapping[str, Digest | None]) -> CacheMiss:
    """Compare a new action with the one of the step's last succeeded run, for a step that
    has no previous run by name (§6.3).

    That run is the newest succeeded receipt of the same recipe that ran on the same inputs
    and params (so only the code or version differ), or else, among those that set one of the
    step's output ``refs`` to its value at start (``expected``), the newest.
    """
    new = store.get_record(action)
    last = _last_run(store, new, refs, expected)
    if last is None:
        return CacheMiss(previous=None)
    receipt, old = last
    return difference(store, receipt, old, new)


def _last_run(store: Store, new: Mapping[str, Any], refs: tuple[tuple[str, str], ...],
              expected: Mapping[str, Digest | None]) -> tuple[Digest, dict[str, Any]] | None:
    name = _recipe_name(new["recipe"])
    same: list[tuple[str, Digest, dict[str, Any]]] = []
    if new["inputs"]:
        first = min(new["inputs"])
        for link in store.links_to(Digest.parse(new["inputs"][first])):
            rec = store.get_record(link.parent)
            if (rec.get("nscas") == "action/1" and _recipe_name(rec["recipe"]) == name
                    and rec["inputs"] == new["inputs"] and rec["params"] == new["params"]):
                same += [(r["finished"], oid, rec) for oid, r in _receipts(store, link.parent)]
    if same:
        _, receipt, rec = max(same, key=lambda c: (c[0], c[1]))
        return receipt, rec
    setters: list[tuple[str, Digest, dict[str, Any]]] = []
    for output, ref in refs:
        target = expected.get(ref)
        if target is None:
            continue
        for link in store.links_to(target):
            rec = store.get_record(link.parent)
            if (rec.get("nscas") == "receipt/1" and rec.get("status") == "succeeded"
                    and rec["outputs"].get(output) == str(target)):
                act = store.get_record(Digest.parse(rec["action"]))
                if _recipe_name(act["recipe"]) == name:
                    setters.append((rec["finished"], link.parent, act))
    if setters:
        _, receipt, rec = max(setters, key=lambda c: (c[0], c[1]))
        return receipt, rec
    return None


def _receipts(store: Store, action: Digest) -> list[tuple[Digest, dict[str, Any]]]:
    """The succeeded receipts of ``action``."""
    out = []
    for link in store.links_to(action):
        rec = store.get_record(link.parent)
        if (link.path == "$.action" and rec.get("nscas") == "receipt/1"
                and rec.get("status") == "succeeded"):
            out.append((link.parent, rec))
    return out


def _recipe_name(recipe: str) -> str:
    return recipe.rpartition("@")[0]


def _crash_message(exc: BaseException) -> str:
    """``Type: message (at file:line)``: where a recipe crashed, for the failed receipt."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return redact(f"{type(exc).__name__}: {exc}{where}")  # a URL's password in it never lands


def _claim_values(claims: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v["value"] for k, v in claims.items()}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


__all__ = [
    "CacheMiss",
    "OutputRefConflict",
    "RunNames",
    "StepFailed",
    "StepResult",
    "available_recipes",
    "check_file",
    "code_tree",
    "explain_miss",
    "find_receipt",
    "load_plan_file",
    "load_recipe",
    "run_file",
    "run_step",
    "select_steps",
    "variant_of",
]
