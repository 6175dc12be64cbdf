"""Planning a run: every step checked against its recipe, the file's other steps and the store
before anything runs (recipes, params, inputs, output refs, tags), so bad input writes nothing
(docs/format.md §6)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from nscas.errors import ConfigError, NscasError, RecordError
from nscas.objects import canonical
from nscas.objects.digests import Digest
from nscas.runs.actions import action_id, code_id, find_receipt
from nscas.runs.config import RunFile, StepConfig, params_to_json, parse_params, step_reference
from nscas.runs.recipe import Recipe
from nscas.runs.variants import step_refs, variant_prefix
from nscas.store.locating import is_tag
from nscas.store.writer import Store, check_ref_name


@dataclass(frozen=True, slots=True, kw_only=True)
class Source:
    """A step's results as later steps read them: from this run, or an earlier one."""

    receipt: Digest
    outputs: Mapping[str, Digest]


@dataclass(frozen=True, slots=True, kw_only=True)
class Planned:
    """A step checked before anything runs: its recipe, parsed params, direct inputs, and the
    refs it moves (output name or ``receipt``, ref) with their values at start."""

    step: StepConfig
    recipe: Recipe
    params: Any
    inputs: Mapping[str, Digest]
    refs: tuple[tuple[str, str], ...]
    expected_refs: Mapping[str, Digest | None]
    label: str


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


def _step_label(spec: RunFile, step: StepConfig) -> str:
    """How messages about a step begin: ``step '<name>': `` in a pipeline, nothing in a recipe
    file."""
    return f"step {step.name!r}: " if spec.pipeline else ""


def plan(store: Store, spec: RunFile, where: str, load: Callable[[str], Recipe],
         variant: str | None) -> list[Planned]:
    """The steps of ``spec`` checked, in file order; ``load`` gives the recipe of a name,
    ``variant`` is the run's variant name (None for the run without one)."""
    steps = spec.steps
    labels = {s.name: _step_label(spec, s) for s in steps}
    if spec.refs is not None:
        try:
            check_ref_name(spec.refs)
        except NscasError as exc:
            raise ConfigError(where, f"refs: {exc.message}") from None
        if is_tag(spec.refs):
            raise ConfigError(where, f"refs: {spec.refs!r} is under tags/, and tags never move; "
                                     "a pipeline's refs move with every run")
    recipes = {s.name: _load_recipe_for(load, s, where, labels[s.name]) for s in steps}
    for s in steps:  # outputs named in the file, checked before the prefix refs are built
        for name in s.outputs:
            if name not in recipes[s.name].outputs:
                raise ConfigError(where, f"{labels[s.name]}outputs.{name}: recipe "
                                         f"{recipes[s.name].name!r} has no output {name!r} "
                                         f"(outputs: {', '.join(recipes[s.name].outputs)})")
    refs = {s.name: _output_refs(spec, s, recipes[s.name], labels[s.name], variant)
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
    return [_planned(store, s, recipes[s.name], params[s.name], refs[s.name], where,
                     labels[s.name]) for s in steps]


def plan_step(store: Store, spec: RunFile, name: str, where: str, load: Callable[[str], Recipe],
              variant: str | None) -> Planned:
    """Step ``name`` of ``spec`` planned alone, for a file ``plan`` checked whole already:
    only its own recipe is loaded, only its params parsed and its inputs and refs resolved."""
    step = next(s for s in spec.steps if s.name == name)
    label = _step_label(spec, step)
    recipe = _load_recipe_for(load, step, where, label)
    return _planned(store, step, recipe, parse_step_params(recipe, step, where, label),
                    _output_refs(spec, step, recipe, label, variant), where, label)


def _planned(store: Store, step: StepConfig, recipe: Recipe, params: Any,
             refs: tuple[tuple[str, str], ...], where: str, label: str) -> Planned:
    inputs = _direct_inputs(store, step, recipe, where, label)
    item = Planned(step=step, recipe=recipe, params=params, label=label, inputs=inputs,
                   refs=refs, expected_refs={ref: store.ref_get(ref) for _, ref in refs})
    if len(inputs) == len(step.inputs) and set_tags(item.expected_refs):
        # Every input known now: the action's ID, and so its cached receipt, without a write.
        action = action_id(item.recipe, code_id(item.recipe), inputs, item.params)
        check_tags(store, item.refs, item.expected_refs, find_receipt(store, action), where,
                   item.label)
    return item


def _load_recipe_for(load: Callable[[str], Recipe], step: StepConfig, where: str,
                     label: str) -> Recipe:
    try:
        return load(step.recipe)
    except ConfigError as exc:
        raise ConfigError(where, f"{label}{exc.message}") from None


def set_tags(expected: Mapping[str, Digest | None]) -> bool:
    """Whether a ref a step moves is a tag that is already set (values at start)."""
    return any(is_tag(ref) and value is not None for ref, value in expected.items())


def check_tags(store: Store, refs: tuple[tuple[str, str], ...],
                expected: Mapping[str, Digest | None], previous: Digest | None, where: str,
                label: str) -> None:
    """Before a step runs: refuse it if an output ref is a tag already set to something other
    than what the step's cached receipt gave (``previous``). Tags never move; a run that could
    only end by trying to move one would write its outputs and receipt for nothing."""
    if not set_tags(expected):
        return
    before = store.get_record(previous)["outputs"] if previous is not None else {}
    for output, ref in refs:
        current = expected.get(ref)
        if is_tag(ref) and current is not None and before.get(output) != str(current):
            raise ConfigError(where, f"{label}outputs.{output}: tag {ref!r} is already set to "
                                     f"{current}, and no earlier run of this step gave that "
                                     "output; tags never move (name another ref)")


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
    return parse_step_params(recipe, step, where, label)


def parse_step_params(recipe: Recipe, step: StepConfig, where: str, label: str) -> Any:
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


def step_inputs(store: Store, item: Planned, done: Mapping[str, Source],
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
